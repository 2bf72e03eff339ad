// 16-lane integer and float vectors, one per instruction path (POWER_PATH_*), with exactly the operations the
// kernels need. Lane j always belongs to output row j of a 16-row tile, so every float operation is per lane
// and the paths differ only in how many instructions a lane's arithmetic takes, never in its result.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

// One value at a time, exactly (every path's scalar code: the scalar kernels, the row dequantiser).
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    float magnitude;
    if (exponent == 0) magnitude = std::ldexp((float)mantissa, -24);
    else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
    else magnitude = std::ldexp((float)(mantissa | 0x400), (int)exponent - 25);
    uint32_t bits;
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
    std::memcpy(&magnitude, &bits, 4);
    return magnitude;
}
static inline uint16_t u16_at(const uint8_t* p, int j) { uint16_t h; std::memcpy(&h, p + 2 * j, 2); return h; }
static inline float bf16_to_float(uint16_t h) { uint32_t b = (uint32_t)h << 16; float f; std::memcpy(&f, &b, 4); return f; }
static inline float f32_at(const uint8_t* p, int j) { float f; std::memcpy(&f, p + 4 * j, 4); return f; }

// Q8_0's signed weights: where u8 x s8 products are summed without saturation (VNNI, scalar) they become w + 128
// (u8) and the kernel subtracts 128 * sum(x); AVX2's saturating int16 pair sums take the sign trick (dot_s8,
// POWER_SIGNED_Q8) instead.
#if defined(POWER_PATH_AVX512VNNI)
#include <immintrin.h>
// Every lane. The zero-masked forms of the intrinsics below, with every lane, are the same instructions as the plain
// forms, whose pass-through operand GCC 12.2 declares uninitialised and then warns about (GCC bug 105593).
constexpr __mmask16 kEveryLane = 0xFFFF;
struct V { __m512i v; };
struct F { __m512 v; };
static inline V load64(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
static inline V splat(int32_t a) { return {_mm512_set1_epi32(a)}; }
static inline V zero() { return {_mm512_setzero_si512()}; }
static inline V operator&(V a, V b) { return {_mm512_and_si512(a.v, b.v)}; }
static inline V operator|(V a, V b) { return {_mm512_or_si512(a.v, b.v)}; }
static inline V operator^(V a, V b) { return {_mm512_xor_si512(a.v, b.v)}; }
static inline V operator+(V a, V b) { return {_mm512_add_epi32(a.v, b.v)}; }
static inline V operator-(V a, V b) { return {_mm512_sub_epi32(a.v, b.v)}; }
static inline V operator*(V a, V b) { return {_mm512_mullo_epi32(a.v, b.v)}; }
static inline V shl(V a, int n) { return {_mm512_maskz_sll_epi32(kEveryLane, a.v, _mm_cvtsi32_si128(n))}; }
static inline V shr(V a, int n) { return {_mm512_maskz_srl_epi32(kEveryLane, a.v, _mm_cvtsi32_si128(n))}; }
static inline V sar(V a, int n) { return {_mm512_maskz_sra_epi32(kEveryLane, a.v, _mm_cvtsi32_si128(n))}; }
// Sum of the four products u8(w) * s8(x) of each 32-bit lane, added to acc (exact: no saturation).
static inline V dot_u8(V acc, V w, V x) { return {_mm512_dpbusd_epi32(acc.v, w.v, x.v)}; }
// Sum of the two products s16 x s16 of each 32-bit lane, added to acc (exact).
static inline V dot_i16(V acc, V a, V b) { return {_mm512_dpwssd_epi32(acc.v, a.v, b.v)}; }
static inline F tofloat(V a) { return {_mm512_maskz_cvtepi32_ps(kEveryLane, a.v)}; }
static inline F fsplat(float a) { return {_mm512_set1_ps(a)}; }
static inline F fzero() { return {_mm512_setzero_ps()}; }
static inline F operator+(F a, F b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline F operator-(F a, F b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline F operator*(F a, F b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline F load_f16(const uint8_t* p) {
    return {_mm512_maskz_cvtph_ps(kEveryLane, _mm256_loadu_si256((const __m256i*)p))};
}
static inline F load_bf16(const uint8_t* p) {
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(kEveryLane, _mm256_loadu_si256((const __m256i*)p));
    return {_mm512_castsi512_ps(_mm512_maskz_slli_epi32(kEveryLane, wide, 16))};
}
static inline F load_f32(const uint8_t* p) { return {_mm512_loadu_ps(p)}; }
// 16 unsigned bytes, one per lane, as floats (exact).
static inline F load_u8(const uint8_t* p) {
    return {_mm512_maskz_cvtepi32_ps(kEveryLane, _mm512_maskz_cvtepu8_epi32(kEveryLane, _mm_loadu_si128((const __m128i*)p)))};
}
static inline F abs(F a) { return {_mm512_abs_ps(a.v)}; }
static inline void store(float* p, F a) { _mm512_storeu_ps(p, a.v); }

#elif defined(POWER_PATH_AVX2) || defined(POWER_PATH_AVXVNNI)
#include <immintrin.h>
#if !defined(POWER_PATH_AVXVNNI)
#define POWER_SIGNED_Q8 1
#endif
struct V { __m256i lo, hi; };
struct F { __m256 lo, hi; };
static inline V load64(const uint8_t* p) {
    return {_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 32))};
}
static inline V splat(int32_t a) { return {_mm256_set1_epi32(a), _mm256_set1_epi32(a)}; }
static inline V zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
static inline V operator&(V a, V b) { return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
static inline V operator|(V a, V b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
static inline V operator^(V a, V b) { return {_mm256_xor_si256(a.lo, b.lo), _mm256_xor_si256(a.hi, b.hi)}; }
static inline V operator+(V a, V b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
static inline V operator-(V a, V b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
static inline V operator*(V a, V b) { return {_mm256_mullo_epi32(a.lo, b.lo), _mm256_mullo_epi32(a.hi, b.hi)}; }
static inline V shl(V a, int n) {
    __m128i c = _mm_cvtsi32_si128(n);
    return {_mm256_sll_epi32(a.lo, c), _mm256_sll_epi32(a.hi, c)};
}
static inline V shr(V a, int n) {
    __m128i c = _mm_cvtsi32_si128(n);
    return {_mm256_srl_epi32(a.lo, c), _mm256_srl_epi32(a.hi, c)};
}
static inline V sar(V a, int n) {
    __m128i c = _mm_cvtsi32_si128(n);
    return {_mm256_sra_epi32(a.lo, c), _mm256_sra_epi32(a.hi, c)};
}
#if defined(POWER_PATH_AVXVNNI)
static inline __m256i dot_u8_half(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
static inline __m256i dot_i16_half(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
#else
// maddubs adds pairs of u8 x s8 products into int16 with saturation: exact here because every unsigned weight
// operand is at most 63 (2 * 63 * 127 < 32767) or, for Q8_0, |w| <= 128 with the sign moved onto x.
static inline __m256i dot_u8_half(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
static inline __m256i dot_i16_half(__m256i acc, __m256i a, __m256i b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
#endif
static inline V dot_u8(V acc, V w, V x) { return {dot_u8_half(acc.lo, w.lo, x.lo), dot_u8_half(acc.hi, w.hi, x.hi)}; }
static inline V dot_i16(V acc, V a, V b) { return {dot_i16_half(acc.lo, a.lo, b.lo), dot_i16_half(acc.hi, a.hi, b.hi)}; }
#ifdef POWER_SIGNED_Q8
// s8(w) * s8(x): |w| as the unsigned operand and w's sign moved onto x (|w| <= 128: 2 * 128 * 127 < 32767).
static inline __m256i dot_s8_half(__m256i acc, __m256i w, __m256i x) {
    return dot_u8_half(acc, _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}
static inline V dot_s8(V acc, V w, V x) { return {dot_s8_half(acc.lo, w.lo, x.lo), dot_s8_half(acc.hi, w.hi, x.hi)}; }
#endif
static inline F tofloat(V a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
static inline F fsplat(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
static inline F fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline F operator+(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline F operator-(F a, F b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline F operator*(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline F load_f16(const uint8_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16)))};
}
static inline __m256 bf16_half(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline F load_bf16(const uint8_t* p) { return {bf16_half(p), bf16_half(p + 16)}; }
static inline F load_f32(const uint8_t* p) { return {_mm256_loadu_ps((const float*)p), _mm256_loadu_ps((const float*)(p + 32))}; }
static inline __m256 u8_half(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
static inline F load_u8(const uint8_t* p) { return {u8_half(p), u8_half(p + 8)}; }
static inline F abs(F a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return {_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}
static inline void store(float* p, F a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }

#else  // portable scalar C++
struct V { uint32_t v[16]; };
struct F { float v[16]; };
#define POWER_LANES(type, expr) { type r; for (int j = 0; j < 16; ++j) r.v[j] = (expr); return r; }
static inline V load64(const uint8_t* p) { V r; std::memcpy(r.v, p, 64); return r; }
static inline V splat(int32_t a) POWER_LANES(V, (uint32_t)a)
static inline V zero() POWER_LANES(V, 0u)
static inline V operator&(V a, V b) POWER_LANES(V, a.v[j] & b.v[j])
static inline V operator|(V a, V b) POWER_LANES(V, a.v[j] | b.v[j])
static inline V operator^(V a, V b) POWER_LANES(V, a.v[j] ^ b.v[j])
static inline V operator+(V a, V b) POWER_LANES(V, a.v[j] + b.v[j])
static inline V operator-(V a, V b) POWER_LANES(V, a.v[j] - b.v[j])
static inline V operator*(V a, V b) POWER_LANES(V, a.v[j] * b.v[j])
static inline V shl(V a, int n) POWER_LANES(V, a.v[j] << n)
static inline V shr(V a, int n) POWER_LANES(V, a.v[j] >> n)
static inline V sar(V a, int n) POWER_LANES(V, (uint32_t)((int32_t)a.v[j] >> n))
static inline uint32_t dot4(uint32_t acc, uint32_t w, uint32_t x) {
    int32_t s = (int32_t)acc;
    for (int i = 0; i < 4; ++i) s += (int32_t)(uint8_t)(w >> (8 * i)) * (int32_t)(int8_t)(x >> (8 * i));
    return (uint32_t)s;
}
static inline V dot_u8(V acc, V w, V x) POWER_LANES(V, dot4(acc.v[j], w.v[j], x.v[j]))
static inline uint32_t dot2(uint32_t acc, uint32_t a, uint32_t b) {
    return (uint32_t)((int32_t)acc + (int16_t)a * (int16_t)b + (int16_t)(a >> 16) * (int16_t)(b >> 16));
}
static inline V dot_i16(V acc, V a, V b) POWER_LANES(V, dot2(acc.v[j], a.v[j], b.v[j]))
static inline F tofloat(V a) POWER_LANES(F, (float)(int32_t)a.v[j])
static inline F fsplat(float a) POWER_LANES(F, a)
static inline F fzero() POWER_LANES(F, 0.0f)
static inline F operator+(F a, F b) POWER_LANES(F, a.v[j] + b.v[j])
static inline F operator-(F a, F b) POWER_LANES(F, a.v[j] - b.v[j])
static inline F operator*(F a, F b) POWER_LANES(F, a.v[j] * b.v[j])
static inline F load_f16(const uint8_t* p) POWER_LANES(F, half_to_float(u16_at(p, j)))
static inline F load_bf16(const uint8_t* p) POWER_LANES(F, bf16_to_float(u16_at(p, j)))
static inline F load_f32(const uint8_t* p) POWER_LANES(F, f32_at(p, j))
static inline F load_u8(const uint8_t* p) POWER_LANES(F, (float)p[j])
static inline F abs(F a) POWER_LANES(F, std::fabs(a.v[j]))
static inline void store(float* p, F a) { std::memcpy(p, a.v, 64); }
#endif

// The same 4 activation bytes in every lane (the operand an integer dot product multiplies each lane's weights by).
static inline V x4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return splat(v);
}
static const V kLow4 = splat(0x0F0F0F0F);

// A Q8_0 block's signed weights for 16 rows (the tile layout's 8 groups of 4 bytes at p + 32), as q8_0_sum takes
// them: biased by 128 where u8 x s8 products are summed, as stored for the sign trick (POWER_SIGNED_Q8).
static inline void load_q8_0(const uint8_t* p, V* w) {
#ifdef POWER_SIGNED_Q8
    for (int g = 0; g < 8; ++g) w[g] = load64(p + 32 + 64 * g);
#else
    for (int g = 0; g < 8; ++g) w[g] = load64(p + 32 + 64 * g) ^ splat((int32_t)0x80808080);
#endif
}

// The exact int32 sum of those weights times 32 activation levels q, whose own sum is `total`.
static inline V q8_0_sum(const V* w, const int8_t* q, [[maybe_unused]] int32_t total) {
    V s = zero();
#ifdef POWER_SIGNED_Q8
    for (int g = 0; g < 8; ++g) s = dot_s8(s, w[g], x4(q + 4 * g));
    return s;
#else
    for (int g = 0; g < 8; ++g) s = dot_u8(s, w[g], x4(q + 4 * g));
    return s - splat(128 * total);
#endif
}
