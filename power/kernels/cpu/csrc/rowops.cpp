// The trunks' per-row float32 operations on the CPU: RMS norm, rotary embedding, and the write of a KV cache (rows
// held in f32, f16, bf16 or q8_0, each rounded by itself) and attention over it (the rows read back exactly)
// (power/kernels/cpu/rowops.py defines them and holds their torch references). Each row is computed by one fixed
// sequence of float32 operations that reads nothing of another row, so a row's bits do not depend on how many
// rows share the call, and the same code compiled for every instruction path gives the same bits on each
// (-ffp-contract=off: no fused multiply-add; sums keep the lane order below whatever the vector width).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "pool.h"
#include "simd.h"

namespace {

constexpr int kLanes = 16;
// 16 float lanes as one GCC vector: one AVX-512 register, two AVX2 ones or 16 scalars, each lane's arithmetic the
// same IEEE operations whichever the compiler emits.
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

// Lanes from p, written through a reference: a function returning a 64-byte vector has a different ABI on the paths
// without AVX-512 (GCC's -Wpsabi).
inline void load_lanes(Lanes& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }

typedef float Half __attribute__((vector_size(kLanes / 2 * sizeof(float))));
typedef float Quarter __attribute__((vector_size(kLanes / 4 * sizeof(float))));

// The lanes' sum: the upper half of the lanes added onto the lower half, 8 + 8, then 4 + 4, 2 + 2, 1 + 1, in registers
// (a fold through memory stalled each step on the store before it).
inline float fold(const Lanes& lanes) {
    const Half low = __builtin_shufflevector(lanes, lanes, 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(lanes, lanes, 8, 9, 10, 11, 12, 13, 14, 15);
    const Quarter quarter = __builtin_shufflevector(low, low, 0, 1, 2, 3) + __builtin_shufflevector(low, low, 4, 5, 6, 7);
    return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// out[h] = sum_k a_h[k] * b[k] for the H rows a_h = a + h * stride: lane l adds the products k = l, l + 16, l + 32,
// ... in order, then `fold`; the last partial group's missing lanes add -0, which leaves every value as it is. The
// H sums are independent chains over one read of b.
template <int H>
inline void dots(const float* a, int64_t stride, const float* b, int64_t d, float* out) {
    Lanes sum[H] = {};
    int64_t k = 0;
    for (; k + kLanes <= d; k += kLanes) {
        Lanes y;
        load_lanes(y, b + k);
        for (int h = 0; h < H; ++h) {
            Lanes x;
            load_lanes(x, a + h * stride + k);
            sum[h] += x * y;
        }
    }
    for (int h = 0; h < H; ++h) {
        if (k < d) {
            float rest[kLanes];
            for (int l = 0; l < kLanes; ++l) rest[l] = k + l < d ? a[h * stride + k + l] * b[k + l] : -0.0f;
            Lanes tail;
            load_lanes(tail, rest);
            sum[h] += tail;
        }
        out[h] = fold(sum[h]);
    }
}

inline float dot(const float* a, const float* b, int64_t d) {
    float out;
    dots<1>(a, 0, b, d, &out);
    return out;
}

// For the H outputs out_h = out + h * stride, columns [c, c + 16 V): out_h += w_h[j] * values[j] for j = 0 ..
// count - 1 in order, each product and sum one rounding; the sums stay in registers across the values.
template <int H, int V>
inline void weighted_columns(float* out, int64_t stride, const float* const* w, const float* const* values,
                             int64_t count, int64_t c) {
    Lanes sum[H][V];
    for (int h = 0; h < H; ++h) {
        for (int i = 0; i < V; ++i) load_lanes(sum[h][i], out + h * stride + c + i * kLanes);
    }
    for (int64_t j = 0; j < count; ++j) {
        Lanes v[V];
        for (int i = 0; i < V; ++i) load_lanes(v[i], values[j] + c + i * kLanes);
        for (int h = 0; h < H; ++h) {
            const float weight = w[h][j];
            for (int i = 0; i < V; ++i) sum[h][i] += weight * v[i];
        }
    }
    for (int h = 0; h < H; ++h) {
        for (int i = 0; i < V; ++i) std::memcpy(out + h * stride + c + i * kLanes, &sum[h][i], sizeof(Lanes));
    }
}

// `weighted_columns` over every column of width d: 32 at a time, then 16, then one by one.
template <int H>
void weighted_sum(float* out, int64_t stride, const float* const* w, const float* const* values, int64_t count,
                  int64_t d) {
    int64_t c = 0;
    for (; c + 2 * kLanes <= d; c += 2 * kLanes) weighted_columns<H, 2>(out, stride, w, values, count, c);
    for (; c + kLanes <= d; c += kLanes) weighted_columns<H, 1>(out, stride, w, values, count, c);
    for (; c < d; ++c) {
        for (int64_t j = 0; j < count; ++j) {
            for (int h = 0; h < H; ++h) out[h * stride + c] += w[h][j] * values[j][c];
        }
    }
}

void check_rows(const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), name,
                ": contiguous float32 on the CPU");
}

// `count` 16-bit values at p -> float32 (exact: every f16 and bf16 value is a float32), 16 at a time by the path's
// vector load (simd.h `load_f16`, `load_bf16`), the rest one at a time.
template <F (*kLoad)(const uint8_t*), float (*kOne)(uint16_t)>
void widen(const uint8_t* p, int64_t count, float* out) {
    int64_t c = 0;
    for (; c + 16 <= count; c += 16) store(out + c, kLoad(p + 2 * c));
    for (; c < count; ++c) out[c] = kOne(u16_at(p, (int)c));
}

// A KV cache's stored rows (power/runtime/kv_rows.py): float32, f16 or bf16 values, or q8_0 blocks (uint8: per 32
// values an f16 scale d and 32 int8 q). `row` gives row j's `width` values in float32, exactly (d * q is an 11-bit
// times a 7-bit integer): f32 rows in place, the others widened into `scratch`.
constexpr int64_t kQ8Block = 32, kQ8BlockBytes = 34;

struct CacheRows {
    const uint8_t* base;
    at::ScalarType type;
    int64_t width;      // values a row
    int64_t row_bytes;  // bytes a stored row

    CacheRows(const at::Tensor& t, const char* name) : type(t.scalar_type()) {
        TORCH_CHECK(t.is_contiguous() && t.device().is_cpu() && t.dim() == 3, name, ": a contiguous [Hkv, T, width] "
                    "cache on the CPU");
        TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16 ||
                    (type == at::kByte && t.size(2) % kQ8BlockBytes == 0), name,
                    ": float32, float16 or bfloat16 values, or uint8 q8_0 blocks of 34 bytes");
        base = static_cast<const uint8_t*>(t.data_ptr());
        row_bytes = t.size(2) * t.element_size();
        width = type == at::kByte ? t.size(2) / kQ8BlockBytes * kQ8Block : t.size(2);
    }

    const float* row(int64_t j, float* scratch) const {
        const uint8_t* p = base + j * row_bytes;
        if (type == at::kFloat) return reinterpret_cast<const float*>(p);
        if (type == at::kHalf) {
            widen<load_f16, half_to_float>(p, width, scratch);
        } else if (type == at::kBFloat16) {
            widen<load_bf16, bf16_to_float>(p, width, scratch);
        } else {
            for (int64_t b = 0; b < width / kQ8Block; ++b, p += kQ8BlockBytes) {
                uint16_t bits;
                std::memcpy(&bits, p, 2);
                const float d = static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
                const int8_t* q = reinterpret_cast<const int8_t*>(p + 2);
                for (int64_t c = 0; c < kQ8Block; ++c) scratch[b * kQ8Block + c] = d * static_cast<float>(q[c]);
            }
        }
        return scratch;
    }
};

// float32 values [width] as one stored cache row of `type` at `out` (power/runtime/kv_rows.py `encode`, bit for bit):
// f16 and bf16 rounded to nearest even; q8_0 per block of 32, d = max|x| / 127 and q = sign(s) floor(|s| + 0.5) with
// s = x (1 / d) (0 where d is 0), d kept as f16.
void store_row(const float* x, int64_t width, at::ScalarType type, uint8_t* out) {
    if (type == at::kFloat) {
        std::memcpy(out, x, width * sizeof(float));
    } else if (type == at::kHalf) {
        for (int64_t c = 0; c < width; ++c) reinterpret_cast<c10::Half*>(out)[c] = c10::Half(x[c]);
    } else if (type == at::kBFloat16) {
        for (int64_t c = 0; c < width; ++c) reinterpret_cast<c10::BFloat16*>(out)[c] = c10::BFloat16(x[c]);
    } else {
        for (int64_t b = 0; b < width / kQ8Block; ++b, x += kQ8Block, out += kQ8BlockBytes) {
            float amax = 0.0f;
            for (int64_t c = 0; c < kQ8Block; ++c) amax = std::max(amax, std::fabs(x[c]));
            const float scale = amax / 127.0f;
            const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
            const uint16_t bits = c10::Half(scale).x;
            std::memcpy(out, &bits, 2);
            for (int64_t c = 0; c < kQ8Block; ++c) {
                const float s = x[c] * inverse, v = std::floor(std::fabs(s) + 0.5f);
                out[2 + c] = static_cast<uint8_t>(static_cast<int8_t>(s < 0.0f ? -v : s > 0.0f ? v : 0.0f));
            }
        }
    }
}

}  // namespace

// rows [n, heads, width] float32 into caches [S, heads, T, stored width] (`CacheRows`' types) at each row's slot and
// position (slots, positions int64 [n]), each row rounded to the caches' type by itself.
void cache_write(at::Tensor rows, at::Tensor caches, at::Tensor slots, at::Tensor positions) {
    const at::Tensor values = rows.contiguous();
    check_rows(values, "rows");
    TORCH_CHECK(values.dim() == 3 && caches.dim() == 4 && caches.size(1) == values.size(1),
                "rows [n, heads, width] into caches [S, heads, T, stored width]");
    const CacheRows layout(caches.select(0, 0), "caches");
    TORCH_CHECK(caches.is_contiguous() && layout.width == values.size(2), "caches: contiguous, rows of ",
                values.size(2), " values");
    TORCH_CHECK(slots.scalar_type() == at::kLong && positions.scalar_type() == at::kLong && slots.is_contiguous() &&
                positions.is_contiguous() && slots.numel() == values.size(0) && positions.numel() == values.size(0),
                "slots and positions: contiguous int64 [n]");
    const int64_t n = values.size(0), heads = values.size(1), width = values.size(2), slot_rows = caches.size(2);
    const int64_t* sp = slots.data_ptr<int64_t>();
    const int64_t* pp = positions.data_ptr<int64_t>();
    uint8_t* base = static_cast<uint8_t*>(caches.data_ptr());
    const float* vp = values.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
        TORCH_CHECK(sp[r] >= 0 && sp[r] < caches.size(0) && pp[r] >= 0 && pp[r] < slot_rows, "row ", r, ": slot ",
                    sp[r], ", position ", pp[r], " outside the caches");
        for (int64_t h = 0; h < heads; ++h) {
            uint8_t* out = base + ((sp[r] * heads + h) * slot_rows + pp[r]) * layout.row_bytes;
            store_row(vp + (r * heads + h) * width, width, layout.type, out);
        }
    }
}

// x [R, d], weight [W, d] (row r uses weight row r % W) -> (x * (1 / sqrt(sum(x^2) / d + eps))) * weight.
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
    check_rows(x, "x");
    check_rows(weight, "weight");
    const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1), wrows = weight.numel() / d;
    TORCH_CHECK(weight.size(-1) == d && wrows >= 1, "weight: [W, ", d, "]");
    auto out = at::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float epsilon = (float)eps, width = (float)d;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = xp + r * d;
        const float* w = wp + (r % wrows) * d;
        float* o = op + r * d;
        const float inverse = 1.0f / std::sqrt(dot(a, a, d) / width + epsilon);
        for (int64_t k = 0; k < d; ++k) o[k] = (a[k] * inverse) * w[k];
    }
    return out;
}

// x [n, heads, hd], cos/sin [n, hd / 2] -> x rotated: NEOX pairs (j, j + hd/2), else adjacent pairs (2j, 2j + 1);
// each pair (a, b) becomes (a cos - b sin, a sin + b cos), every product and sum one rounding.
at::Tensor rope(at::Tensor x, at::Tensor cos, at::Tensor sin, bool neox) {
    check_rows(x, "x");
    check_rows(cos, "cos");
    check_rows(sin, "sin");
    TORCH_CHECK(x.dim() == 3 && cos.dim() == 2 && cos.size(0) == x.size(0) && 2 * cos.size(1) == x.size(2) &&
                sin.sizes() == cos.sizes(), "x [n, heads, hd] with cos/sin [n, hd / 2]");
    const int64_t n = x.size(0), heads = x.size(1), hd = x.size(2), half = hd / 2;
    auto out = at::empty_like(x);
    const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
        const float *c = cp + i * half, *s = sp + i * half;
        for (int64_t h = 0; h < heads; ++h) {
            const float* a = xp + (i * heads + h) * hd;
            float* o = op + (i * heads + h) * hd;
            for (int64_t j = 0; j < half; ++j) {
                const int64_t first = neox ? j : 2 * j, second = neox ? j + half : 2 * j + 1;
                const float u = a[first], v = a[second];
                o[first] = u * c[j] - v * s[j];
                o[second] = u * s[j] + v * c[j];
            }
        }
    }
    return out;
}

namespace {

// Consecutive rows of one call attended together: each key and value row is read (and widened) once for all of them.
constexpr int64_t kRowsTogether = 4;
// Query heads of a row taken together: their dot products with a key are independent chains over one read of it,
// and their weighted sums of the values stay in registers.
constexpr int64_t kHeadsTogether = 4;
// Value rows read (and widened) at a time for the weighted sums.
constexpr int64_t kValuesTogether = 64;

template <class F>
void by_heads(int64_t heads, const F& f) {
    switch (heads) {
        case 1: f.template operator()<1>(); break;
        case 2: f.template operator()<2>(); break;
        case 3: f.template operator()<3>(); break;
        default: f.template operator()<4>(); break;
    }
}

// One task of `attention`: rows [first, last) of q against KV head g, each row and query head by the arithmetic
// `attention` states. The rows' slot ranges are walked once, in slot order; every row and head keeps its own scores,
// maximum, weights, sum and output, each updated in slot order as when it is attended alone, so its bits do not
// depend on which rows or heads share the task.
struct AttendRows {
    const CacheRows &keys, &values;
    const float* q;
    const int64_t* positions;
    float* out;
    int64_t heads, hd, hdv, group, slots, window;
    float factor;

    struct Scratch {
        std::vector<float> e;  // per row and head of the task: the scores, then the weights
        std::vector<float> peak, total;  // per row and head of the task
        std::vector<float> key_row, value_rows;
        std::vector<const float*> value_at;
    };

    // Row i's outputs for KV head g's query heads.
    float* output(int64_t i, int64_t g) const { return out + i * heads * hdv + g * group * hdv; }

    void operator()(int64_t first, int64_t last, int64_t g, Scratch& scratch) const {
        const int64_t rows = last - first;
        int64_t lo[kRowsTogether], hi[kRowsTogether], at[kRowsTogether + 1];
        at[0] = 0;
        for (int64_t r = 0; r < rows; ++r) {
            hi[r] = positions[first + r];
            lo[r] = window > 0 ? std::max<int64_t>(0, hi[r] - window + 1) : 0;
            at[r + 1] = at[r] + group * (hi[r] - lo[r] + 1);
        }
        const int64_t from = *std::min_element(lo, lo + rows), to = *std::max_element(hi, hi + rows);
        std::vector<float>& e = scratch.e;
        e.resize(at[rows]);
        // the scores, and each row and head's maximum
        std::vector<float>& peak = scratch.peak;
        peak.assign(rows * group, -INFINITY);
        for (int64_t j = from; j <= to; ++j) {
            const float* key = keys.row(g * slots + j, scratch.key_row.data());
            for (int64_t r = 0; r < rows; ++r) {
                if (j < lo[r] || j > hi[r]) continue;
                const int64_t count = hi[r] - lo[r] + 1;
                const float* query = q + ((first + r) * heads + g * group) * hd;
                for (int64_t h0 = 0; h0 < group; h0 += kHeadsTogether) {
                    float score[kHeadsTogether];
                    const int64_t together = std::min(kHeadsTogether, group - h0);
                    by_heads(together, [&]<int H>() { dots<H>(query + h0 * hd, hd, key, hd, score); });
                    for (int64_t h = h0; h < h0 + together; ++h) {
                        const float s = score[h - h0] * factor;
                        e[at[r] + h * count + j - lo[r]] = s;
                        peak[r * group + h] = std::max(peak[r * group + h], s);
                    }
                }
            }
        }
        // the weights in place of the scores, and their sums
        std::vector<float>& total = scratch.total;
        total.assign(rows * group, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t count = hi[r] - lo[r] + 1;
            for (int64_t h = 0; h < group; ++h) {
                float* w = e.data() + at[r] + h * count;
                const float most = peak[r * group + h];
                float sum = 0.0f;
                for (int64_t j = 0; j < count; ++j) {
                    w[j] = std::exp(w[j] - most);
                    sum += w[j];
                }
                total[r * group + h] = sum;
            }
        }
        // the weighted sums of the values, a block of value rows at a time
        for (int64_t r = 0; r < rows; ++r) {
            std::fill(output(first + r, g), output(first + r, g) + group * hdv, 0.0f);
        }
        for (int64_t block = from; block <= to; block += kValuesTogether) {
            const int64_t end = std::min(to, block + kValuesTogether - 1);
            for (int64_t j = block; j <= end; ++j) {
                scratch.value_at[j - block] =
                    values.row(g * slots + j, scratch.value_rows.data() + (j - block) * hdv);
            }
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t a = std::max(block, lo[r]), b = std::min(end, hi[r]), count = hi[r] - lo[r] + 1;
                if (a > b) continue;
                float* o = output(first + r, g);
                for (int64_t h0 = 0; h0 < group; h0 += kHeadsTogether) {
                    const float* w[kHeadsTogether];
                    const int64_t together = std::min(kHeadsTogether, group - h0);
                    for (int64_t h = 0; h < together; ++h) w[h] = e.data() + at[r] + (h0 + h) * count + a - lo[r];
                    by_heads(together, [&]<int H>() {
                        weighted_sum<H>(o + h0 * hdv, hdv, w, scratch.value_at.data() + (a - block), b - a + 1, hdv);
                    });
                }
            }
        }
        for (int64_t r = 0; r < rows; ++r) {
            float* o = output(first + r, g);
            for (int64_t h = 0; h < group; ++h) {
                for (int64_t c = 0; c < hdv; ++c) o[h * hdv + c] /= total[r * group + h];
            }
        }
    }
};

}  // namespace

// q [n, H, hd] at positions [n] against the cache k [Hkv, T, hd], v [Hkv, T, hdv] (stored rows: `CacheRows`) ->
// [n, H * hdv]. Row i, head h reads slots lo..p (p its position; lo = p - window + 1 for a sliding layer, else 0) of
// KV head h / (H / Hkv): scores s_j = dot(q, k_j) * scale, m = max s_j, e_j = exp(s_j - m), then the e_j and the
// e_j v_j added in slot order, divided by their sum. A stored row is read back exactly, so the arithmetic is the
// same whatever the cache's type.
at::Tensor attention(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor positions, int64_t window, double scale) {
    check_rows(q, "q");
    const CacheRows keys_in(k, "k"), values_in(v, "v");
    TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 && positions.size(0) == q.size(0),
                "positions: int64 [n]");
    TORCH_CHECK(q.dim() == 3 && k.size(0) == v.size(0) && k.size(1) == v.size(1) && q.size(2) == keys_in.width &&
                q.size(1) % k.size(0) == 0, "q [n, H, hd], k [Hkv, T, hd], v [Hkv, T, hdv]");
    const int64_t n = q.size(0), heads = q.size(1), hd = q.size(2), kv_heads = k.size(0), slots = k.size(1);
    const int64_t hdv = values_in.width, group = heads / kv_heads;
    const int64_t* pp = positions.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) TORCH_CHECK(pp[i] >= 0 && pp[i] < slots, "position ", pp[i], " outside the cache");
    auto out = at::empty({n, heads * hdv}, q.options());
    const AttendRows attend{keys_in, values_in, q.data_ptr<float>(), pp, out.data_ptr<float>(), heads, hd, hdv,
                            group, slots, window, (float)scale};
    const int64_t blocks = (n + kRowsTogether - 1) / kRowsTogether;
    const int64_t work = std::max<int64_t>(1, std::min(n, kRowsTogether) * (pp[n - 1] + 1) * (hd + hdv) * group);
    // One task per block of rows and KV head.
    power_pool::parallel_for(blocks * kv_heads, std::max<int64_t>(1, (int64_t)(1 << 15) / work), [&](int64_t begin, int64_t end) {
        AttendRows::Scratch scratch{{}, {}, {}, std::vector<float>(hd), std::vector<float>(kValuesTogether * hdv),
                                    std::vector<const float*>(kValuesTogether)};
        for (int64_t task = begin; task < end; ++task) {
            const int64_t block = task / kv_heads, g = task % kv_heads;
            const int64_t first = block * kRowsTogether;
            attend(first, std::min(n, first + kRowsTogether), g, scratch);
        }
    });
    return out;
}

TORCH_LIBRARY_FRAGMENT(POWER_OPS, m) {
    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("rope(Tensor x, Tensor cos, Tensor sin, bool neox) -> Tensor");
    m.def("attention(Tensor q, Tensor k, Tensor v, Tensor positions, int window, float scale) -> Tensor");
    m.def("cache_write(Tensor rows, Tensor(a!) caches, Tensor slots, Tensor positions) -> ()");
}
TORCH_LIBRARY_IMPL(POWER_OPS, CPU, m) {
    m.impl("rms_norm", &rms_norm);
    m.impl("rope", &rope);
    m.impl("attention", &attention);
    m.impl("cache_write", &cache_write);
}
