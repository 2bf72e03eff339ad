// AMX (Intel Advanced Matrix Extensions) for the exact integer sums of the quantised kernels, in the amx build
// (POWER_PATH_AMX). One tile product multiplies up to 16 activation rows (A: int8, K bytes a row) by K weights of
// the 16 output rows of a layout tile (B: K / 4 rows of 64 bytes, 4 consecutive weights of each output row, which
// is the layout's own interleaving) into C[row][output] int32: the sums 16 x K / 4 VNNI dot products give.
// Tiles: tmm0-3 hold sums, tmm4-5 activations, tmm6-7 weights, so that four products are in flight.
#pragma once
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace amx {

constexpr int kMaxRows = 16;  // activation rows of one tile product

// Linux lets a process use tile data only after it asked (arch_prctl ARCH_REQ_XCOMP_PERM, which
// power/kernels/cpu/build.py does before it lets this path run); a tile instruction without it is a SIGILL.
inline bool permitted() {
    static const bool granted = [] {
        constexpr int kGetPermission = 0x1022;  // ARCH_GET_XCOMP_PERM
        constexpr int kTileData = 18;           // XFEATURE_XTILEDATA
        uint64_t features = 0;
        return syscall(SYS_arch_prctl, kGetPermission, &features) == 0 && ((features >> kTileData) & 1);
    }();
    return granted;
}

struct alignas(64) Config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

// This thread's tiles for products of `rows` activation rows with sub-blocks of k weights (16 or 32).
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

// Bytes of v minus `offset` (the signed weights of Q4_0, Q5_0 and Q6_K), stored at p.
inline void store_signed(uint8_t* p, V v, int8_t offset) {
    _mm512_storeu_si512(p, _mm512_sub_epi8(v.v, _mm512_set1_epi8(offset)));
}

inline void store_bytes(uint8_t* p, V v) { _mm512_storeu_si512(p, v.v); }

}  // namespace amx
