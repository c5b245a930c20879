// The vector backend shared by the kernels, chosen at build time (-march=native).
#pragma once
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace drafttree_simd {

// One vector backend, chosen at build time (-march=native): AVX-512 (16 lanes, tiles of 4 input rows x 4 weight
// rows: 16 accumulators of 32 registers) or AVX2 + FMA (8 lanes, tiles of 4 input rows x 3 weight rows: 12
// accumulators + 3 weight vectors + 1 input vector = all 16 registers, so each input vector is loaded once for its
// 3 products; 3 x 4 tiles left no register for it and the compiler re-read it from memory for every product,
// 16 loads per 12 products).
#if defined(__AVX512F__)
using vec = __m512;
constexpr int LANES = 16, TILE_ROWS = 4, TILE_COLS = 4, FEW_ROWS_COLS = 4, REGS = 32;
constexpr int SPLIT_ROWS = TILE_ROWS, SPLIT_COLS = TILE_COLS;  // bf16 tiles on the FMA path (small_gemm.cpp)
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset(float v) { return _mm512_set1_ps(v); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void in_register(vec& v) { asm("" : "+v"(v)); }  // the compiler must not re-read it from memory per use
inline vec vload(const at::BFloat16* p) {  // bf16 -> float32 is exact: the bits shifted into the top half
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// 2 x LANES bf16 values as two float32 vectors (exact): lane i gets element 2i+1 (odd) and element 2i (even)
using raw = __m512i;
inline raw rload(const at::BFloat16* p) { return _mm512_loadu_si512(p); }
inline void in_register(raw& v) { asm("" : "+v"(v)); }
inline vec odd_half(raw v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)))); }
inline vec even_half(raw v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
#if defined(__AVX512BF16__)
constexpr bool HAS_DOT = true;
// vdpbf16ps: lane i += x[2i+1] w[2i+1], then += x[2i] w[2i] (products exact in float32), with DAZ and FTZ
inline vec vdot(raw x, raw w, vec acc) { return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w); }
#else
constexpr bool HAS_DOT = false;
inline vec vdot(raw, raw, vec acc) { return acc; }
#endif

// Sixteen accumulators -> one vector of their lane sums; every accumulator is folded by the same tree
// (lanes i+8, then i+4, i+2, i+1), so the order of a sum does not depend on which accumulators go with it.
inline vec vexp_parts(vec n, vec p) {  // p * 2^n for integral n in [-126, 0]
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
inline vec vround(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
inline vec vzero_below(vec r, vec x, float lo) {  // r where x >= lo, else 0
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, vset(lo), _CMP_GE_OQ), r);
}

__attribute__((always_inline)) inline vec reduce(const vec* v) {  // inlined: the accumulators stay in registers
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44), _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int LANES = 8, TILE_ROWS = 4, TILE_COLS = 3, FEW_ROWS_COLS = 4, REGS = 16;
constexpr int SPLIT_ROWS = 2, SPLIT_COLS = 4;  // bf16 tiles on the FMA path: see small_gemm.cpp's tile()
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset(float v) { return _mm256_set1_ps(v); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void in_register(vec& v) { asm("" : "+x"(v)); }  // the compiler must not re-read it from memory per use
inline vec vload(const at::BFloat16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
using raw = __m256i;
inline raw rload(const at::BFloat16* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void in_register(raw& v) { asm("" : "+x"(v)); }
inline vec odd_half(raw v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))); }
inline vec even_half(raw v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
constexpr bool HAS_DOT = false;
inline vec vdot(raw, raw, vec acc) { return acc; }

// Eight accumulators -> one vector of their lane sums, each folded as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
inline vec vexp_parts(vec n, vec p) {  // p * 2^n for integral n in [-126, 0]
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
inline vec vround(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
inline vec vzero_below(vec r, vec x, float lo) {  // r where x >= lo, else 0
  return _mm256_and_ps(r, _mm256_cmp_ps(x, vset(lo), _CMP_GE_OQ));
}

inline vec reduce(const vec* v) {
  __m256 t[4], u[2];
  for (int i = 0; i < 4; ++i) t[i] = _mm256_hadd_ps(v[2 * i], v[2 * i + 1]);
  for (int i = 0; i < 2; ++i) u[i] = _mm256_hadd_ps(t[2 * i], t[2 * i + 1]);
  return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}
#else
#error "small_gemm needs AVX-512F, or AVX2 with FMA"
#endif

constexpr int ACC = LANES;  // accumulators one reduce() folds; a tile uses one or more such groups

// Each lane rounded to bf16 and widened back, bit for bit as at::BFloat16(float) rounds (c10's
// round_to_nearest_even: NaN -> 0x7FC0, else add 0x7FFF plus the kept part's lowest bit and truncate; no
// flushing of denormals), and LANES such values stored as bf16.
#if defined(__AVX512F__)
inline __m512i bf16_bits(vec v) {  // the rounded value in each lane's upper half, lower half zero
  const __m512i u = _mm512_castps_si512(v);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                        _mm512_set1_epi32(0x7FFF));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, bias), _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
}
inline vec vnarrow_bf16(vec v) { return _mm512_castsi512_ps(bf16_bits(v)); }
inline void vstore(at::BFloat16* p, vec v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits(v), 16)));
}
#else
inline __m256i bf16_bits(vec v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)),
                                        _mm256_set1_epi32(0x7FFF));
  const __m256i r = _mm256_and_si256(_mm256_add_epi32(u, bias), _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan));
}
inline vec vnarrow_bf16(vec v) { return _mm256_castsi256_ps(bf16_bits(v)); }
inline void vstore(at::BFloat16* p, vec v) {
  const __m256i h = _mm256_srli_epi32(bf16_bits(v), 16);  // eight 16-bit values, each in a 32-bit lane
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
#endif
inline vec vnarrow(vec v, float) { return v; }
inline vec vnarrow(vec v, at::BFloat16) { return vnarrow_bf16(v); }
inline float widen(float v) { return v; }
inline float widen(at::BFloat16 v) { return static_cast<float>(v); }

// The sum of one vector's lanes, always in the same order.
inline float hsum(vec v) {
  float t[LANES];
  vstore(t, v);
  float s = 0.f;
  for (int i = 0; i < LANES; ++i) s += t[i];
  return s;
}

// exp(x) for x <= 0, lane by lane (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r; ~1 ulp; 0 below -87).
inline vec vexp_nonpositive(vec x_in) {
  const vec x = vmax(x_in, vset(-87.0f));
  const vec n = vround(vmul(x, vset(1.44269504088896341f)));
  const vec r = vfma(n, vset(2.12194440e-4f), vfma(n, vset(-0.693359375f), x));
  vec p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset(1.0f)));
  return vzero_below(vexp_parts(n, p), x_in, -87.0f);
}

inline int LANE_OF[ACC];  // accumulator j's sum lands in lane LANE_OF[j] of reduce()'s result

// The largest lane (exact: a maximum does not depend on the order it is taken in).
inline float hmax(vec v) {
  alignas(64) float t[LANES];
  vstore(t, v);
  float m = t[0];
  for (int i = 1; i < LANES; ++i) m = std::max(m, t[i]);
  return m;
}

// reduce()'s result with accumulator j's sum moved to lane j (a permutation: the values are unchanged).
inline vec in_order(vec sums) {
#if defined(__AVX512F__)
  return _mm512_permutexvar_ps(_mm512_loadu_si512(LANE_OF), sums);
#else
  return _mm256_permutevar8x32_ps(sums, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(LANE_OF)));
#endif
}

inline void init_lanes() {
  vec v[ACC];
  for (int j = 0; j < ACC; ++j) v[j] = vset(static_cast<float>(j));
  float out[ACC];
  vstore(out, reduce(v));
  for (int j = 0; j < ACC; ++j) LANE_OF[j] = -1;
  for (int lane = 0; lane < ACC; ++lane) {
    const int j = static_cast<int>(out[lane] / LANES + 0.5f);
    TORCH_CHECK(j >= 0 && j < ACC && LANE_OF[j] < 0, "small_gemm: reduce() does not give one lane per accumulator");
    LANE_OF[j] = lane;
  }
}

}  // namespace drafttree_simd
