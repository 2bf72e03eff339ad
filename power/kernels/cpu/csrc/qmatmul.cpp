// Row-count-invariant products of float32 rows with GGUF matrices kept in their blocks (power/kernels/cpu/__init__.py
// defines the arithmetic; power/kernels/cpu/layout.py the tile layout these kernels read). One build per instruction
// path (simd.h); compiled with -ffp-contract=off so that every path rounds exactly as the torch reference does.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "simd.h"

namespace {

// Rows computed per pass over a tile, their accumulators in registers: 4, or 2 or 1 for the last rows of a call
// (3 rows run as 4 with one repeated). More rows take more passes, each reading the tile again from cache.
constexpr int kChunkRows = 4;
constexpr int64_t kGroupTiles = 32;  // tiles whose results are gathered before they are written out
enum Kind { Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16 };

// NR activation rows, each through its own pointers (a row may repeat to fill a chunk; its result is then
// computed twice and kept once). Quantised: q int8 [in], d float32 [in / block], bsum int32 [in / 16] (sums
// of q); float matrices read x float32 [in].
template <int NR>
struct Chunk {
    const int8_t* q[NR];
    const float* d[NR];
    const int32_t* bsum[NR];
    const float* x[NR];
};

inline V x4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return splat(v);
}

const V kLow4 = splat(0x0F0F0F0F);
const V kBit4 = splat(0x10101010);

// Bit `bit` of every byte of h, moved to bit 4 (the fifth bit of a Q5 weight).
inline V fifth_bit(V h, int bit) { return (bit <= 4 ? shl(h, 4 - bit) : shr(h, bit - 4)) & kBit4; }

template <int NR>
void tile_q8_0(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * 544;
        const F dw = load_f16(p);
        V w[8];
#ifdef POWER_SIGNED_Q8
        for (int g = 0; g < 8; ++g) w[g] = load64(p + 32 + 64 * g);
#else
        for (int g = 0; g < 8; ++g) w[g] = load64(p + 32 + 64 * g) ^ splat((int32_t)0x80808080);
#endif
        for (int r = 0; r < NR; ++r) {
            const int8_t* q = a.q[r] + 32 * b;
            V s = zero();
#ifdef POWER_SIGNED_Q8
            for (int g = 0; g < 8; ++g) s = dot_s8(s, w[g], x4(q + 4 * g));
#else
            for (int g = 0; g < 8; ++g) s = dot_u8(s, w[g], x4(q + 4 * g));
            const int32_t* bs = a.bsum[r] + 2 * b;
            s = s - splat(128 * (bs[0] + bs[1]));
#endif
            acc[r] = acc[r] + (dw * fsplat(a.d[r][b])) * tofloat(s);
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
    const int qs = kFive ? 96 : 32;
    const int32_t offset = kFive ? 16 : 8;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * block_bytes;
        const F dw = load_f16(p);
        V lo[4], hi[4];
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
        for (int r = 0; r < NR; ++r) {
            const int8_t* q = a.q[r] + 32 * b;
            const int32_t* bs = a.bsum[r] + 2 * b;
            V s = zero();
            for (int c = 0; c < 4; ++c) {
                s = dot_u8(s, lo[c], x4(q + 4 * c));
                s = dot_u8(s, hi[c], x4(q + 16 + 4 * c));
            }
            s = s - splat(offset * (bs[0] + bs[1]));
            acc[r] = acc[r] + (dw * fsplat(a.d[r][b])) * tofloat(s);
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
    const int qs = kFive ? 768 : 256;
    const V six = splat(63), two = splat(3);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * block_bytes;
        const F d = load_f16(p), dmin = load_f16(p + 32);
        const V s0 = load64(p + 64), s1 = load64(p + 128), s2 = load64(p + 192);
        V sc[8], mn[8];
        for (int j = 0; j < 4; ++j) {
            sc[j] = shr(s0, 8 * j) & six;
            mn[j] = shr(s1, 8 * j) & six;
            sc[j + 4] = (shr(s2, 8 * j) & splat(15)) | shl(shr(s0, 8 * j + 6) & two, 4);
            mn[j + 4] = (shr(s2, 8 * j + 4) & splat(15)) | shl(shr(s1, 8 * j + 6) & two, 4);
        }
        V scaled[NR], mins[NR];
        for (int r = 0; r < NR; ++r) scaled[r] = mins[r] = zero();
        for (int pair = 0; pair < 4; ++pair) {
            V lo[8], hi[8];
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
            for (int r = 0; r < NR; ++r) {
                const int8_t* q = a.q[r] + 256 * b + 64 * pair;
                const int32_t* bs = a.bsum[r] + 16 * b + 4 * pair;
                V sum_lo = zero(), sum_hi = zero();
                for (int c = 0; c < 8; ++c) {
                    sum_lo = dot_u8(sum_lo, lo[c], x4(q + 4 * c));
                    sum_hi = dot_u8(sum_hi, hi[c], x4(q + 32 + 4 * c));
                }
                scaled[r] = scaled[r] + sc[2 * pair] * sum_lo + sc[2 * pair + 1] * sum_hi;
                mins[r] = mins[r] + mn[2 * pair] * splat(bs[0] + bs[1]) + mn[2 * pair + 1] * splat(bs[2] + bs[3]);
            }
        }
        for (int r = 0; r < NR; ++r) {
            const F dx = fsplat(a.d[r][b]);
            acc[r] = acc[r] + ((dx * d) * tofloat(scaled[r]) - (dx * dmin) * tofloat(mins[r]));
        }
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

// Q6_K: w = d * sc_j * (q - 32) over sub-blocks j of 16 weights, sc_j int8.
template <int NR>
void tile_q6_k(const uint8_t* t, int64_t nb, const Chunk<NR>& a, float* const* out) {
    F acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = fzero();
    const V high2 = splat(0x30303030);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = t + b * 3360;
        const F d = load_f16(p + 3328);
        V sc[16];
        for (int j = 0; j < 16; ++j) sc[j] = sar(shl(load64(p + 3072 + 64 * (j / 4)), 24 - 8 * (j % 4)), 24);
        V sums[NR];
        for (int r = 0; r < NR; ++r) sums[r] = zero();
        for (int half = 0; half < 2; ++half) {
            for (int s = 0; s < 4; ++s) {
                V w[8];
                for (int c = 0; c < 8; ++c) {
                    const V l = load64(p + 64 * (16 * half + 8 * (s % 2) + c));
                    const V h = load64(p + 2048 + 64 * (8 * half + c));
                    w[c] = (s < 2 ? l & kLow4 : shr(l, 4) & kLow4) | ((s < 2 ? shl(h, 4 - 2 * s) : shr(h, 2 * s - 4)) & high2);
                }
                for (int r = 0; r < NR; ++r) {
                    const int8_t* q = a.q[r] + 256 * b + 128 * half + 32 * s;
                    const int32_t* bs = a.bsum[r] + 16 * b;
                    for (int u = 0; u < 2; ++u) {
                        const int j = 8 * half + 2 * s + u;
                        V dot = zero();
                        for (int c = 4 * u; c < 4 * u + 4; ++c) dot = dot_u8(dot, w[c], x4(q + 4 * c));
                        sums[r] = sums[r] + sc[j] * (dot - splat(32 * bs[j]));
                    }
                }
            }
        }
        for (int r = 0; r < NR; ++r) acc[r] = acc[r] + (fsplat(a.d[r][b]) * d) * tofloat(sums[r]);
    }
    for (int r = 0; r < NR; ++r) store(out[r], acc[r]);
}

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

// Rows [r0, r0 + NR) of the call (repeating row n - 1 past the end) through the tiles [first, last) of the
// group; results into local[r] at 16 * (tile - first).
template <int NR>
void run_chunk(int64_t kind, const uint8_t* base, const int64_t* tiles, int64_t first, int64_t last,
               int64_t tile_bytes, int64_t steps, const std::vector<at::Tensor>& act, const float* x, int64_t in,
               int64_t n, int64_t r0, float (*local)[kGroupTiles * 16]) {
    Chunk<NR> chunk;
    for (int r = 0; r < NR; ++r) {
        const int64_t row = std::min(r0 + r, n - 1);
        chunk.x[r] = x + row * in;
        if (!act.empty()) {
            chunk.q[r] = act[0].data_ptr<int8_t>() + row * in;
            chunk.d[r] = act[1].data_ptr<float>() + row * act[1].size(1);
            chunk.bsum[r] = act[2].data_ptr<int32_t>() + row * (in / 16);
        }
    }
    const Tile<NR> tile = tile_of<NR>(kind);
    for (int64_t i = first; i < last; ++i) {
        float* out[NR];
        for (int r = 0; r < NR; ++r) out[r] = local[r] + (i - first) * 16;
        tile(base + tiles[i] * tile_bytes, steps, chunk, out);
    }
}

}  // namespace

namespace {

// x [n, in] float32 -> (q int8 [n, in], d float32 [n, in / block], bsum int32 [n, in / 16]).
std::vector<at::Tensor> quantize_rows(at::Tensor x, int64_t block) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float32 [n, in]");
    const int64_t n = x.size(0), in = x.size(1);
    TORCH_CHECK(in % block == 0 && in % 16 == 0, "row length ", in, " is not a multiple of ", block);
    auto q = at::empty({n, in}, at::kChar);
    auto d = at::empty({n, in / block}, at::kFloat);
    auto bsum = at::empty({n, in / 16}, at::kInt);
    const float* xp = x.data_ptr<float>();
    int8_t* qp = q.data_ptr<int8_t>();
    float* dp = d.data_ptr<float>();
    int32_t* bp = bsum.data_ptr<int32_t>();
    for (int64_t i = 0; i < n * in; i += block) {
        float amax = 0.0f;
        for (int64_t k = 0; k < block; ++k) amax = std::max(amax, std::fabs(xp[i + k]));
        const float scale = amax / 127.0f;
        const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        dp[i / block] = scale;
        for (int64_t k = 0; k < block; ++k) {
            const float v = std::nearbyint(xp[i + k] * inverse);
            qp[i + k] = (int8_t)std::min(127.0f, std::max(-127.0f, v));
        }
    }
    for (int64_t i = 0; i < n * in; i += 16) {
        int32_t s = 0;
        for (int k = 0; k < 16; ++k) s += qp[i + k];
        bp[i / 16] = s;
    }
    return {q, d, bsum};
}

}  // namespace

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
    if (info.act_block) act = quantize_rows(x, info.act_block);
    const float* xp = x.data_ptr<float>();
    auto out = at::empty({n, nt * 16}, at::kFloat);
    float* op = out.data_ptr<float>();
    const uint8_t* base = packed.data_ptr<uint8_t>();
    const int64_t steps = info.act_block ? nb : in;
    const int64_t grain = std::max<int64_t>(1, (int64_t)(1 << 16) / std::max<int64_t>(1, tile_bytes));
    at::parallel_for(0, nt, grain, [&](int64_t begin, int64_t end) {
        // A group's results go to a local block first: rows of the output lie 4 * out bytes apart, and storing
        // the rows of one tile straight there would put every store in the same cache set.
        float local[kChunkRows][kGroupTiles * 16];
        for (int64_t first = begin; first < end; first += kGroupTiles) {
            const int64_t last = std::min(end, first + kGroupTiles);
            for (int64_t r0 = 0; r0 < n; r0 += kChunkRows) {
                const int64_t rows = std::min<int64_t>(kChunkRows, n - r0);
                if (rows >= 3) {
                    run_chunk<4>(kind, base, tp, first, last, tile_bytes, steps, act, xp, in, n, r0, local);
                } else if (rows == 2) {
                    run_chunk<2>(kind, base, tp, first, last, tile_bytes, steps, act, xp, in, n, r0, local);
                } else {
                    run_chunk<1>(kind, base, tp, first, last, tile_bytes, steps, act, xp, in, n, r0, local);
                }
                for (int64_t r = 0; r < rows; ++r) {
                    std::memcpy(op + (r0 + r) * nt * 16 + first * 16, local[r], (last - first) * 16 * sizeof(float));
                }
            }
        }
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
    at::parallel_for(0, k, 16, [&](int64_t begin, int64_t end) {
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
