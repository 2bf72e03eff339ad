// The cheap pass of the exact greedy LM head over a Q8_0 head: every token's score from the high nibbles of its
// integer weights (or, in the head's exact blocks, from all 8 bits), and a rigorous bound on the rest
// (power/kernels/cpu/greedy.py defines the arithmetic, the one stream the pass reads and the bound). One build per
// instruction path (simd.h), compiled with -ffp-contract=off so that every path computes the reference's bits.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "pool.h"
#include "simd.h"

namespace {

constexpr int kChunkRows = 4;
constexpr int64_t kGroupTiles = 32;
constexpr int64_t kQ8Block = 544;       // a Q8_0 block of a 16-row tile (power/kernels/cpu/layout.py)
constexpr int64_t kCompactBlock = 304;  // 16 float16 scales, 16 remainder norms, 16 rows x 32 high nibbles
constexpr int64_t kNorms = 32, kNibbles = 48;

// NR activation rows of the call (a row may repeat to fill a chunk; its result is then computed twice).
template <int NR>
struct Chunk {
    const int8_t* q[NR];     // int8 levels [in]
    const float* d[NR];      // block scales [nb]
    const int32_t* sum[NR];  // the levels' sum per block [nb]
    const float* norm[NR];   // the levels' norm per block, rounded up [nb]
};

struct Call {
    const uint8_t* stream;
    const uint8_t* exact;  // 1: the block is stored as its Q8_0 tile block [nb]
    int64_t nb, tile_bytes;
    float k_rem, k_sum, floor;
};

// The float step of a block (`power.kernels.cpu`'s, the full product's) and its magnitude.
inline void add_term(F scale, V s, F& p, F& mag) {
    const F term = scale * tofloat(s);
    p = p + term;
    mag = mag + abs(term);
}

// An exact block (its Q8_0 tile block at qb), as csrc/qmatmul.cpp's tile_q8_0 multiplies it.
template <int NR>
void exact_block(const uint8_t* qb, int64_t b, const Chunk<NR>& a, F* p, F* mag) {
    const F dw = load_f16(qb);
    V w[8];
    load_q8_0(qb, w);
    for (int r = 0; r < NR; ++r) {
        add_term(dw * fsplat(a.d[r][b]), q8_0_sum(w, a.q[r] + 32 * b, a.sum[r][b]), p[r], mag[r]);
    }
}

// A bounded block (its compact block at cb): its high nibbles h + 8 give A = 16 sum((h + 8) x) - 120 sum(x), the
// sum of (16 h + 8) x; the remainder's bound |scale| * ceil(4 ||l||) * ||x|| is added to rem.
template <int NR>
void bounded_block(const uint8_t* cb, int64_t b, const Chunk<NR>& a, F* p, F* rem, F* mag) {
    const F dw = load_f16(cb);
    const F norms = load_u8(cb + kNorms);
    V lo[4], hi[4];
    for (int k = 0; k < 4; ++k) {
        const V v = load64(cb + kNibbles + 64 * k);
        lo[k] = v & kLow4;
        hi[k] = shr(v, 4) & kLow4;
    }
    for (int r = 0; r < NR; ++r) {
        const int8_t* q = a.q[r] + 32 * b;
        V s = zero();
        for (int k = 0; k < 4; ++k) {
            s = dot_u8(s, lo[k], x4(q + 4 * k));
            s = dot_u8(s, hi[k], x4(q + 16 + 4 * k));
        }
        const F scale = dw * fsplat(a.d[r][b]);
        add_term(scale, shl(s, 4) - splat(120 * a.sum[r][b]), p[r], mag[r]);
        rem[r] = rem[r] + (abs(scale) * norms) * fsplat(a.norm[r][b]);
    }
}

// One tile: its blocks in order from one contiguous run of the stream, each exact or bounded as the head stores it.
template <int NR>
void tile_pass(const uint8_t* c, const Call& call, const Chunk<NR>& a, float* const* p_out, float* const* b_out) {
    F p[NR], rem[NR], mag[NR];
    for (int r = 0; r < NR; ++r) p[r] = rem[r] = mag[r] = fzero();
    for (int64_t b = 0; b < call.nb; ++b) {
        if (call.exact[b]) {
            exact_block<NR>(c, b, a, p, mag);
            c += kQ8Block;
        } else {
            bounded_block<NR>(c, b, a, p, rem, mag);
            c += kCompactBlock;
        }
    }
    for (int r = 0; r < NR; ++r) {
        store(p_out[r], p[r]);
        store(b_out[r], (rem[r] * fsplat(call.k_rem) + mag[r] * fsplat(call.k_sum)) + fsplat(call.floor));
    }
}

struct Rows {
    const int8_t* q;
    const float* d;
    const int32_t* sum;
    const float* norm;
    int64_t in, nb, n;
    float* p;
    float* bound;
    int64_t stride;  // output columns
};

template <int NR>
void run_chunk(const Call& call, const Rows& rows, int64_t r0, int64_t first, int64_t last) {
    Chunk<NR> chunk;
    for (int r = 0; r < NR; ++r) {
        const int64_t row = std::min(r0 + r, rows.n - 1);
        chunk.q[r] = rows.q + row * rows.in;
        chunk.d[r] = rows.d + row * rows.nb;
        chunk.sum[r] = rows.sum + row * rows.nb;
        chunk.norm[r] = rows.norm + row * rows.nb;
    }
    for (int64_t i = first; i < last; ++i) {
        float* p_out[NR];
        float* b_out[NR];
        for (int r = 0; r < NR; ++r) {
            const int64_t row = std::min(r0 + r, rows.n - 1);
            p_out[r] = rows.p + row * rows.stride + 16 * i;
            b_out[r] = rows.bound + row * rows.stride + 16 * i;
        }
        tile_pass<NR>(call.stream + i * call.tile_bytes, call, chunk, p_out, b_out);
    }
}

void check_rows(const at::Tensor& t, at::ScalarType type, int64_t n, int64_t width, const char* name) {
    TORCH_CHECK(t.scalar_type() == type && t.dim() == 2 && t.size(0) == n && t.size(1) == width && t.is_contiguous(),
                name, ": contiguous [", n, ", ", width, "] of the documented type");
}

}  // namespace

// stream: the head's pass stream (power/kernels/cpu/greedy.py); exact uint8 [in / 32]: which blocks it stores as
// Q8_0; q int8 [n, in], d float32, sum int32 and norm float32 [n, in / 32]. Returns (p, bound), float32
// [n, tiles * 16].
std::tuple<at::Tensor, at::Tensor> greedy_pass(at::Tensor stream, at::Tensor exact, at::Tensor q, at::Tensor d,
                                               at::Tensor sum, at::Tensor norm, double k_rem, double k_sum,
                                               double floor) {
    TORCH_CHECK(exact.scalar_type() == at::kByte && exact.dim() == 1 && exact.is_contiguous() && exact.numel() > 0,
                "exact: contiguous uint8 [blocks]");
    const int64_t nb = exact.numel(), in = 32 * nb, n = q.size(0);
    const uint8_t* marks = exact.data_ptr<uint8_t>();
    const int64_t exact_count = std::count_if(marks, marks + nb, [](uint8_t m) { return m != 0; });
    const int64_t tile_bytes = exact_count * kQ8Block + (nb - exact_count) * kCompactBlock;
    TORCH_CHECK(stream.scalar_type() == at::kByte && stream.is_contiguous() && stream.numel() % tile_bytes == 0,
                "stream: contiguous uint8, whole tiles of ", tile_bytes, " bytes");
    const int64_t n_tiles = stream.numel() / tile_bytes;
    check_rows(q, at::kChar, n, in, "q");
    check_rows(d, at::kFloat, n, nb, "d");
    check_rows(sum, at::kInt, n, nb, "sum");
    check_rows(norm, at::kFloat, n, nb, "norm");
    auto p = at::empty({n, n_tiles * 16}, at::kFloat);
    auto bound = at::empty({n, n_tiles * 16}, at::kFloat);
    if (n == 0) return {p, bound};
    const Call call{stream.data_ptr<uint8_t>(), marks, nb, tile_bytes, (float)k_rem, (float)k_sum, (float)floor};
    const Rows rows{q.data_ptr<int8_t>(), d.data_ptr<float>(), sum.data_ptr<int32_t>(), norm.data_ptr<float>(),
                    in, nb, n, p.data_ptr<float>(), bound.data_ptr<float>(), n_tiles * 16};
    const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 16) / tile_bytes);
    power_pool::parallel_for(n_tiles, grain, [&](int64_t begin, int64_t end) {
        // Every chunk of rows through a group of tiles before the next group: the group stays in cache.
        for (int64_t first = begin; first < end; first += kGroupTiles) {
            const int64_t last = std::min(end, first + kGroupTiles);
            for (int64_t r0 = 0; r0 < n; r0 += kChunkRows) {
                const int64_t left = n - r0;
                if (left >= 3) run_chunk<4>(call, rows, r0, first, last);
                else if (left == 2) run_chunk<2>(call, rows, r0, first, last);
                else run_chunk<1>(call, rows, r0, first, last);
            }
        }
    });
    return {p, bound};
}

TORCH_LIBRARY_FRAGMENT(POWER_OPS, m) {
    m.def("greedy_pass(Tensor stream, Tensor exact, Tensor q, Tensor d, Tensor sum, Tensor norm, float k_rem, "
          "float k_sum, float floor) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(POWER_OPS, CPU, m) { m.impl("greedy_pass", &greedy_pass); }
