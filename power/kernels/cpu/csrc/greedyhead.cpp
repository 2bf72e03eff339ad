// The cheap pass of the exact greedy LM head over a Q8_0 head: every token's score from the high nibbles of its
// integer weights (or, in the head's exact blocks, from all 8 bits), and a rigorous bound on the rest
// (power/kernels/cpu/greedy.py defines the arithmetic, the one stream the pass reads and the bound), and the whole
// greedy head around it: the candidates and their exact scores (greedy_argmax); and the head held once, the stream
// and the low nibbles it leaves out, multiplied and read back as the Q8_0 head (compact_matmul, compact_rows), and
// its product reduced to each row's argmax as it is computed (compact_argmax). One
// build per instruction path (simd.h), compiled with -ffp-contract=off so that every path computes the reference's
// bits.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "pool.h"
#include "quantize.h"
#include "simd.h"

namespace {

constexpr int kChunkRows = 4;
constexpr int64_t kGroupTiles = 32;
constexpr int64_t kQ8Block = 544;       // a Q8_0 block of a 16-row tile (power/kernels/cpu/layout.py)
constexpr int64_t kCompactBlock = 304;  // 16 float16 scales, 16 remainder norms, 16 rows x 32 high nibbles
constexpr int64_t kNorms = 32, kNibbles = 48;
constexpr int64_t kLowBlock = 256;      // 16 rows x 32 low nibbles of a bounded block (the low array)

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
    const uint8_t* low = nullptr;  // the bounded blocks' low nibbles (the head held once), low_bytes a tile
    int64_t low_bytes = 0;
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

// A bounded block read in full: its high nibbles from the stream (cb) and its low nibbles from the low array (lb,
// the same 4 groups of 64 bytes) recombine into the Q8_0 bytes, q + 128 = 16 (h + 8) + (l + 8), in load_q8_0's
// registers, so the block's integer and float term are the Q8_0 product's.
template <int NR>
void split_block(const uint8_t* cb, const uint8_t* lb, int64_t b, const Chunk<NR>& a, F* p, F* mag) {
    const F dw = load_f16(cb);
    const V high4 = splat((int32_t)0xF0F0F0F0);
    V w[8];
    for (int k = 0; k < 4; ++k) {
        const V hi = load64(cb + kNibbles + 64 * k), lo = load64(lb + 64 * k);
        w[k] = shl(hi & kLow4, 4) | (lo & kLow4);
        w[k + 4] = (hi & high4) | (shr(lo, 4) & kLow4);
    }
#ifdef POWER_SIGNED_Q8
    for (int g = 0; g < 8; ++g) w[g] = w[g] ^ splat((int32_t)0x80808080);
#endif
    for (int r = 0; r < NR; ++r) {
        add_term(dw * fsplat(a.d[r][b]), q8_0_sum(w, a.q[r] + 32 * b, a.sum[r][b]), p[r], mag[r]);
    }
}

// One tile: its blocks in order from one contiguous run of the stream (c), each exact or bounded as the head stores
// it: the pass's scores and bounds, or with `kFull` every score in full, the bounded blocks' low nibbles read from the
// low array (l): the Q8_0 product's bits (no bound then; b_out unused).
template <int NR, bool kFull>
void tile_blocks(const uint8_t* c, const uint8_t* l, const Call& call, const Chunk<NR>& a, float* const* p_out,
                 float* const* b_out) {
    F p[NR], rem[NR], mag[NR];
    for (int r = 0; r < NR; ++r) p[r] = rem[r] = mag[r] = fzero();
    for (int64_t b = 0; b < call.nb; ++b) {
        if (call.exact[b]) {
            exact_block<NR>(c, b, a, p, mag);
            c += kQ8Block;
            continue;
        }
        if constexpr (kFull) {
            split_block<NR>(c, l, b, a, p, mag);
            l += kLowBlock;
        } else {
            bounded_block<NR>(c, b, a, p, rem, mag);
        }
        c += kCompactBlock;
    }
    for (int r = 0; r < NR; ++r) {
        store(p_out[r], p[r]);
        if constexpr (!kFull) {
            store(b_out[r], (rem[r] * fsplat(call.k_rem) + mag[r] * fsplat(call.k_sum)) + fsplat(call.floor));
        }
    }
}

// A call's rows as the pass reads them: the products' quantisation (quantize.h) with each block's level sum and
// norm rounded up to float32.
struct Rows {
    at::Tensor q, d, sum, norm;
    int64_t in, nb, n;
};

// The float32 at or above the square root of an integer sum of squares (below 2^24, so exact in float32).
float sqrt_up(int32_t squares) {
    float root = std::sqrt((float)squares);
    while ((double)root * root < (double)squares) root = std::nextafter(root, INFINITY);
    return root;
}

Rows quantized_rows(const at::Tensor& x, int64_t nb) {
    TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == 32 * nb && x.is_contiguous(),
                "x: contiguous float32 [n, ", 32 * nb, "]");
    const int64_t n = x.size(0);
    const auto parts = power_quant::quantize_rows(x, 32);
    Rows rows{parts[0], parts[1], at::empty({n, nb}, at::kInt), at::empty({n, nb}, at::kFloat), 32 * nb, nb, n};
    const int8_t* q = rows.q.data_ptr<int8_t>();
    int32_t* sum = rows.sum.data_ptr<int32_t>();
    float* norm = rows.norm.data_ptr<float>();
    for (int64_t i = 0; i < n * nb; ++i) {
        int32_t s = 0, squares = 0;
        for (int k = 0; k < 32; ++k) {
            s += q[32 * i + k];
            squares += q[32 * i + k] * q[32 * i + k];
        }
        sum[i] = s;
        norm[i] = sqrt_up(squares);
    }
    return rows;
}

template <int NR>
Chunk<NR> chunk_of(const Rows& rows, int64_t r0) {
    Chunk<NR> chunk;
    for (int r = 0; r < NR; ++r) {
        const int64_t row = std::min(r0 + r, rows.n - 1);
        chunk.q[r] = rows.q.data_ptr<int8_t>() + row * rows.in;
        chunk.d[r] = rows.d.data_ptr<float>() + row * rows.nb;
        chunk.sum[r] = rows.sum.data_ptr<int32_t>() + row * rows.nb;
        chunk.norm[r] = rows.norm.data_ptr<float>() + row * rows.nb;
    }
    return chunk;
}

// The pass over tiles [first, last) for rows r0.. of the chunk; sink(row, tile, p, bound) takes each tile's 16
// scores and bounds of a row (`kFull`: every score in full from the stream and the low array, no bound).
template <int NR, bool kFull, class Sink>
void run_chunk(const Call& call, const Rows& rows, int64_t r0, int64_t first, int64_t last, const Sink& sink) {
    const Chunk<NR> chunk = chunk_of<NR>(rows, r0);
    float p[NR][16], bound[NR][16];
    float* p_out[NR];
    float* b_out[NR];
    for (int r = 0; r < NR; ++r) p_out[r] = p[r], b_out[r] = bound[r];
    for (int64_t i = first; i < last; ++i) {
        tile_blocks<NR, kFull>(call.stream + i * call.tile_bytes, kFull ? call.low + i * call.low_bytes : nullptr, call,
                               chunk, p_out, b_out);
        for (int r = 0; r < NR && r0 + r < rows.n; ++r) sink(r0 + r, i, p[r], bound[r]);
    }
}

template <bool kFull = false, class Sink>
void pass(const Call& call, const Rows& rows, int64_t n_tiles, const Sink& sink) {
    const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 16) / call.tile_bytes);
    power_pool::parallel_for(n_tiles, grain, [&](int64_t begin, int64_t end) {
        // Every chunk of rows through a group of tiles before the next group: the group stays in cache.
        for (int64_t first = begin; first < end; first += kGroupTiles) {
            const int64_t last = std::min(end, first + kGroupTiles);
            for (int64_t r0 = 0; r0 < rows.n; r0 += kChunkRows) {
                const int64_t left = rows.n - r0;
                if (left >= 3) run_chunk<4, kFull>(call, rows, r0, first, last, sink);
                else if (left == 2) run_chunk<2, kFull>(call, rows, r0, first, last, sink);
                else run_chunk<1, kFull>(call, rows, r0, first, last, sink);
            }
        }
    });
}

// The bytes of one tile of the stream whose exact blocks `exact` marks (uint8 [blocks]).
int64_t tile_bytes_of(const at::Tensor& exact) {
    TORCH_CHECK(exact.scalar_type() == at::kByte && exact.dim() == 1 && exact.is_contiguous() && exact.numel() > 0,
                "exact: contiguous uint8 [blocks]");
    const uint8_t* marks = exact.data_ptr<uint8_t>();
    const int64_t nb = exact.numel();
    const int64_t exact_count = std::count_if(marks, marks + nb, [](uint8_t m) { return m != 0; });
    return exact_count * kQ8Block + (nb - exact_count) * kCompactBlock;
}

Call call_of(const at::Tensor& stream, const at::Tensor& exact, double k_rem, double k_sum, double floor) {
    const int64_t tile_bytes = tile_bytes_of(exact);
    TORCH_CHECK(stream.scalar_type() == at::kByte && stream.is_contiguous() && stream.numel() % tile_bytes == 0,
                "stream: contiguous uint8, whole tiles of ", tile_bytes, " bytes");
    return Call{stream.data_ptr<uint8_t>(), exact.data_ptr<uint8_t>(), exact.numel(), tile_bytes, (float)k_rem,
                (float)k_sum, (float)floor};
}

// ceil(4 sqrt(squares)) for an integer sum of squares (at most 32 * 64), checked exactly in integers.
uint8_t norm_byte(int32_t squares) {
    int32_t m = (int32_t)std::ceil(4.0 * std::sqrt((double)squares));
    while (m > 0 && (m - 1) * (m - 1) >= 16 * squares) --m;
    while (m * m < 16 * squares) ++m;
    return (uint8_t)m;
}

// A bounded block's compact form (power/kernels/cpu/greedy.py) from its Q8_0 tile block qb, whose weight j of row r
// in group g (weights 4 g .. 4 g + 3) is the byte 64 g + 4 r + j after the 16 scales: the scales; per row
// ceil(4 ||l||) of its low parts l = (q & 15) - 8; group k's high nibbles h + 8 = (q >> 4) ^ 8 of groups k and k + 4.
void compact_block(const uint8_t* qb, uint8_t* out) {
    std::memcpy(out, qb, kNorms);
    const uint8_t* q = qb + kNorms;
    for (int r = 0; r < 16; ++r) {
        int32_t squares = 0;
        for (int g = 0; g < 8; ++g) {
            for (int j = 0; j < 4; ++j) {
                const int32_t low = (q[64 * g + 4 * r + j] & 15) - 8;
                squares += low * low;
            }
        }
        out[kNorms + r] = norm_byte(squares);
    }
    for (int k = 0; k < 4; ++k) {
        for (int i = 0; i < 64; ++i) {
            out[kNibbles + 64 * k + i] = (uint8_t)(((q[64 * k + i] >> 4) ^ 8) | (((q[64 * (k + 4) + i] >> 4) ^ 8) << 4));
        }
    }
}

// A bounded block's low nibbles l + 8 = q & 15 (the low array), grouped as compact_block groups the high ones.
void low_block(const uint8_t* qb, uint8_t* out) {
    const uint8_t* q = qb + kNorms;
    for (int k = 0; k < 4; ++k) {
        for (int i = 0; i < 64; ++i) out[64 * k + i] = (uint8_t)((q[64 * k + i] & 15) | ((q[64 * (k + 4) + i] & 15) << 4));
    }
}

// The low array's bytes a tile: kLowBlock for each bounded block.
int64_t low_bytes_of(const at::Tensor& exact) {
    const uint8_t* marks = exact.data_ptr<uint8_t>();
    return kLowBlock * std::count_if(marks, marks + exact.numel(), [](uint8_t m) { return m == 0; });
}

// The call over a head held once: the stream and its low array (whole tiles of both).
Call held_call(const at::Tensor& stream, const at::Tensor& exact, const at::Tensor& low, double k_rem, double k_sum,
               double floor) {
    Call call = call_of(stream, exact, k_rem, k_sum, floor);
    call.low_bytes = low_bytes_of(exact);
    TORCH_CHECK(low.scalar_type() == at::kByte && low.is_contiguous() &&
                low.numel() == stream.numel() / call.tile_bytes * call.low_bytes,
                "low: contiguous uint8, the stream's tiles' low nibbles (", call.low_bytes, " bytes a tile)");
    call.low = low.data_ptr<uint8_t>();
    return call;
}

// A row's pass over one tile, reduced: the largest lower and upper bound of its tokens below `vocab`, or NaN for
// both where a score or bound is not finite (the row then takes the full head).
struct TileBounds {
    float lower, upper;
};

TileBounds reduce_tile(const float* p, const float* bound, int64_t tokens) {
    TileBounds best{-INFINITY, -INFINITY};
    for (int64_t j = 0; j < tokens; ++j) {
        if (!std::isfinite(p[j]) || !std::isfinite(bound[j])) return {NAN, NAN};
        best.lower = std::max(best.lower, p[j] - bound[j]);
        best.upper = std::max(best.upper, p[j] + bound[j]);
    }
    return best;
}

// The tiles whose largest upper bound reaches the row's best lower bound, in increasing order (none where the pass
// was not finite).
std::vector<int64_t> candidate_tiles(const TileBounds* tiles, int64_t n_tiles) {
    float best = -INFINITY;
    for (int64_t i = 0; i < n_tiles; ++i) {
        if (std::isnan(tiles[i].lower)) return {};
        best = std::max(best, tiles[i].lower);
    }
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < n_tiles; ++i) {
        if (tiles[i].upper >= best) kept.push_back(i);
    }
    return kept;
}

}  // namespace

// packed: a Q8_0 head's tiles [tiles * nb * 544] (the products' layout); exact uint8 [nb]: which blocks the pass reads
// in full. Returns the head held once (power/kernels/cpu/greedy.py): the pass's stream, per tile its blocks in order,
// the exact ones as their Q8_0 tile blocks, the others in their compact form; and the low array, per tile its bounded
// blocks' low nibbles in order.
std::tuple<at::Tensor, at::Tensor> greedy_hold(at::Tensor packed, at::Tensor exact) {
    const int64_t tile_bytes = tile_bytes_of(exact), low_bytes = low_bytes_of(exact), nb = exact.numel();
    TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() % (nb * kQ8Block) == 0,
                "packed: a Q8_0 head's tiles, contiguous uint8, whole tiles of ", nb * kQ8Block, " bytes");
    const int64_t n_tiles = packed.numel() / (nb * kQ8Block);
    auto stream = at::empty({n_tiles * tile_bytes}, at::kByte);
    auto low = at::empty({n_tiles * low_bytes}, at::kByte);
    const uint8_t* marks = exact.data_ptr<uint8_t>();
    const uint8_t* tiles = packed.data_ptr<uint8_t>();
    uint8_t* stream_out = stream.data_ptr<uint8_t>();
    uint8_t* low_out = low.data_ptr<uint8_t>();
    power_pool::parallel_for(n_tiles, kGroupTiles, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            uint8_t* dst = stream_out + t * tile_bytes;
            uint8_t* low_dst = low_out + t * low_bytes;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* block = tiles + (t * nb + b) * kQ8Block;
                if (marks[b]) {
                    std::memcpy(dst, block, kQ8Block);
                    dst += kQ8Block;
                } else {
                    compact_block(block, dst);
                    low_block(block, low_dst);
                    dst += kCompactBlock;
                    low_dst += kLowBlock;
                }
            }
        }
    });
    return {stream, low};
}

// The head held once (stream, exact, low) times x float32 [n, in]: float32 [n, tiles * 16], the Q8_0 product's bits.
at::Tensor compact_matmul(at::Tensor stream, at::Tensor exact, at::Tensor low, at::Tensor x) {
    const Call call = held_call(stream, exact, low, 0.0, 0.0, 0.0);
    const Rows rows = quantized_rows(x, call.nb);
    const int64_t n_tiles = stream.numel() / call.tile_bytes, width = 16 * n_tiles;
    auto out = at::empty({rows.n, width}, at::kFloat);
    float* op = out.data_ptr<float>();
    pass<true>(call, rows, n_tiles, [&](int64_t row, int64_t tile, const float* tile_p, const float*) {
        std::memcpy(op + row * width + 16 * tile, tile_p, 16 * sizeof(float));
    });
    return out;
}

// A tile's best of its first `tokens` scores: the largest, the first on ties, and whether every score is finite.
struct TileBest {
    float score;
    int32_t token;  // within the tile
    bool finite;
};

TileBest best_of_tile(const float* p, int64_t tokens) {
    TileBest best{p[0], 0, std::isfinite(p[0])};
    for (int64_t j = 1; j < tokens; ++j) {
        best.finite = best.finite && std::isfinite(p[j]);
        if (p[j] > best.score) best.score = p[j], best.token = (int32_t)j;
    }
    return best;
}

// The head held once times x float32 [n, in], each row reduced to its argmax over the first `vocab` scores as a tile
// is computed (the product's bits, never written out): int64 [n], the lowest token of the largest score, as
// torch.argmax of the product takes it, or -1 where a score is not finite (the caller takes the product's argmax).
at::Tensor compact_argmax(at::Tensor stream, at::Tensor exact, at::Tensor low, at::Tensor x, int64_t vocab) {
    const Call call = held_call(stream, exact, low, 0.0, 0.0, 0.0);
    const Rows rows = quantized_rows(x, call.nb);
    const int64_t n_tiles = stream.numel() / call.tile_bytes, n = rows.n;
    TORCH_CHECK(vocab > 16 * (n_tiles - 1) && vocab <= 16 * n_tiles, "vocab: ", vocab, " tokens in ", n_tiles,
                " tiles");
    std::vector<TileBest> tiles(n * n_tiles);
    pass<true>(call, rows, n_tiles, [&](int64_t row, int64_t tile, const float* p, const float*) {
        tiles[row * n_tiles + tile] = best_of_tile(p, std::min<int64_t>(16, vocab - 16 * tile));
    });
    auto argmax = at::empty({n}, at::kLong);
    int64_t* out = argmax.data_ptr<int64_t>();
    for (int64_t r = 0; r < n; ++r) {
        const TileBest* row = tiles.data() + r * n_tiles;
        int64_t tile = 0;
        for (int64_t i = 1; i < n_tiles; ++i) {
            if (row[i].score > row[tile].score) tile = i;
        }
        const bool finite = std::all_of(row, row + n_tiles, [](const TileBest& t) { return t.finite; });
        out[r] = finite ? 16 * tile + row[tile].token : -1;
    }
    return argmax;
}

// The head held once: output rows `rows` int64 [k] dequantised, float32 [k, in], w = d * q as the Q8_0 dequantiser
// computes it (q = 16 (h + 8) + (l + 8) - 128 in a bounded block).
at::Tensor compact_rows(at::Tensor stream, at::Tensor exact, at::Tensor low, at::Tensor rows) {
    const Call call = held_call(stream, exact, low, 0.0, 0.0, 0.0);
    TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.is_contiguous(), "rows: int64 [k]");
    const int64_t k = rows.size(0), n_rows = stream.numel() / call.tile_bytes * 16;
    const int64_t* rp = rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < k; ++i) TORCH_CHECK(rp[i] >= 0 && rp[i] < n_rows, "row ", rp[i], " out of range");
    auto out = at::empty({k, 32 * call.nb}, at::kFloat);
    float* op = out.data_ptr<float>();
    for (int64_t i = 0; i < k; ++i) {
        const int64_t r = rp[i] % 16;
        const uint8_t* c = call.stream + rp[i] / 16 * call.tile_bytes;
        const uint8_t* l = call.low + rp[i] / 16 * call.low_bytes;
        for (int64_t b = 0; b < call.nb; ++b) {
            uint16_t bits;
            std::memcpy(&bits, c + 2 * r, 2);
            const float d = static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
            float* w = op + i * 32 * call.nb + 32 * b;
            for (int e = 0; e < 32; ++e) {
                const int64_t at = 64 * (e % 16 / 4) + 4 * r + e % 4;  // weight e's byte in its group of 4
                int32_t q;
                if (call.exact[b]) {
                    q = (int8_t)c[kNorms + 64 * (e / 4) + 4 * r + e % 4];
                } else {
                    const int shift = e < 16 ? 0 : 4;
                    q = 16 * ((c[kNibbles + at] >> shift) & 15) + ((l[at] >> shift) & 15) - 128;
                }
                w[e] = d * (float)q;
            }
            if (call.exact[b]) {
                c += kQ8Block;
            } else {
                c += kCompactBlock;
                l += kLowBlock;
            }
        }
    }
    return out;
}

// stream: the head's pass stream (power/kernels/cpu/greedy.py); exact uint8 [in / 32]: which blocks it stores as
// Q8_0; x float32 [n, in]. Returns (p, bound), float32 [n, tiles * 16].
std::tuple<at::Tensor, at::Tensor> greedy_pass(at::Tensor stream, at::Tensor exact, at::Tensor x, double k_rem,
                                               double k_sum, double floor) {
    const Call call = call_of(stream, exact, k_rem, k_sum, floor);
    const Rows rows = quantized_rows(x, call.nb);
    const int64_t n_tiles = stream.numel() / call.tile_bytes, width = 16 * n_tiles;
    auto p = at::empty({rows.n, width}, at::kFloat);
    auto bound = at::empty({rows.n, width}, at::kFloat);
    float* pp = p.data_ptr<float>();
    float* bp = bound.data_ptr<float>();
    pass(call, rows, n_tiles, [&](int64_t row, int64_t tile, const float* tile_p, const float* tile_bound) {
        std::memcpy(pp + row * width + 16 * tile, tile_p, 16 * sizeof(float));
        std::memcpy(bp + row * width + 16 * tile, tile_bound, 16 * sizeof(float));
    });
    return {p, bound};
}

// The greedy head (power/runtime/greedy_head.py) in one call: the pass, the candidate tiles of each row (those
// holding a token whose upper bound reaches the row's best lower bound) and the exact scores of their tokens, read
// in full from the stream and its low array `low`. Returns (argmax int64 [n], the lowest token of the largest exact
// score, or -1 where the row's pass was not finite; candidate tiles int64 [n]).
std::tuple<at::Tensor, at::Tensor> greedy_argmax(at::Tensor stream, at::Tensor exact, at::Tensor low,
                                                 at::Tensor x, int64_t vocab, double k_rem, double k_sum,
                                                 double floor) {
    const Call call = held_call(stream, exact, low, k_rem, k_sum, floor);
    const Rows rows = quantized_rows(x, call.nb);
    const int64_t n_tiles = stream.numel() / call.tile_bytes, n = rows.n;
    TORCH_CHECK(vocab > 16 * (n_tiles - 1) && vocab <= 16 * n_tiles, "vocab: ", vocab, " tokens in ", n_tiles,
                " tiles");
    std::vector<TileBounds> bounds(n * n_tiles);
    pass(call, rows, n_tiles, [&](int64_t row, int64_t tile, const float* p, const float* bound) {
        bounds[row * n_tiles + tile] = reduce_tile(p, bound, std::min<int64_t>(16, vocab - 16 * tile));
    });
    std::vector<std::pair<int64_t, int64_t>> pairs;  // (row, tile), rows in order, each row's tiles increasing
    auto argmax = at::full({n}, -1, at::kLong);
    auto counts = at::empty({n}, at::kLong);
    for (int64_t r = 0; r < n; ++r) {
        const auto kept = candidate_tiles(bounds.data() + r * n_tiles, n_tiles);
        counts.data_ptr<int64_t>()[r] = (int64_t)kept.size();
        for (const int64_t tile : kept) pairs.emplace_back(r, tile);
    }
    std::vector<float> scores(16 * pairs.size());
    power_pool::parallel_for((int64_t)pairs.size(), 4, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const auto [row, tile] = pairs[i];
            float* out_row[1] = {scores.data() + 16 * i};
            tile_blocks<1, true>(call.stream + tile * call.tile_bytes, call.low + tile * call.low_bytes, call,
                                 chunk_of<1>(rows, row), out_row, nullptr);
        }
    });
    // Tokens in increasing order per row with a strict comparison: the first maximum wins, as in torch.argmax.
    int64_t* out = argmax.data_ptr<int64_t>();
    std::vector<float> best(n);
    for (size_t i = 0; i < pairs.size(); ++i) {
        const auto [row, tile] = pairs[i];
        for (int64_t j = 0; j < std::min<int64_t>(16, vocab - 16 * tile); ++j) {
            const float score = scores[16 * i + j];
            if (out[row] < 0 || score > best[row]) best[row] = score, out[row] = 16 * tile + j;
        }
    }
    return {argmax, counts};
}

TORCH_LIBRARY_FRAGMENT(POWER_OPS, m) {
    m.def("greedy_hold(Tensor packed, Tensor exact) -> (Tensor, Tensor)");
    m.def("compact_matmul(Tensor stream, Tensor exact, Tensor low, Tensor x) -> Tensor");
    m.def("compact_rows(Tensor stream, Tensor exact, Tensor low, Tensor rows) -> Tensor");
    m.def("compact_argmax(Tensor stream, Tensor exact, Tensor low, Tensor x, int vocab) -> Tensor");
    m.def("greedy_pass(Tensor stream, Tensor exact, Tensor x, float k_rem, float k_sum, float floor) -> (Tensor, "
          "Tensor)");
    m.def("greedy_argmax(Tensor stream, Tensor exact, Tensor low, Tensor x, int vocab, float k_rem, float k_sum, "
          "float floor) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(POWER_OPS, CPU, m) {
    m.impl("greedy_hold", &greedy_hold);
    m.impl("compact_matmul", &compact_matmul);
    m.impl("compact_rows", &compact_rows);
    m.impl("compact_argmax", &compact_argmax);
    m.impl("greedy_pass", &greedy_pass);
    m.impl("greedy_argmax", &greedy_argmax);
}
