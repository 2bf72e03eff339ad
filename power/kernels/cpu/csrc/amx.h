// AMX (Intel Advanced Matrix Extensions) for the exact integer sums of the quantised kernels, in the amx build
// (POWER_PATH_AMX). One tile product multiplies up to 16 activation rows (A: int8, K bytes a row) by K weights of
// the 16 output rows of a layout tile (B: K / 4 rows of 64 bytes, 4 consecutive weights of each output row, which
// is the layout's own interleaving) into C[row][output] int32: the sums 16 x K / 4 VNNI dot products give.
// Tiles: tmm0-3 hold sums, tmm4-5 activations, tmm6-7 weights, so that four products are in flight (K-quant
// blocks: tmm0-1 the low and high byte sums, tmm4 the activations, tmm6-7 the low and high bytes).
#pragma once
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace amx {

constexpr int kMaxRows = 16;  // activation rows of one tile product

// Linux lets a process use tile data only after it asked (arch_prctl ARCH_REQ_XCOMP_PERM, which
// power/kernels/cpu/build.py does before it lets this path run); a tile instruction without it is a SIGILL.
// Asked again until granted, then remembered.
inline bool permitted() {
    static std::atomic<bool> granted{false};
    if (granted.load(std::memory_order_relaxed)) return true;
    constexpr int kGetPermission = 0x1022;  // ARCH_GET_XCOMP_PERM
    constexpr int kTileData = 18;           // XFEATURE_XTILEDATA
    uint64_t features = 0;
    const bool now = syscall(SYS_arch_prctl, kGetPermission, &features) == 0 && ((features >> kTileData) & 1);
    if (now) granted.store(true, std::memory_order_relaxed);
    return now;
}

struct alignas(64) Config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

// This thread's tiles for products of `rows` activation rows with k weights (32: a block of Q8_0, Q4_0, Q5_0;
// 64: a quarter of a K-quant block).
inline void configure(int rows, int k) {
    Config config{};
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
        config.rows[t] = t < 6 ? rows : k / 4;
        config.bytes_per_row[t] = t >= 4 && t < 6 ? k : 64;
    }
    _tile_loadconfig(&config);
}

inline void release() { _tile_release(); }

// Every tile instruction names its memory ("memory" clobber): the weights a kernel has just stored for a product
// must be in memory before the tile load, and the sums read after the tile store.
#define POWER_TILE_PRODUCT(op, sum, act, wt)                                                                  \
    asm volatile("tilezero %%tmm" #sum "\n\ttileloadd (%0,%1,1), %%tmm" #act "\n\ttileloadd (%2,%3,1), %%tmm" #wt \
                 "\n\t" #op " %%tmm" #wt ", %%tmm" #act ", %%tmm" #sum                                          \
                 :: "r"(x), "r"(stride), "r"(w), "r"(64L) : "memory")
#define POWER_TILE_STORE(sum) asm volatile("tilestored %%tmm" #sum ", (%0,%1,1)" :: "r"(c), "r"(64L) : "memory")

// Into tile `slot` (0-3): sum over k of x[row * stride + k] * w (K bytes of activations a row; weights signed
// int8, or unsigned where kUnsignedWeights).
template <bool kUnsignedWeights>
inline void product(int slot, const int8_t* x, int64_t stride, const uint8_t* w) {
    if constexpr (kUnsignedWeights) {
        switch (slot) {
            case 0: POWER_TILE_PRODUCT(tdpbsud, 0, 4, 6); break;
            case 1: POWER_TILE_PRODUCT(tdpbsud, 1, 5, 7); break;
            case 2: POWER_TILE_PRODUCT(tdpbsud, 2, 4, 6); break;
            default: POWER_TILE_PRODUCT(tdpbsud, 3, 5, 7); break;
        }
    } else {
        switch (slot) {
            case 0: POWER_TILE_PRODUCT(tdpbssd, 0, 4, 6); break;
            case 1: POWER_TILE_PRODUCT(tdpbssd, 1, 5, 7); break;
            case 2: POWER_TILE_PRODUCT(tdpbssd, 2, 4, 6); break;
            default: POWER_TILE_PRODUCT(tdpbssd, 3, 5, 7); break;
        }
    }
}

// Tile `slot`'s sums to c: row r's 16 outputs at c + 16 * r.
inline void store(int slot, int32_t* c) {
    switch (slot) {
        case 0: POWER_TILE_STORE(0); break;
        case 1: POWER_TILE_STORE(1); break;
        case 2: POWER_TILE_STORE(2); break;
        default: POWER_TILE_STORE(3); break;
    }
}

#undef POWER_TILE_PRODUCT
#undef POWER_TILE_STORE

// For j < count: the sums of activations x + j * x_step (K bytes a row, rows `stride` apart) with the weights
// w + j * w_step, into c + 256 * j ([16 rows][16 outputs] int32), four products at a time.
template <bool kUnsignedWeights>
inline void sums(int count, const int8_t* x, int64_t x_step, int64_t stride, const uint8_t* w, int64_t w_step,
                 int32_t* c) {
    for (int first = 0; first < count; first += 4) {
        const int last = std::min(count, first + 4);
        for (int j = first; j < last; ++j) product<kUnsignedWeights>(j - first, x + j * x_step, stride, w + j * w_step);
        for (int j = first; j < last; ++j) store(j - first, c + 256 * j);
    }
}

// One K-quant block of 256 weights whose products with their sub-block scales are split in bytes (low: unsigned,
// high: signed; see split_scaled): into c_low and c_high, the sums of x (rows `stride` apart) times the low bytes
// and times the high bytes, in four products of 64 weights each.
inline void split_sums(const int8_t* x, int64_t stride, const uint8_t* low, const uint8_t* high, int32_t* c_low,
                       int32_t* c_high) {
    asm volatile("tilezero %%tmm0\n\ttilezero %%tmm1" ::: "memory");
    for (int c = 0; c < 4; ++c) {
        asm volatile("tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%2,%4,1), %%tmm6\n\ttileloadd (%3,%4,1), %%tmm7\n\t"
                     "tdpbsud %%tmm6, %%tmm4, %%tmm0\n\ttdpbssd %%tmm7, %%tmm4, %%tmm1"
                     :: "r"(x + 64 * c), "r"(stride), "r"(low + 1024 * c), "r"(high + 1024 * c), "r"(64L) : "memory");
    }
    asm volatile("tilestored %%tmm0, (%0,%2,1)\n\ttilestored %%tmm1, (%1,%2,1)" :: "r"(c_low), "r"(c_high), "r"(64L)
                 : "memory");
}

// A sub-block's scale (int32 lanes, |sc| <= 128) as maddubs operands, in the even bytes and in the odd bytes,
// and kOffset * sc in both int16 halves (Q6_K's weights are u - 32; Q4_K/Q5_K's have no offset).
template <int kOffset>
struct ByteScale {
    static_assert(kOffset == 0 || kOffset == 32);
    __m512i even, odd, offset;

    explicit ByteScale(V sc) {
        const __m512i byte = _mm512_and_si512(sc.v, _mm512_set1_epi32(0xFF));
        even = _mm512_or_si512(byte, _mm512_maskz_slli_epi32(kEveryLane, byte, 16));
        odd = _mm512_maskz_slli_epi32(kEveryLane, even, 8);
        const __m512i sc32 =
            _mm512_and_si512(_mm512_maskz_slli_epi32(kEveryLane, sc.v, 5), _mm512_set1_epi32(0xFFFF));
        offset = _mm512_or_si512(sc32, _mm512_maskz_slli_epi32(kEveryLane, sc32, 16));
    }

    __m512i times(__m512i u, __m512i operand) const {
        const __m512i product = _mm512_maddubs_epi16(u, operand);
        return kOffset ? _mm512_sub_epi16(product, offset) : product;
    }
};

// The weights u of v (unsigned bytes <= 63) times their scale, minus the scale's offset: int16 products
// P = sc * (u - offset), |P| <= 128 * 63, exact; P = 256 * high + low with low in [0, 255] and high signed, the low
// bytes stored at low and the high bytes at high (sum x P = sum x low + 256 * sum x high).
template <int kOffset>
inline void split_scaled(uint8_t* low, uint8_t* high, V v, const ByteScale<kOffset>& scale) {
    const __m512i even = scale.times(v.v, scale.even), odd = scale.times(v.v, scale.odd);
    const __m512i low_byte = _mm512_set1_epi16(0x00FF);
    _mm512_storeu_si512(low, _mm512_or_si512(_mm512_and_si512(even, low_byte), _mm512_slli_epi16(odd, 8)));
    const __m512i odd_high = _mm512_maskz_andnot_epi32(kEveryLane, low_byte, odd);
    _mm512_storeu_si512(high, _mm512_or_si512(_mm512_srli_epi16(even, 8), odd_high));
}

// Asks for the n bytes `ahead` bytes past p in cache before their tile loads, which (unlike vector loads) the
// hardware's prefetchers do not run ahead of. Past the matrix's end they are a hint to nothing: a prefetch
// never faults.
inline void prefetch(const uint8_t* p, int64_t ahead, int64_t n) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(p) + ahead;
    for (int64_t i = 0; i < n; i += 64) _mm_prefetch(reinterpret_cast<const char*>(first + i), _MM_HINT_T0);
}

// Bytes of v minus `offset` (the signed weights of Q4_0 and Q5_0), stored at p.
inline void store_signed(uint8_t* p, V v, int8_t offset) {
    _mm512_storeu_si512(p, _mm512_sub_epi8(v.v, _mm512_set1_epi8(offset)));
}

}  // namespace amx
