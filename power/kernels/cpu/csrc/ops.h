// The ops of qmatmul.cpp and rowops.cpp that layer.cpp composes: called here directly, they are the same functions
// the trunks call one by one from Python, so a layer run as one call gives the same bits.
#pragma once

#include <ATen/core/Tensor.h>

at::Tensor matmul(int64_t kind, at::Tensor packed, int64_t in, at::Tensor x, at::Tensor tiles);
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
at::Tensor rope(at::Tensor x, at::Tensor cos, at::Tensor sin, bool neox);
void cache_write(at::Tensor rows, at::Tensor caches, at::Tensor slots, at::Tensor positions);
at::Tensor attention(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor positions, int64_t window, double scale);
