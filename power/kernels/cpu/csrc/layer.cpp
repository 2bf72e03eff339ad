// A Gemma 3 layer over a forward's rows as one call (power/kernels/cpu/layer.py): the same ops, in the same order, as
// power/runtime/trunks/gemma3.py's `gemma3_layer` over the trunk's caches runs them one by one from Python, so the
// same bits, without the Python and the dispatch around some thirty small operations a layer. The products, norms,
// rope and attention are ops.h's functions; gelu, the products' side-by-side outputs and the residual adds are the
// ATen ops the Python layer calls.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <c10/util/ParallelGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "ops.h"
#include "pool.h"

namespace {

// A product of one GGUF matrix (or neighbouring matrices of one type, stacked) in the tile layout: QuantMatrix's
// arguments to `matmul`, and its true output width (the tiles may pad it to a multiple of 16).
struct Product {
    int64_t kind, in, out;
    at::Tensor packed, tiles;
};

// The layer's four matrices, each one or more products whose outputs lie side by side (power/runtime/linear.py
// `Stacked`), as `products` [4 per product: matrix, kind, in, out] and `packed` [tiles, tile indices per product].
enum Matrix { kQKV, kOutput, kGateUp, kDown, kMatrices };

std::vector<std::vector<Product>> matrices_of(const std::vector<at::Tensor>& packed, const std::vector<int64_t>& products) {
    TORCH_CHECK(products.size() % 4 == 0 && packed.size() == products.size() / 2,
                "products: 4 ints each (matrix, kind, in, out), packed: its tiles and tile indices each");
    std::vector<std::vector<Product>> matrices(kMatrices);
    for (size_t i = 0; i < products.size() / 4; ++i) {
        const int64_t matrix = products[4 * i];
        TORCH_CHECK(matrix >= 0 && matrix < kMatrices, "products: matrix ", matrix, " is not one of the layer's four");
        matrices[matrix].push_back({products[4 * i + 1], products[4 * i + 2], products[4 * i + 3], packed[2 * i],
                                    packed[2 * i + 1]});
    }
    for (const auto& parts : matrices) TORCH_CHECK(!parts.empty(), "products: every matrix needs one");
    return matrices;
}

at::Tensor multiply(const std::vector<Product>& parts, const at::Tensor& x) {
    const at::Tensor rows = x.contiguous();
    std::vector<at::Tensor> outs;
    for (const Product& part : parts) {
        at::Tensor y = matmul(part.kind, part.packed, part.in, rows, part.tiles);
        outs.push_back(y.size(1) == part.out ? y : y.narrow(1, 0, part.out).contiguous());
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, -1);
}

// Each run of rows of one slot attends to that slot's caches (power/runtime/trunks/batch.py `RowBatch.attend`).
at::Tensor attend_runs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots,
                       const at::Tensor& positions, int64_t window, double scale) {
    const int64_t n = q.size(0);
    const int64_t* sp = slots.data_ptr<int64_t>();
    std::vector<at::Tensor> outs;
    for (int64_t first = 0; first < n;) {
        int64_t last = first + 1;
        while (last < n && sp[last] == sp[first]) ++last;
        outs.push_back(attention(q.narrow(0, first, last - first).contiguous(), k.select(0, sp[first]),
                                 v.select(0, sp[first]), positions.narrow(0, first, last - first), window, scale));
        first = last;
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

// gelu(gate) * up for gate_up [n, 2 d_ff] (gate first), its rows shared among Power's kernel threads, each chunk
// by torch's own ops on that thread alone: torch would share them among its OpenMP threads, whose passive wait
// leaves a prefill chunk waiting on a thread the scheduler has not run yet where other work holds the cores. A row
// is whole vectors (d_ff a multiple of 64), so it takes the same vector code, and the same bits, in any chunk.
at::Tensor gated_gelu(const at::Tensor& gate_up, int64_t d_ff) {
    const int64_t n = gate_up.size(0);
    at::Tensor out = at::empty({n, d_ff}, gate_up.options());
    power_pool::parallel_for(n, std::max<int64_t>(1, 8192 / d_ff), [&](int64_t begin, int64_t end) {
        const c10::ParallelGuard alone(true);
        const at::Tensor rows = gate_up.narrow(0, begin, end - begin);
        at::Tensor target = out.narrow(0, begin, end - begin);
        at::mul_out(target, at::gelu(rows.narrow(1, 0, d_ff), "tanh"), rows.narrow(1, d_ff, d_ff));
    });
    return out;
}

}  // namespace

// h [n, d]: the rows after one Gemma 3 layer. norms: attn, qk [H + Hkv, hd], post-attention, ffn, post-ffn; shape:
// H, Hkv, hd, hd_v, d_ff; cos/sin [n, hd / 2] the rows' rope; k/v caches [S, Hkv, T, stored width] (f32, f16, bf16
// or q8_0 bytes); slots/positions int64 [n]; window 0 for a global layer.
at::Tensor gemma3_layer(at::Tensor h, std::vector<at::Tensor> norms, std::vector<at::Tensor> packed,
                        std::vector<int64_t> products, std::vector<int64_t> shape, double eps, double scale,
                        int64_t window, at::Tensor cos, at::Tensor sin, at::Tensor k_caches, at::Tensor v_caches,
                        at::Tensor slots, at::Tensor positions) {
    TORCH_CHECK(norms.size() == 5 && shape.size() == 5, "norms: 5 weights, shape: H, Hkv, hd, hd_v, d_ff");
    TORCH_CHECK(h.dim() == 2 && slots.scalar_type() == at::kLong && positions.scalar_type() == at::kLong &&
                slots.is_contiguous() && positions.is_contiguous() && slots.size(0) == h.size(0) &&
                positions.size(0) == h.size(0), "h [n, d], slots and positions contiguous int64 [n]");
    const auto matrices = matrices_of(packed, products);
    const int64_t n = h.size(0), heads = shape[0], kv_heads = shape[1], hd = shape[2], hd_v = shape[3];
    const int64_t d_ff = shape[4];

    const at::Tensor qkv = multiply(matrices[kQKV], rms_norm(h.contiguous(), norms[0], eps));
    at::Tensor qk = qkv.narrow(1, 0, (heads + kv_heads) * hd).reshape({n, heads + kv_heads, hd});
    qk = rope(rms_norm(qk.contiguous(), norms[1], eps), cos.contiguous(), sin.contiguous(), true);
    const at::Tensor v = qkv.narrow(1, (heads + kv_heads) * hd, kv_heads * hd_v).reshape({n, kv_heads, hd_v});
    cache_write(qk.narrow(1, heads, kv_heads), k_caches, slots, positions);
    cache_write(v, v_caches, slots, positions);
    const at::Tensor a = attend_runs(qk.narrow(1, 0, heads), k_caches, v_caches, slots, positions, window, scale);
    h = at::add(h, rms_norm(multiply(matrices[kOutput], a), norms[2], eps));

    const at::Tensor gate_up = multiply(matrices[kGateUp], rms_norm(h.contiguous(), norms[3], eps));
    return at::add(h, rms_norm(multiply(matrices[kDown], gated_gelu(gate_up, d_ff)), norms[4], eps));
}

TORCH_LIBRARY_FRAGMENT(POWER_OPS, m) {
    m.def("gemma3_layer(Tensor h, Tensor[] norms, Tensor[] packed, int[] products, int[] shape, float eps, "
          "float scale, int window, Tensor cos, Tensor sin, Tensor k_caches, Tensor v_caches, Tensor slots, "
          "Tensor positions) -> Tensor");
}
TORCH_LIBRARY_IMPL(POWER_OPS, CPU, m) { m.impl("gemma3_layer", &gemma3_layer); }
