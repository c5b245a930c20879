// Attention for the few queries of decoding (a token, a draft tree, a batch of trees) over a KV cache.
//
// Why: torch's CPU flash-attention kernel is built for long queries; with a handful of them per sequence it costs
// ~0.1-0.3 ms per call in overhead, and a batch of rows went through it run by run (a grid padded to each run's
// widest tree). Here queries are packed (query t belongs to row q_row[t] and is node q_node[t] of that row's mask),
// each is attended over its own row's first key_len[row] keys, the keys its mask allows only, grouped-query heads
// reading their shared K/V head in place. One call per layer, whatever the rows and tree sizes.
// Numerics: float32 throughout (bf16 values widened exactly); each query's scores, softmax and weighted sum use
// one fixed order over its allowed keys, so a query's output does not depend on the other queries or rows of the
// call, nor on the contents of the keys its mask excludes (a tree node gets what it would get verified alone).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "simd.h"

namespace drafttree_kernels {
using namespace drafttree_simd;

namespace {

constexpr float SKIP = -3.0e38f;  // additive mask values at or below this exclude the key (finfo.min, -inf)

// Whether reduce() puts accumulator j's sum in lane j (AVX2's does; then a block's scores are stored as they come).
inline bool lanes_in_order() {
  for (int j = 0; j < ACC; ++j)
    if (LANE_OF[j] != j) return false;
  return true;
}

inline float load_one(float v) { return v; }
inline float load_one(at::BFloat16 v) { return static_cast<float>(v); }
inline void store_one(float* p, float v) { *p = v; }
inline void store_one(at::BFloat16* p, float v) { *p = at::BFloat16(v); }

// Scores q.k_j for ACC keys at once (fewer at the end): each key has its own accumulator, q sits in registers
// CN vectors at a time, and reduce() folds the ACC accumulators together, each by the same fixed tree, so a key's
// score does not depend on the keys computed with it.
template <typename T, int CN, int NK>
inline void dot_chunk(const float* q, const T* k, int64_t k_slot, int nk, vec* acc) {
  vec qv[CN];
#pragma GCC unroll 16
  for (int c = 0; c < CN; ++c) qv[c] = vload(q + c * LANES);
  if constexpr (NK > 0) {  // a full block: every index a constant, so the accumulators stay in registers
#pragma GCC unroll 16
    for (int j = 0; j < NK; ++j) {
      const T* kj = k + j * k_slot;
#pragma GCC unroll 16
      for (int c = 0; c < CN; ++c) acc[j] = vfma(qv[c], vload(kj + c * LANES), acc[j]);
    }
  } else {
    for (int j = 0; j < nk; ++j) {
      const T* kj = k + j * k_slot;
      for (int c = 0; c < CN; ++c) acc[j] = vfma(qv[c], vload(kj + c * LANES), acc[j]);
    }
  }
}

template <typename T, int NK>
inline void dot_block(const float* q, const T* kb, int64_t k_slot, int nk, int64_t nv, vec* acc) {
  constexpr int CHUNK = 4;  // query vectors held in registers at a time (with ACC accumulators: no spills)
  int64_t c0 = 0;
  for (; c0 + CHUNK <= nv; c0 += CHUNK) dot_chunk<T, CHUNK, NK>(q + c0 * LANES, kb + c0 * LANES, k_slot, nk, acc);
  const float* qc = q + c0 * LANES;
  const T* kc = kb + c0 * LANES;
  switch (nv - c0) {
    case 3: dot_chunk<T, 3, NK>(qc, kc, k_slot, nk, acc); break;
    case 2: dot_chunk<T, 2, NK>(qc, kc, k_slot, nk, acc); break;
    case 1: dot_chunk<T, 1, NK>(qc, kc, k_slot, nk, acc); break;
    default: break;
  }
}

template <typename T>
void scores(const float* q, const T* k, int64_t k_slot, int64_t keys, int64_t D, float* s) {
  const bool identity_lanes = lanes_in_order();
  const int64_t nv = D / LANES;
  for (int64_t j0 = 0; j0 < keys; j0 += ACC) {
    const int nk = static_cast<int>(std::min<int64_t>(ACC, keys - j0));
    const T* kb = k + j0 * k_slot;
    vec acc[ACC];
    for (int j = 0; j < ACC; ++j) acc[j] = vzero();
    if (nk == ACC) dot_block<T, ACC>(q, kb, k_slot, nk, nv, acc);
    else dot_block<T, 0>(q, kb, k_slot, nk, nv, acc);
    if (nk == ACC && identity_lanes && nv * LANES == D) {  // straight into place: no scalar reloads
      vstore(s + j0, reduce(acc));
      continue;
    }
    float sums[ACC];
    vstore(sums, reduce(acc));
    for (int j = 0; j < nk; ++j) {
      float v = sums[LANE_OF[j]];
      for (int64_t d = nv * LANES; d < D; ++d) v = std::fma(q[d], load_one(kb[j * k_slot + d]), v);  // D % LANES
      s[j0 + j] = v;
    }
  }
}

// out[d0 : d0 + CN * LANES] = sum_i p[i] v_{idx[i]}, in the order of i, accumulated in registers.
template <typename T, int CN>
inline void weighted_chunk(const float* p, const int64_t* idx, int64_t n, const T* v, int64_t v_slot, float* out) {
  vec acc[CN];
#pragma GCC unroll 16
  for (int c = 0; c < CN; ++c) acc[c] = vzero();
  for (int64_t i = 0; i < n; ++i) {
    const vec w = vset(p[i]);
    const T* vj = v + idx[i] * v_slot;
#pragma GCC unroll 16
    for (int c = 0; c < CN; ++c) acc[c] = vfma(w, vload(vj + c * LANES), acc[c]);
  }
  for (int c = 0; c < CN; ++c) vstore(out + c * LANES, acc[c]);
}

template <typename T>
void weighted_sum(const float* p, const int64_t* idx, int64_t n, const T* v, int64_t v_slot, int64_t D, float* out) {
  constexpr int CHUNK = 8;
  const int64_t nv = D / LANES;
  int64_t c0 = 0;
  for (; c0 + CHUNK <= nv; c0 += CHUNK) weighted_chunk<T, CHUNK>(p, idx, n, v + c0 * LANES, v_slot, out + c0 * LANES);
  const T* vc = v + c0 * LANES;
  float* oc = out + c0 * LANES;
  switch (nv - c0) {
    case 7: weighted_chunk<T, 7>(p, idx, n, vc, v_slot, oc); break;
    case 6: weighted_chunk<T, 6>(p, idx, n, vc, v_slot, oc); break;
    case 5: weighted_chunk<T, 5>(p, idx, n, vc, v_slot, oc); break;
    case 4: weighted_chunk<T, 4>(p, idx, n, vc, v_slot, oc); break;
    case 3: weighted_chunk<T, 3>(p, idx, n, vc, v_slot, oc); break;
    case 2: weighted_chunk<T, 2>(p, idx, n, vc, v_slot, oc); break;
    case 1: weighted_chunk<T, 1>(p, idx, n, vc, v_slot, oc); break;
    default: break;
  }
  for (int64_t d = nv * LANES; d < D; ++d) {  // D % LANES
    float a = 0.f;
    for (int64_t i = 0; i < n; ++i) a = std::fma(p[i], load_one(v[idx[i] * v_slot + d]), a);
    out[d] = a;
  }
}

struct Layout {
  int64_t H, Hkv, D, groups;
  int64_t k_row, k_head, k_slot, v_row, v_head, v_slot, m_row, m_node;
  float scale;
};

// One query t and one K/V head: its `groups` query heads, over the keys its mask allows.
template <typename T>
void attend_one(const T* q, const T* k, const T* v, const T* mask, int64_t row, int64_t node, int64_t keys,
                int64_t kvh, const Layout& L, T* out, std::vector<int64_t>& idx, std::vector<float>& s,
                std::vector<float>& p, std::vector<float>& qf, std::vector<float>& acc) {
  const T* m = mask + row * L.m_row + node * L.m_node;
  idx.clear();
  for (int64_t j = 0; j < keys; ++j)
    if (load_one(m[j]) > SKIP) idx.push_back(j);
  const int64_t n = static_cast<int64_t>(idx.size()), D = L.D;
  const int64_t span = n ? idx[n - 1] + 1 : 0;  // scores are computed for every key up to the last allowed one
  const T* kb = k + row * L.k_row + kvh * L.k_head;
  const T* vb = v + row * L.v_row + kvh * L.v_head;
  s.resize(span);
  p.resize(n);
  for (int64_t g = 0; g < L.groups; ++g) {
    const int64_t h = kvh * L.groups + g;
    const T* qh = q + h * D;
    for (int64_t d = 0; d < D; ++d) qf[d] = load_one(qh[d]);
    scores<T>(qf.data(), kb, L.k_slot, span, D, s.data());
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      p[i] = s[idx[i]] * L.scale + load_one(m[idx[i]]);
      top = std::max(top, p[i]);
    }
    const vec shift = vset(top);
    vec sum = vzero();
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
      const vec e = vexp_nonpositive(vsub(vload(p.data() + i), shift));
      vstore(p.data() + i, e);
      sum = vadd(sum, e);
    }
    if (i < n) {  // the last few: padded with -inf (exp 0), the same lanes as any other block
      alignas(64) float tail[LANES];
      for (int l = 0; l < LANES; ++l) tail[l] = i + l < n ? p[i + l] : -std::numeric_limits<float>::infinity();
      const vec e = vexp_nonpositive(vsub(vload(tail), shift));
      vstore(tail, e);
      for (int64_t l = 0; i + l < n; ++l) p[i + l] = tail[l];
      sum = vadd(sum, e);
    }
    const float total = hsum(sum);
    weighted_sum<T>(p.data(), idx.data(), n, vb, L.v_slot, D, acc.data());
    const float inv = total > 0.f ? 1.0f / total : 0.f;
    T* o = out + h * D;
    for (int64_t d = 0; d < D; ++d) store_one(o + d, acc[d] * inv);
  }
}

template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
         const int64_t* q_row, const int64_t* q_node, const int64_t* key_len, int64_t per_row, const Layout& L,
         torch::Tensor& out) {
  const int64_t N = q.size(0);
  const T* qp = q.data_ptr<T>();
  const T *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>(), *mp = mask.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t keys_all = k.size(2);
  int64_t work = 0;  // key reads, to decide whether threads pay
  for (int64_t t = 0; t < N; ++t) work += key_len ? key_len[q_row ? q_row[t] : t / per_row] : keys_all;
  const int64_t units = N * L.Hkv;
  const int64_t grain = work * L.H * L.D < (1 << 16) ? units : 1;
  at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    std::vector<int64_t> idx;
    std::vector<float> s, p, qf(L.D), acc(L.D);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t t = u / L.Hkv, kvh = u % L.Hkv;
      const int64_t row = q_row ? q_row[t] : t / per_row, node = q_node ? q_node[t] : t % per_row;
      const int64_t keys = key_len ? key_len[row] : keys_all;
      attend_one<T>(qp + t * L.H * L.D, kp, vp, mp, row, node, keys, kvh, L, op + t * L.H * L.D, idx, s, p, qf, acc);
    }
  });
}

}  // namespace

// q [N, H, D] (contiguous) packed queries; k, v [B, Hkv, S, D] (any strides, unit stride along D); mask [B, 1, n, S']
// additive, same dtype; q_row, q_node [N] (int64) or empty: then query t is node t % per_row of row t / per_row;
// key_len [B] (int64) or empty: every row's S keys. Returns [N, H, D].
torch::Tensor tree_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, const torch::Tensor& q_row, const torch::Tensor& q_node,
                             const torch::Tensor& key_len, int64_t per_row, double scale) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() && mask.device().is_cpu(),
              "tree_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4,
              "tree_attention: bad shapes");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
              mask.scalar_type() == q.scalar_type(), "tree_attention: q, k, v and mask must share a dtype");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1 && mask.stride(3) == 1, "tree_attention: D must be contiguous");
  Layout L;
  L.H = q.size(1);
  L.D = q.size(2);
  L.Hkv = k.size(1);
  TORCH_CHECK(k.size(3) == L.D && v.size(3) == L.D && L.Hkv > 0 && L.H % L.Hkv == 0, "tree_attention: bad heads");
  L.groups = L.H / L.Hkv;
  L.k_row = k.stride(0), L.k_head = k.stride(1), L.k_slot = k.stride(2);
  L.v_row = v.stride(0), L.v_head = v.stride(1), L.v_slot = v.stride(2);
  L.m_row = mask.size(0) == 1 ? 0 : mask.stride(0), L.m_node = mask.size(2) == 1 ? 0 : mask.stride(2);
  L.scale = static_cast<float>(scale);
  const bool packed = q_row.numel() > 0;
  TORCH_CHECK(!packed || (q_row.numel() == q.size(0) && q_node.numel() == q.size(0) &&
                          q_row.scalar_type() == torch::kLong && q_node.scalar_type() == torch::kLong &&
                          q_row.is_contiguous() && q_node.is_contiguous()), "tree_attention: bad q_row/q_node");
  TORCH_CHECK(packed || per_row > 0, "tree_attention: per_row must be positive");
  TORCH_CHECK(key_len.numel() == 0 || (key_len.numel() == k.size(0) && key_len.scalar_type() == torch::kLong &&
                                       key_len.is_contiguous()), "tree_attention: bad key_len");
  const int64_t* rows = packed ? q_row.data_ptr<int64_t>() : nullptr;
  const int64_t* nodes = packed ? q_node.data_ptr<int64_t>() : nullptr;
  const int64_t* lens = key_len.numel() ? key_len.data_ptr<int64_t>() : nullptr;
  for (int64_t t = 0; packed && t < q.size(0); ++t)
    TORCH_CHECK(rows[t] >= 0 && rows[t] < k.size(0) && (mask.size(0) == 1 || rows[t] < mask.size(0)) &&
                nodes[t] >= 0 && (nodes[t] < mask.size(2) || mask.size(2) == 1), "tree_attention: query out of range");
  TORCH_CHECK(packed || (q.size(0) <= k.size(0) * per_row && (per_row <= mask.size(2) || mask.size(2) == 1)),
              "tree_attention: more queries than rows x per_row");
  const int64_t max_keys = std::min<int64_t>(k.size(2), mask.size(3));
  if (lens) {
    for (int64_t b = 0; b < k.size(0); ++b) TORCH_CHECK(lens[b] >= 0 && lens[b] <= max_keys, "tree_attention: key_len");
  } else {
    TORCH_CHECK(mask.size(3) >= k.size(2), "tree_attention: the mask is shorter than the keys");
  }
  auto out = torch::empty_like(q);
  if (q.scalar_type() == torch::kFloat32) {
    run<float>(q, k, v, mask, rows, nodes, lens, per_row, L, out);
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kBFloat16, "tree_attention: float32 or bfloat16 only");
    run<at::BFloat16>(q, k, v, mask, rows, nodes, lens, per_row, L, out);
  }
  return out;
}

}  // namespace drafttree_kernels
