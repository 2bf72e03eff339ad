// The activations' 8-bit quantisation (qmatmul.cpp), shared by the products and the greedy head's pass: a row is
// quantised once, the same way, wherever it is multiplied.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace power_quant {

// x [n, in] float32 -> (q int8 [n, in], d float32 [n, in / block], bsum int16 [n, in / 16]: |sum| <= 16 * 127).
std::vector<at::Tensor> quantize_rows(at::Tensor x, int64_t block);

}  // namespace power_quant
