// Causal attention of a prompt over its own keys (a prefill), bf16, on AVX-512 bf16 dot products.
//
// Why: torch's CPU flash-attention kernel reaches ~90 GFLOP/s on a 769-token SmolLM2 prompt and ~140 on 6,000 on two
// Zen 4 cores, a third of a 769-token prefill and most of a 6,000-token one (logs/s58_prefill_profile.py); this one
// ~235 and ~265 (blocks of 16 queries: ~5% less). A block of 32 queries times the heads of a key/value group (96 query
// rows for SmolLM2's 9 heads over 3) reads each block of 64 keys once, every block of keys packed once per call: its
// keys so that one vdpbf16ps gives 16 keys' partial scores for a query's pair of
// dimensions, its values packed so that one gives 16 dimensions' partial sums for a pair of keys; an online softmax
// (flash attention's) in float32 between the two, the probabilities rounded to bf16 for the second product (as
// flash-attention kernels in bf16 do). Every query row's result depends on its own query and the keys it may see
// only: a prompt prefilled alone or packed with others (attention.py: PromptRows) gets the same bits.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace drafttree_kernels {
using namespace drafttree_simd;

#if defined(__AVX512BF16__)
namespace {

using BF16 = at::BFloat16;
constexpr int QB = 32;  // queries per block (times the group's heads: the rows that share each key block)
constexpr int KB = 64;  // keys per block: 4 vectors of scores per row
constexpr int TR = 6;   // rows per register tile: 6 x 4 = 24 accumulators

inline __m512i pair_of(const BF16* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Scores of R rows (row r's query at q[r], D bf16) against the 64 packed keys: s[r][64] = q_r . k_j, summed over
// the pairs of D in order (kp: [D / 2][64 keys][2]).
template <int R>
inline void scores(const BF16* const* q, int64_t D, const BF16* kp, float* s) {
  __m512 acc[R][4];
  for (auto& a : acc)
    for (auto& x : a) x = _mm512_setzero_ps();
  for (int64_t p = 0; p < D / 2; ++p) {
    __m512i kv[4];
    for (int j = 0; j < 4; ++j) kv[j] = _mm512_loadu_si512(kp + (p * KB + j * 16) * 2);
    for (int r = 0; r < R; ++r) {
      const __m512i qv = pair_of(q[r] + 2 * p);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)qv, (__m512bh)kv[j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(s + r * KB + j * 16, acc[r][j]);
}

// o[r][D] += sum over the block's keys of p[r][key] v[key] for R rows (p: bf16 [R][64]; vp: [32 key pairs][D][2]),
// D / 16 vectors per row (NV of them at a time).
template <int R, int NV>
inline void weighted(const BF16* p, const BF16* vp, int64_t D, int64_t d0, float* o) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_loadu_ps(o + r * D + d0 + j * 16);
  for (int jp = 0; jp < KB / 2; ++jp) {
    __m512i vv[NV];
    for (int j = 0; j < NV; ++j) vv[j] = _mm512_loadu_si512(vp + (jp * D + d0 + j * 16) * 2);
    for (int r = 0; r < R; ++r) {
      const __m512i pv = pair_of(p + r * KB + 2 * jp);
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)pv, (__m512bh)vv[j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + r * D + d0 + j * 16, acc[r][j]);
}

template <int R = 1>
void scores_rows(int rows, const BF16* const* q, int64_t D, const BF16* kp, float* s) {
  if constexpr (R <= TR) {
    if (rows == R) return scores<R>(q, D, kp, s);
    return scores_rows<R + 1>(rows, q, D, kp, s);
  }
}

template <int R = 1>
void weighted_rows(int rows, const BF16* p, const BF16* vp, int64_t D, float* o) {
  if constexpr (R <= TR) {
    if (rows == R) {
      for (int64_t d0 = 0; d0 < D; d0 += 64) {  // 4 vectors at a time, then what is left of D
        const int64_t left = (D - d0) / 16;
        if (left >= 4) weighted<R, 4>(p, vp, D, d0, o);
        else if (left == 3) weighted<R, 3>(p, vp, D, d0, o);
        else if (left == 2) weighted<R, 2>(p, vp, D, d0, o);
        else weighted<R, 1>(p, vp, D, d0, o);
      }
      return;
    }
    return weighted_rows<R + 1>(rows, p, vp, D, o);
  }
}

struct Scratch {
  std::vector<BF16> p;
  std::vector<float> s, o, m, l;
  std::vector<const BF16*> q;
};

}  // namespace

bool prompt_attention_ready() { return true; }

// q [T, H, D] bf16 contiguous; k, v [Hkv, L, D] bf16 (any strides but a contiguous D), L >= T: the queries are the
// last T of the L positions (L > T: the rest of a prompt after a cached prefix); H a multiple of Hkv, D of 32.
// Query t attends keys 0..L - T + t. Returns [T, H, D] bf16. Key blocks start at key 0 whatever T, so a query gets the
// bits it gets in a prefill of all L positions.
torch::Tensor prompt_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && q.scalar_type() == torch::kBFloat16 &&
              k.scalar_type() == torch::kBFloat16 && v.scalar_type() == torch::kBFloat16 && q.is_contiguous() &&
              k.size(1) >= q.size(0) && k.size(2) == q.size(2) && q.size(2) % 32 == 0 && k.size(0) > 0 &&
              q.size(1) % k.size(0) == 0 && k.stride(2) == 1 && v.stride(2) == 1,
              "prompt_attention: q [T, H, D], k and v [Hkv, L >= T, D], bf16, D a multiple of 32");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(0), G = H / Hkv;
  const int64_t L = k.size(1), P = L - T;  // keys, and the positions before the first query
  auto out = torch::empty_like(q);
  const BF16* qd = q.data_ptr<BF16>();
  const BF16* kd = k.data_ptr<BF16>();
  const BF16* vd = v.data_ptr<BF16>();
  BF16* od = out.data_ptr<BF16>();
  const int64_t ks_h = k.stride(0), ks_t = k.stride(1), vs_h = v.stride(0), vs_t = v.stride(1);
  const int64_t blocks = (T + QB - 1) / QB, items = blocks * Hkv, kblocks = (L + KB - 1) / KB;
  const float sc = static_cast<float>(scale);
  // every block of 64 keys packed once, for all the query blocks that read it: keys as [D / 2][64][2], values as
  // [32][D][2] (missing keys zero)
  auto packed = torch::empty({2, Hkv * kblocks * KB * D}, q.options());
  BF16* kpack = packed[0].data_ptr<BF16>();
  BF16* vpack = packed[1].data_ptr<BF16>();
  at::parallel_for(0, Hkv * kblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; ++bi) {
      const int64_t h = bi / kblocks, k0 = (bi % kblocks) * KB, nk = std::min<int64_t>(KB, L - k0);
      BF16* kp = kpack + bi * KB * D;
      BF16* vp = vpack + bi * KB * D;
      for (int64_t j = 0; j < KB; ++j) {
        const BF16* kr = kd + h * ks_h + (k0 + j) * ks_t;
        const BF16* vr = vd + h * vs_h + (k0 + j) * vs_t;
        BF16* vdst = vp + ((j / 2) * D) * 2 + (j % 2);
        for (int64_t pd = 0; pd < D / 2; ++pd) {
          BF16* kdst = kp + (pd * KB + j) * 2;
          kdst[0] = j < nk ? kr[2 * pd] : BF16(0.0f);
          kdst[1] = j < nk ? kr[2 * pd + 1] : BF16(0.0f);
        }
        for (int64_t d = 0; d < D; ++d) vdst[2 * d] = j < nk ? vr[d] : BF16(0.0f);
      }
    }
  });
  // the costliest blocks (the last queries see the most keys) first, each thread taking the next item
#pragma omp parallel num_threads(static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items))))
  {
    thread_local Scratch w;
    const int64_t rows_max = QB * G;
    w.p.resize(rows_max * KB);
    w.s.resize(rows_max * KB);
    w.o.resize(rows_max * D);
    w.m.resize(rows_max);
    w.l.resize(rows_max);
    w.q.resize(rows_max);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t h = item % Hkv, b = blocks - 1 - item / Hkv;
      const int64_t t0 = b * QB, nq = std::min<int64_t>(QB, T - t0), rows = nq * G, keys = P + t0 + nq;
      for (int64_t t = 0; t < nq; ++t)  // row t * G + g: query t0 + t of head h * G + g
        for (int64_t g = 0; g < G; ++g) w.q[t * G + g] = qd + ((t0 + t) * H + h * G + g) * D;
      std::fill(w.o.begin(), w.o.begin() + rows * D, 0.0f);
      std::fill(w.m.begin(), w.m.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);
      for (int64_t k0 = 0; k0 < keys; k0 += KB) {
        const int64_t nk = std::min<int64_t>(KB, keys - k0);
        const BF16* kp = kpack + (h * kblocks + k0 / KB) * KB * D;  // this block's keys and values, packed
        const BF16* vp = vpack + (h * kblocks + k0 / KB) * KB * D;
        for (int64_t r0 = 0; r0 < rows; r0 += TR)
          scores_rows(static_cast<int>(std::min<int64_t>(TR, rows - r0)), w.q.data() + r0, D, kp,
                      w.s.data() + r0 * KB);
        // online softmax: each row's running maximum, sum and output rescaled; its probabilities to bf16
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r / G, visible = std::min<int64_t>(nk, P + t - k0 + 1);  // keys k0 .. P + t
          float* s = w.s.data() + r * KB;
          const __mmask16 none = 0;
          __m512 sv[4];
          float mx = w.m[r];
          for (int j = 0; j < 4; ++j) {
            const int64_t n = std::clamp<int64_t>(visible - j * 16, 0, 16);
            const __mmask16 keep = n >= 16 ? static_cast<__mmask16>(0xFFFF)
                                            : (n <= 0 ? none : static_cast<__mmask16>((1u << n) - 1));
            sv[j] = _mm512_mask_mul_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), keep,
                                       _mm512_loadu_ps(s + j * 16), _mm512_set1_ps(sc));
            mx = std::max(mx, _mm512_reduce_max_ps(sv[j]));
          }
          const float corr = w.m[r] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(w.m[r] - mx);
          __m512 sum = _mm512_setzero_ps();
          for (int j = 0; j < 4; ++j) {
            const __m512 e = vexp_nonpositive(_mm512_sub_ps(sv[j], _mm512_set1_ps(mx)));
            sum = _mm512_add_ps(sum, e);
            vstore(w.p.data() + r * KB + j * 16, e);
          }
          w.l[r] = w.l[r] * corr + _mm512_reduce_add_ps(sum);
          w.m[r] = mx;
          if (corr != 1.0f) {
            float* o = w.o.data() + r * D;
            for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(o + d),
                                                                                     _mm512_set1_ps(corr)));
          }
        }
        for (int64_t r0 = 0; r0 < rows; r0 += TR)
          weighted_rows(static_cast<int>(std::min<int64_t>(TR, rows - r0)), w.p.data() + r0 * KB, vp, D,
                        w.o.data() + r0 * D);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = t0 + r / G, head = h * G + r % G;
        const __m512 inv = _mm512_set1_ps(1.0f / w.l[r]);
        const float* o = w.o.data() + r * D;
        for (int64_t d = 0; d < D; d += 16)
          vstore(od + (t * H + head) * D + d, _mm512_mul_ps(_mm512_loadu_ps(o + d), inv));
      }
    }
  }
  return out;
}
#else
bool prompt_attention_ready() { return false; }
torch::Tensor prompt_attention(const torch::Tensor& q, const torch::Tensor&, const torch::Tensor&, double) {
  TORCH_CHECK(false, "prompt_attention: this build has no AVX-512 bf16");
  return q;
}
#endif

}  // namespace drafttree_kernels
