// Row-count-invariant products of float32 rows with GGUF matrices kept in their blocks (power/kernels/cpu/__init__.py
// defines the arithmetic; power/kernels/cpu/layout.py the tile layout these kernels read). One build per instruction
// path (simd.h); compiled with -ffp-contract=off so that every path rounds exactly as the torch reference does.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "pool.h"
#include "quantize.h"
#include "simd.h"
#ifdef POWER_PATH_AMX
#include "amx.h"
#endif

namespace {

// Rows computed per pass over a tile, their accumulators in registers: 4, or 2 or 1 for the last rows of a call
// (3 rows run as 4 with one repeated). More rows take more passes, each reading the tile again from cache.
constexpr int kChunkRows = 4;
constexpr int64_t kGroupTiles = 32;  // tiles whose results are gathered before they are written out
enum Kind { Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16 };

// NR activation rows, each through its own pointers (a row may repeat to fill a chunk; its result is then
// computed twice and kept once). Quantised: q int8 [in], d float32 [in / block], bsum int16 [in / 16] (sums
// of q); float matrices read x float32 [in]. The AMX kernels read the chunk's distinct rows as one tile from
// q[0], `stride` bytes apart; chunk row r is tile row tile_row[r].
template <int NR>
struct Chunk {
    const int8_t* q[NR];
    const float* d[NR];
    const int16_t* bsum[NR];
    const float* x[NR];
    int64_t stride;
    int tile_row[NR];
};

const V kBit4 = splat(0x10101010);

// Bit `bit` of every byte of h, moved to bit 4 (the fifth bit of a Q5 weight).
inline V fifth_bit(V h, int bit) { return (bit <= 4 ? shl(h, 4 - bit) : shr(h, bit - 4)) & kBit4; }

// The block decoders, shared by the VNNI kernels (which multiply the decoded weights in registers) and the AMX
// kernels (which store them for the tiles). Weights come out unsigned (Q8_0's as they are stored: signed).

// Q4_0 (kFive false) and Q5_0 block at p: weights 4c..4c+3 of each row in lo[c], 16+4c..16+4c+3 in hi[c].
template <bool kFive>
inline void decode_q_0(const uint8_t* p, V* lo, V* hi) {
    const int qs = kFive ? 96 : 32;
    const V h = kFive ? load64(p + 32) : zero();
    for (int c = 0; c < 4; ++c) {
        const V v = load64(p + qs + 64 * c);
        lo[c] = v & kLow4;
        hi[c] = shr(v, 4) & kLow4;
        if (kFive) {
            lo[c] = lo[c] | (shl(h, 4 - c) & kBit4);
            hi[c] = hi[c] | (shr(h, c) & kBit4);
        }
    }
}

// Q4_K/Q5_K: the 6-bit scales and mins of the 8 sub-blocks of 32 (each min in both int16 halves of its lane,
// for k_mins).
inline void decode_k_scales(const uint8_t* p, V* sc, V* mn) {
    const V six = splat(63), two = splat(3);
    const V s0 = load64(p + 64), s1 = load64(p + 128), s2 = load64(p + 192);
    for (int j = 0; j < 4; ++j) {
        sc[j] = shr(s0, 8 * j) & six;
        mn[j] = shr(s1, 8 * j) & six;
        sc[j + 4] = (shr(s2, 8 * j) & splat(15)) | shl(shr(s0, 8 * j + 6) & two, 4);
        mn[j + 4] = (shr(s2, 8 * j + 4) & splat(15)) | shl(shr(s1, 8 * j + 6) & two, 4);
    }
    for (int j = 0; j < 8; ++j) mn[j] = mn[j] | shl(mn[j], 16);
}

// Q4_K/Q5_K: sub-block 2 * pair in lo[c] (weights 4c..4c+3 of each row), sub-block 2 * pair + 1 in hi[c].
template <bool kFive>
inline void decode_q_k_pair(const uint8_t* p, int pair, V* lo, V* hi) {
    const int qs = kFive ? 768 : 256;
    for (int c = 0; c < 8; ++c) {
        const V v = load64(p + qs + 64 * (8 * pair + c));
        lo[c] = v & kLow4;
        hi[c] = shr(v, 4) & kLow4;
        if (kFive) {
            const V h = load64(p + 256 + 64 * c);
            lo[c] = lo[c] | fifth_bit(h, 2 * pair);
            hi[c] = hi[c] | fifth_bit(h, 2 * pair + 1);
        }
    }
}

// Sum over the 8 sub-blocks j of mn_j * (sum of the activations in j), bs: the row's int16 sums of 16, read in
// pairs (the two halves of sub-block j) against mn_j in both halves of a lane.
inline V k_mins(const V* mn, const int16_t* bs) {
    V mins = zero();
    for (int j = 0; j < 8; ++j) {
        int32_t halves;
        std::memcpy(&halves, bs + 2 * j, 4);
        mins = dot_i16(mins, mn[j], splat(halves));
    }
    return mins;
}

// Q6_K: the int8 scales of the 16 sub-blocks of 16.
inline void decode_q6_k_scales(const uint8_t* p, V* sc) {
    for (int j = 0; j < 16; ++j) sc[j] = sar(shl(load64(p + 3072 + 64 * (j / 4)), 24 - 8 * (j % 4)), 24);
}

// Q6_K: the unsigned 6-bit weights 128 * half + 32 * s + 4c.. +3 of each row in w[c] (sub-blocks
// 8 * half + 2 * s (c < 4) and 8 * half + 2 * s + 1 (c >= 4)).
inline void decode_q6_k(const uint8_t* p, int half, int s, V* w) {
    const V high2 = splat(0x30303030);
    for (int c = 0; c < 8; ++c) {
        const V l = load64(p + 64 * (16 * half + 8 * (s % 2) + c));
        const V h = load64(p + 2048 + 64 * (8 * half + c));
        w[c] = (s < 2 ? l & kLow4 : shr(l, 4) & kLow4) | ((s < 2 ? shl(h, 4 - 2 * s) : shr(h, 2 * s - 4)) & high2);
    }
}

// The float step of a block (the module docstring's t_b), one rounding per operation, per lane.
inline F block_term(F dw, float dx, V s) { return (dw * fsplat(dx)) * tofloat(s); }
inline F k_term(F d, F dmin, float dx, V scaled, V mins) {
    const F x = fsplat(dx);
    return (x * d) * tofloat(scaled) - (x * dmin) * tofloat(mins);
}
inline F q6_k_term(F d, float dx, V sums) { return (fsplat(dx) * d) * tofloat(sums); }

template <int NR>
void tile_q8_0(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * 544;
        const F dw = load_f16(p);
        V w[8];
        load_q8_0(p, w);
        for (int r = 0; r < NR; ++r) {
            const int16_t* bs = a.bsum[r] + 2 * b;
            const V s = q8_0_sum(w, a.q[r] + 32 * b, bs[0] + bs[1]);
            acc[r] = acc[r] + block_term(dw, a.d[r][b], s);
        }
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

// Q4_0 (offset 8) and Q5_0 (offset 16): unsigned weights q, w = d * (q - offset).
template <int NR, bool kFive>
void tile_q_0(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    const int64_t block_bytes = kFive ? 352 : 288;
    const int32_t offset = kFive ? 16 : 8;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * block_bytes;
        const F dw = load_f16(p);
        V lo[4], hi[4];
        decode_q_0<kFive>(p, lo, hi);
        for (int r = 0; r < NR; ++r) {
            const int8_t* q = a.q[r] + 32 * b;
            const int16_t* bs = a.bsum[r] + 2 * b;
            V s = zero();
            for (int c = 0; c < 4; ++c) {
                s = dot_u8(s, lo[c], x4(q + 4 * c));
                s = dot_u8(s, hi[c], x4(q + 16 + 4 * c));
            }
            s = s - splat(offset * (bs[0] + bs[1]));
            acc[r] = acc[r] + block_term(dw, a.d[r][b], s);
        }
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

// Q4_K and Q5_K: w = d * sc_j * q - dmin * m_j over sub-blocks j of 32 weights.
template <int NR, bool kFive>
void tile_q_k(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    const int64_t block_bytes = kFive ? 2816 : 2304;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * block_bytes;
        const F d = load_f16(p), dmin = load_f16(p + 32);
        V sc[8], mn[8];
        decode_k_scales(p, sc, mn);
        V scaled[NR];
        for (int r = 0; r < NR; ++r) scaled[r] = zero();
        for (int pair = 0; pair < 4; ++pair) {
            V lo[8], hi[8];
            decode_q_k_pair<kFive>(p, pair, lo, hi);
            for (int r = 0; r < NR; ++r) {
                const int8_t* q = a.q[r] + 256 * b + 64 * pair;
                V sum_lo = zero(), sum_hi = zero();
                for (int c = 0; c < 8; ++c) {
                    sum_lo = dot_u8(sum_lo, lo[c], x4(q + 4 * c));
                    sum_hi = dot_u8(sum_hi, hi[c], x4(q + 32 + 4 * c));
                }
                scaled[r] = scaled[r] + sc[2 * pair] * sum_lo + sc[2 * pair + 1] * sum_hi;
            }
        }
        for (int r = 0; r < NR; ++r) {
            acc[r] = acc[r] + k_term(d, dmin, a.d[r][b], scaled[r], k_mins(mn, a.bsum[r] + 16 * b));
        }
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

// Q6_K: w = d * sc_j * (q - 32) over sub-blocks j of 16 weights, sc_j int8.
template <int NR>
void tile_q6_k(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * 3360;
        const F d = load_f16(p + 3328);
        V sc[16];
        decode_q6_k_scales(p, sc);
        V sums[NR];
        for (int r = 0; r < NR; ++r) sums[r] = zero();
        for (int half = 0; half < 2; ++half) {
            for (int s = 0; s < 4; ++s) {
                V w[8];
                decode_q6_k(p, half, s, w);
                for (int r = 0; r < NR; ++r) {
                    const int8_t* q = a.q[r] + 256 * b + 128 * half + 32 * s;
                    const int16_t* bs = a.bsum[r] + 16 * b;
                    for (int u = 0; u < 2; ++u) {
                        const int j = 8 * half + 2 * s + u;
                        V dot = zero();
                        for (int c = 4 * u; c < 4 * u + 4; ++c) dot = dot_u8(dot, w[c], x4(q + 4 * c));
                        sums[r] = sums[r] + sc[j] * (dot - splat(32 * bs[j]));
                    }
                }
            }
        }
        for (int r = 0; r < NR; ++r) acc[r] = acc[r] + q6_k_term(d, a.d[r][b], sums[r]);
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

#ifdef POWER_PATH_AMX
// The AMX kernels: the same integer sums from tile products (amx.h), and the same float steps per row, for the
// rows of one chunk (up to 16) at once. Blocks of 32 weights are one product each (K = 32); a K-quant block of 256
// is two products over all its weights after each weight is multiplied by its sub-block's scale (split_total).

// The tile row of chunk row r, as the bytes of its 16 outputs in the sums of one product.
template <int NR>
inline V tile_sums(const int32_t* sums, const Chunk<NR>& a, int r) {
    return load64(reinterpret_cast<const uint8_t*>(sums + 16 * a.tile_row[r]));
}

// Q8_0, Q4_0, Q5_0 (blocks of 32 weights, one sum each): blocks in groups of 4, the products of group g + 1
// issued before the float steps of group g (sums double-buffered), so that the tile unit and the vector units
// work at once. weights(b0, count, buffer) -> where the signed weights of blocks b0.. lie, 32 per B row group.
template <int NR, typename Weights>
void amx_blocks_32(const uint8_t* t, int64_t nb, int64_t block_bytes, const Chunk<NR>& a, float* const* out,
                   Weights weights) {
    alignas(64) int32_t sums[2][4 * 256];
    alignas(64) uint8_t buffer[4 * 512];
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    const auto issue = [&](int64_t b0) {
        const int count = (int)std::min<int64_t>(4, nb - b0);
        amx::prefetch(t, block_bytes * (b0 + 8), 4 * block_bytes);  // two groups ahead (past the tile: the next)
        const auto [w, w_step] = weights(b0, count, buffer);
        amx::sums<false>(count, a.q[0] + 32 * b0, 32, a.stride, w, w_step, sums[(b0 / 4) % 2]);
    };
    issue(0);
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        if (b0 + 4 < nb) issue(b0 + 4);
        const int32_t* group = sums[(b0 / 4) % 2];
        for (int64_t b = b0; b < std::min(nb, b0 + 4); ++b) {
            const F dw = load_f16(t + block_bytes * b);
            for (int r = 0; r < NR; ++r) acc[r] = acc[r] + block_term(dw, a.d[r][b], tile_sums(group + 256 * (b - b0), a, r));
        }
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

template <int NR>
void amx_q8_0(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    amx_blocks_32(t, nb, 544, a, out, [t](int64_t b0, int, uint8_t*) { return std::pair(t + 544 * b0 + 32, 544L); });
}

template <int NR, bool kFive>
void amx_q_0(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    const int64_t block_bytes = kFive ? 352 : 288;
    amx_blocks_32(t, nb, block_bytes, a, out, [t, block_bytes](int64_t b0, int count, uint8_t* buffer) {
        for (int i = 0; i < count; ++i) {
            V lo[4], hi[4];
            decode_q_0<kFive>(t + block_bytes * (b0 + i), lo, hi);
            for (int c = 0; c < 4; ++c) {
                amx::store_signed(buffer + 512 * i + 64 * c, lo[c], kFive ? 16 : 8);
                amx::store_signed(buffer + 512 * i + 256 + 64 * c, hi[c], kFive ? 16 : 8);
            }
        }
        return std::pair<const uint8_t*, long>(buffer, 512L);
    });
}

// K-quants: each weight times its sub-block's scale is an int16 P (at most 63 * 31 for Q4_K/Q5_K, 128 * 63 for
// Q6_K) split into bytes, P = 256 * high + low, so that a block's scaled sum s = sum x P is two sums over all its
// 256 weights: s = c_low + 256 * c_high (amx::split_scaled, amx::split_sums).
template <int NR>
inline V split_total(const int32_t* c_low, const int32_t* c_high, const Chunk<NR>& a, int r) {
    return tile_sums(c_low, a, r) + shl(tile_sums(c_high, a, r), 8);
}

template <int NR, bool kFive>
void amx_q_k(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    alignas(64) uint8_t low[4096], high[4096];
    alignas(64) int32_t c_low[256], c_high[256];
    const int64_t block_bytes = kFive ? 2816 : 2304;
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * block_bytes;
        amx::prefetch(p, block_bytes, block_bytes);
        const F d = load_f16(p), dmin = load_f16(p + 32);
        V sc[8], mn[8];
        decode_k_scales(p, sc, mn);
        for (int pair = 0; pair < 4; ++pair) {
            V lo[8], hi[8];
            decode_q_k_pair<kFive>(p, pair, lo, hi);
            const amx::ByteScale<0> scale_lo(sc[2 * pair]), scale_hi(sc[2 * pair + 1]);
            for (int c = 0; c < 8; ++c) {
                const int row = 16 * pair + c;  // weights 4 * row.. of each output
                amx::split_scaled(low + 64 * row, high + 64 * row, lo[c], scale_lo);
                amx::split_scaled(low + 64 * (row + 8), high + 64 * (row + 8), hi[c], scale_hi);
            }
        }
        amx::split_sums(a.q[0] + 256 * b, a.stride, low, high, c_low, c_high);
        for (int r = 0; r < NR; ++r) {
            acc[r] = acc[r] + k_term(d, dmin, a.d[r][b], split_total(c_low, c_high, a, r), k_mins(mn, a.bsum[r] + 16 * b));
        }
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

template <int NR>
void amx_q6_k(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    alignas(64) uint8_t low[4096], high[4096];
    alignas(64) int32_t c_low[256], c_high[256];
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * 3360;
        amx::prefetch(p, 3360, 3360);
        const F d = load_f16(p + 3328);
        V sc[16];
        decode_q6_k_scales(p, sc);
        for (int half = 0; half < 2; ++half) {
            for (int s = 0; s < 4; ++s) {
                V w[8];
                decode_q6_k(p, half, s, w);
                const int j = 8 * half + 2 * s;
                const amx::ByteScale<32> first(sc[j]), second(sc[j + 1]);
                for (int c = 0; c < 8; ++c) {
                    const int row = 32 * half + 8 * s + c;  // weights 4 * row.. of each output
                    amx::split_scaled(low + 64 * row, high + 64 * row, w[c], c < 4 ? first : second);
                }
            }
        }
        amx::split_sums(a.q[0] + 256 * b, a.stride, low, high, c_low, c_high);
        for (int r = 0; r < NR; ++r) acc[r] = acc[r] + q6_k_term(d, a.d[r][b], split_total(c_low, c_high, a, r));
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}
#endif

// F32/F16/BF16: acc += w_k * x_k for k = 0, 1, ..., in - 1.
template <int NR, F (*kLoad)(const uint8_t*), int kSize>
void tile_float(const uint8_t* t, int64_t in, const Chunk<NR>& a, float* const* out) {
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    for (int64_t k = 0; k < in; ++k) {
        const F w = kLoad(t + k * 16 * kSize);
        for (int r = 0; r < NR; ++r) acc[r] = acc[r] + w * fsplat(a.x[r][k]);
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

template <int NR>
using Tile = void (*)(const uint8_t*, int64_t, const Chunk<NR>&, float* const*);

template <int NR>
Tile<NR> tile_of(int64_t kind) {
    switch (kind) {
        case Q8_0: return tile_q8_0<NR>;
        case Q4_0: return tile_q_0<NR, false>;
        case Q5_0: return tile_q_0<NR, true>;
        case Q4_K: return tile_q_k<NR, false>;
        case Q5_K: return tile_q_k<NR, true>;
        case Q6_K: return tile_q6_k<NR>;
        case F32: return tile_float<NR, load_f32, 4>;
        case F16: return tile_float<NR, load_f16, 2>;
        default: return tile_float<NR, load_bf16, 2>;
    }
}

struct KindInfo {
    int64_t block;      // weights per block
    int64_t type_size;  // bytes per block and output row
    int64_t act_block;  // activation quantisation block (0: float activations)
};

KindInfo kind_info(int64_t kind) {
    switch (kind) {
        case Q8_0: return {32, 34, 32};
        case Q4_0: return {32, 18, 32};
        case Q5_0: return {32, 22, 32};
        case Q4_K: return {256, 144, 256};
        case Q5_K: return {256, 176, 256};
        case Q6_K: return {256, 210, 256};
        case F32: return {1, 4, 0};
        case F16: case BF16: return {1, 2, 0};
        default: TORCH_CHECK(false, "unknown matrix kind ", kind);
    }
}

// What every chunk of a call reads: the matrix's tiles to compute, the activations (quantised: act = q, d,
// bsum of quantize_rows; float: x) and the sizes.
struct Call {
    const uint8_t* base;
    const int64_t* tiles;
    int64_t tile_bytes;
    int64_t steps;  // blocks a row (quantised) or input features (float)
    const std::vector<at::Tensor>& act;
    const float* x;
    int64_t in;
    int64_t n;
};

// Rows [r0, r0 + NR) of the call (repeating row n - 1 past the end) through the tiles [first, last) of the
// group; results into local[r] at 16 * (tile - first).
template <int NR>
void run_chunk(Tile<NR> tile, const Call& call, int64_t first, int64_t last, int64_t r0,
               float (*local)[kGroupTiles * 16]) {
    Chunk<NR> chunk;
    chunk.stride = call.in;
    for (int r = 0; r < NR; ++r) {
        const int64_t row = std::min(r0 + r, call.n - 1);
        chunk.x[r] = call.x + row * call.in;
        chunk.tile_row[r] = (int)(row - r0);
        if (!call.act.empty()) {
            chunk.q[r] = call.act[0].data_ptr<int8_t>() + row * call.in;
            chunk.d[r] = call.act[1].data_ptr<float>() + row * call.act[1].size(1);
            chunk.bsum[r] = call.act[2].data_ptr<int16_t>() + row * (call.in / 16);
        }
    }
    for (int64_t i = first; i < last; ++i) {
        float* out[NR];
        for (int r = 0; r < NR; ++r) out[r] = local[r] + (i - first) * 16;
        tile(call.base + call.tiles[i] * call.tile_bytes, call.steps, chunk, out);
    }
}

#ifdef POWER_PATH_AMX
// The fewest rows of a call from which a kind's tile kernel is at least as fast as its VNNI kernel (measured in
// docs/kernels.md). Below, the work that does not grow with the rows dominates, and it is larger for the tiles:
// the decoded weights and the sums pass through memory, and a tile product costs as much for 1 row as for 16.
int64_t tiles_from_rows(int64_t kind) {
    switch (kind) {
        case Q8_0: return 3;
        case Q4_0: case Q5_0: case Q6_K: return 5;
        case Q4_K: case Q5_K: return 8;
        default: return INT64_MAX;  // float matrices: no tile kernel
    }
}

// The least weight bytes times rows of a call that takes the tiles: the tile unit, idle for more than about a
// microsecond, takes up to ~3 us to resume, which a small matrix (Gemma 3's 256 x 640 ones) does not win back
// below ~10 rows.
constexpr int64_t kTilesFromWork = 3 << 19;  // 1.5 MiB

constexpr int64_t kLocalRows = amx::kMaxRows;

bool takes_amx(int64_t kind, int64_t n, int64_t weight_bytes) {
    return n >= tiles_from_rows(kind) && n * weight_bytes >= kTilesFromWork;
}

template <int NR>
Tile<NR> amx_tile_of(int64_t kind) {
    switch (kind) {
        case Q8_0: return amx_q8_0<NR>;
        case Q4_0: return amx_q_0<NR, false>;
        case Q5_0: return amx_q_0<NR, true>;
        case Q4_K: return amx_q_k<NR, false>;
        case Q5_K: return amx_q_k<NR, true>;
        default: return amx_q6_k<NR>;
    }
}
#else
constexpr int64_t kLocalRows = kChunkRows;

bool takes_amx(int64_t, int64_t, int64_t) { return false; }
#endif

// `rows` rows from r0: on AMX, all of them (at most 16) in one chunk of 4, 8, 12 or 16 rows; without, in
// chunks of 4, then 2 or 1.
void run_rows(int64_t kind, [[maybe_unused]] bool on_amx, const Call& call, int64_t first, int64_t last, int64_t r0,
              int64_t rows, float (*local)[kGroupTiles * 16]) {
#ifdef POWER_PATH_AMX
    if (on_amx) {
        switch ((rows + 3) / 4) {
            case 1: run_chunk<4>(amx_tile_of<4>(kind), call, first, last, r0, local); return;
            case 2: run_chunk<8>(amx_tile_of<8>(kind), call, first, last, r0, local); return;
            case 3: run_chunk<12>(amx_tile_of<12>(kind), call, first, last, r0, local); return;
            default: run_chunk<16>(amx_tile_of<16>(kind), call, first, last, r0, local); return;
        }
    }
#endif
    for (int64_t done = 0; done < rows; done += kChunkRows) {
        const int64_t left = rows - done;
        float (*at)[kGroupTiles * 16] = local + done;
        if (left >= 3) {
            run_chunk<4>(tile_of<4>(kind), call, first, last, r0 + done, at);
        } else if (left == 2) {
            run_chunk<2>(tile_of<2>(kind), call, first, last, r0 + done, at);
        } else {
            run_chunk<1>(tile_of<1>(kind), call, first, last, r0 + done, at);
        }
    }
}

}  // namespace

namespace {

constexpr int64_t kQuantizeGrain = 1 << 14;  // activations a chunk of rows quantises: a few microseconds

// One block of `block` activations (a multiple of 16) -> int8 levels q and their scale d.
void quantize_block(const float* x, int64_t block, int8_t* q, float* d) {
    // The largest |x| through 16 running maxima, lane l taking every 16th value, so that the compiler keeps them
    // in one vector register (the largest of a set is the same in any order; a NaN is passed over, as by one chain).
    float lane_max[16] = {};
    for (int64_t k0 = 0; k0 < block; k0 += 16) {
        for (int l = 0; l < 16; ++l) {
            const float a = std::fabs(x[k0 + l]);
            lane_max[l] = lane_max[l] < a ? a : lane_max[l];
        }
    }
    float amax = 0.0f;
    for (const float m : lane_max) amax = std::max(amax, m);
    const float scale = amax / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    *d = scale;
    for (int64_t k = 0; k < block; ++k) {
        const float v = std::nearbyint(x[k] * inverse);
        q[k] = (int8_t)std::min(127.0f, std::max(-127.0f, v));
    }
}

}  // namespace

std::vector<at::Tensor> power_quant::quantize_rows(at::Tensor x, int64_t block) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float32 [n, in]");
    const int64_t n = x.size(0), in = x.size(1);
    TORCH_CHECK(block % 16 == 0, "activation blocks of ", block, " are not a multiple of 16");
    TORCH_CHECK(in % block == 0, "row length ", in, " is not a multiple of ", block);
    auto q = at::empty({n, in}, at::kChar);
    auto d = at::empty({n, in / block}, at::kFloat);
    auto bsum = at::empty({n, in / 16}, at::kShort);
    const float* xp = x.data_ptr<float>();
    int8_t* qp = q.data_ptr<int8_t>();
    float* dp = d.data_ptr<float>();
    int16_t* bp = bsum.data_ptr<int16_t>();
    power_pool::parallel_for(n, std::max<int64_t>(1, kQuantizeGrain / in), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin * in; i < end * in; i += block) quantize_block(xp + i, block, qp + i, dp + i / block);
        for (int64_t i = begin * in; i < end * in; i += 16) {
            int32_t s = 0;
            for (int k = 0; k < 16; ++k) s += qp[i + k];
            bp[i / 16] = (int16_t)s;
        }
    });
    return {q, d, bsum};
}

// packed: the tile layout of one matrix; tiles: int64 indices of the 16-row tiles to compute.
// Returns [n, len(tiles) * 16] float32: column 16 * i + j is output row 16 * tiles[i] + j.
at::Tensor matmul(int64_t kind, at::Tensor packed, int64_t in, at::Tensor x, at::Tensor tiles) {
    const KindInfo info = kind_info(kind);
    TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed: contiguous uint8");
    TORCH_CHECK(x.dim() == 2 && x.size(1) == in && x.scalar_type() == at::kFloat && x.is_contiguous(),
                "x: contiguous float32 [n, ", in, "]");
    TORCH_CHECK(tiles.scalar_type() == at::kLong && tiles.dim() == 1, "tiles: int64 [t]");
    const int64_t n = x.size(0), nt = tiles.size(0), nb = in / info.block;
    const int64_t tile_bytes = nb * 16 * info.type_size;
    const int64_t* tp = tiles.data_ptr<int64_t>();
    const int64_t n_tiles = packed.numel() / tile_bytes;
    for (int64_t i = 0; i < nt; ++i) TORCH_CHECK(tp[i] >= 0 && tp[i] < n_tiles, "tile ", tp[i], " out of range");
    std::vector<at::Tensor> act;
    if (info.act_block) act = power_quant::quantize_rows(x, info.act_block);
    auto out = at::empty({n, nt * 16}, at::kFloat);
    const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 16) / std::max<int64_t>(1, tile_bytes));
    const bool on_amx = takes_amx(kind, n, nt * tile_bytes);
#ifdef POWER_PATH_AMX
    TORCH_CHECK(!on_amx || amx::permitted(), "the amx CPU kernels: Linux has not granted this process AMX tile data; "
                "load them through power.kernels.cpu, which asks for it (arch_prctl ARCH_REQ_XCOMP_PERM)");
#endif
    const Call call{packed.data_ptr<uint8_t>(), tp, tile_bytes, info.act_block ? nb : in, act, x.data_ptr<float>(), in, n};
    float* op = out.data_ptr<float>();
    power_pool::parallel_for(nt, grain, [&](int64_t begin, int64_t end) {
        // A group's results go to a local block first: rows of the output lie 4 * out bytes apart, and storing
        // the rows of one tile straight there would put every store in the same cache set.
        float local[kLocalRows][kGroupTiles * 16];
#ifdef POWER_PATH_AMX
        int64_t configured = 0;  // the rows this thread's AMX tiles are set up for
#endif
        for (int64_t first = begin; first < end; first += kGroupTiles) {
            const int64_t last = std::min(end, first + kGroupTiles);
            for (int64_t r0 = 0; r0 < n; r0 += kLocalRows) {
                const int64_t rows = std::min<int64_t>(kLocalRows, n - r0);
#ifdef POWER_PATH_AMX
                if (on_amx && rows != configured) amx::configure((int)rows, info.block == 256 ? 64 : 32);
                configured = rows;
#endif
                run_rows(kind, on_amx, call, first, last, r0, rows, local);
                for (int64_t r = 0; r < rows; ++r) {
                    std::memcpy(op + (r0 + r) * nt * 16 + first * 16, local[r], (last - first) * 16 * sizeof(float));
                }
            }
        }
#ifdef POWER_PATH_AMX
        if (on_amx) amx::release();
#endif
    });
    return out;
}

namespace {

// Q5_0's fifth bits as the tile layout permutes them (power/kernels/cpu/layout.py `_q5_0_high_bits`: bit 8i + c holds
// weight 4c + i's, bit 8i + 4 + c weight 16 + 4c + i's) -> the file's order (bit k: weight k).
uint32_t q5_0_file_high_bits(uint32_t tiled) {
    uint32_t bits = 0;
    for (uint32_t i = 0; i < 4; ++i) {
        for (uint32_t c = 0; c < 4; ++c) {
            bits |= ((tiled >> (8 * i + c)) & 1u) << (4 * c + i);
            bits |= ((tiled >> (8 * i + 4 + c)) & 1u) << (16 + 4 * c + i);
        }
    }
    return bits;
}

// One GGUF block in the file's byte order -> its weights, with exactly the float32 operations of
// power/kernels/dequant.py's references (one rounding each, no FMA): w = d * q, (d * sc) * q - (dmin * mn), ...
void dequant_block(int64_t kind, const uint8_t* b, float* w) {
    switch (kind) {
        case Q8_0: {
            const float d = half_to_float(u16_at(b, 0));
            for (int e = 0; e < 32; ++e) w[e] = d * (float)(int8_t)b[2 + e];
            return;
        }
        case Q4_0: case Q5_0: {
            const float d = half_to_float(u16_at(b, 0));
            const bool five = kind == Q5_0;
            uint32_t high = 0;
            if (five) {
                std::memcpy(&high, b + 2, 4);
                high = q5_0_file_high_bits(high);
            }
            const uint8_t* qs = b + (five ? 6 : 2);
            for (int e = 0; e < 32; ++e) {
                const int32_t nibble = (qs[e % 16] >> (4 * (e / 16))) & 0x0F;
                const int32_t q = five ? (nibble | (int32_t)((high >> e) & 1u) << 4) - 16 : nibble - 8;
                w[e] = d * (float)q;
            }
            return;
        }
        case Q4_K: case Q5_K: {
            const float d = half_to_float(u16_at(b, 0)), dmin = half_to_float(u16_at(b, 1));
            const uint8_t* sm = b + 4;
            const bool five = kind == Q5_K;
            const uint8_t* qs = b + (five ? 48 : 16);
            for (int j = 0; j < 8; ++j) {
                const int sc = j < 4 ? sm[j] & 0x3F : (sm[j + 4] & 0x0F) | ((sm[j - 4] >> 2) & 0x30);
                const int mn = j < 4 ? sm[j + 4] & 0x3F : (sm[j + 4] >> 4) | ((sm[j] >> 2) & 0x30);
                const float scale = d * (float)sc, offset = dmin * (float)mn;
                for (int i = 0; i < 32; ++i) {
                    int32_t q = (qs[32 * (j / 2) + i] >> (4 * (j % 2))) & 0x0F;
                    if (five) q |= ((b[16 + i] >> j) & 1) << 4;
                    w[32 * j + i] = scale * (float)q - offset;
                }
            }
            return;
        }
        case Q6_K: {
            const float d = half_to_float(u16_at(b, 104));
            for (int e = 0; e < 256; ++e) {
                const int h = e / 128, r = e % 128;
                const int32_t low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
                const int32_t high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
                const float scale = d * (float)(int8_t)b[192 + e / 16];
                w[e] = scale * (float)((low | high << 4) - 32);
            }
            return;
        }
        case F32: w[0] = f32_at(b, 0); return;
        case F16: w[0] = half_to_float(u16_at(b, 0)); return;
        default: w[0] = bf16_to_float(u16_at(b, 0)); return;
    }
}

}  // namespace

// Output rows `rows` (int64 [k]) of the matrix in the tile layout, dequantised -> float32 [k, in]: the same bits as
// power.kernels.dequant's reference on the file's rows. lane_bytes int64 [16, type_size]: where, among a tile's
// 16 * type_size bytes of one block, lane l's block bytes lie, in the file's order (power/kernels/cpu/layout.py).
at::Tensor rows(int64_t kind, at::Tensor packed, int64_t in, at::Tensor rows, at::Tensor lane_bytes) {
    const KindInfo info = kind_info(kind);
    TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed: contiguous uint8");
    TORCH_CHECK(rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.is_contiguous(), "rows: int64 [k]");
    TORCH_CHECK(lane_bytes.scalar_type() == at::kLong && lane_bytes.is_contiguous() && lane_bytes.dim() == 2 &&
                lane_bytes.size(0) == 16 && lane_bytes.size(1) == info.type_size, "lane_bytes: int64 [16, ", info.type_size, "]");
    TORCH_CHECK(in % info.block == 0, "row length ", in, " is not a multiple of ", info.block);
    const int64_t k = rows.size(0), nb = in / info.block, tile_bytes = nb * 16 * info.type_size;
    const int64_t n_rows = packed.numel() / tile_bytes * 16;
    const int64_t* rp = rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < k; ++i) TORCH_CHECK(rp[i] >= 0 && rp[i] < n_rows, "row ", rp[i], " out of range");
    auto out = at::empty({k, in}, at::kFloat);
    float* op = out.data_ptr<float>();
    const uint8_t* base = packed.data_ptr<uint8_t>();
    const int64_t* lanes = lane_bytes.data_ptr<int64_t>();
    power_pool::parallel_for(k, 16, [&](int64_t begin, int64_t end) {
        uint8_t block[256];
        for (int64_t i = begin; i < end; ++i) {
            const uint8_t* tile = base + rp[i] / 16 * tile_bytes;
            const int64_t* lane = lanes + rp[i] % 16 * info.type_size;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* group = tile + b * 16 * info.type_size;
                for (int64_t j = 0; j < info.type_size; ++j) block[j] = group[lane[j]];
                dequant_block(kind, block, op + i * in + b * info.block);
            }
        }
    });
    return out;
}

// Registered as torch.ops.<POWER_OPS>.matmul and .rows, one namespace per path's build, with a CPU kernel (the shape
// function for torch.compile is registered from Python, power/kernels/cpu/build.py).
#define POWER_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define POWER_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
POWER_LIBRARY(POWER_OPS, m) {
    m.def("matmul(int kind, Tensor packed, int in_features, Tensor x, Tensor tiles) -> Tensor");
    m.def("rows(int kind, Tensor packed, int in_features, Tensor rows, Tensor lane_bytes) -> Tensor");
}
POWER_LIBRARY_IMPL(POWER_OPS, CPU, m) {
    m.impl("matmul", &matmul);
    m.impl("rows", &rows);
}
