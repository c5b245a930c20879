// Attention for the few queries of decoding (a token, a draft tree, a batch of trees) over a KV cache.
//
// Why: torch's CPU flash-attention kernel is built for long queries; with a handful of them per sequence it costs
// ~0.1-0.3 ms per call in overhead, and a batch of rows went through it run by run (a grid padded to each run's
// widest tree). Here queries are packed (query t belongs to row q_row[t] and is node q_node[t] of that row's mask),
// each is attended over its own row's first key_len[row] keys, the keys its mask allows only, grouped-query heads
// reading their shared K/V head in place. One call per layer, whatever the rows and tree sizes. A row's queries (a
// tree) and their grouped heads are computed together in small register tiles, so each key and value is read once
// for all of them (a 16-node tree over 1,000 keys, one thread, Zen 4: 1.09 -> 0.61 ms per layer; one token over 300
// keys 22.6 -> 17.0 us), with the same bits as one query at a time.
// Numerics: float32 throughout (bf16 values widened exactly); each query's scores, softmax and weighted sum use
// one fixed order over its allowed keys, so a query's output does not depend on the other queries or rows of the
// call, nor on the contents of the keys its mask excludes (a tree node gets what it would get verified alone).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace drafttree_kernels {
using namespace drafttree_simd;

namespace {

constexpr float SKIP = -3.0e38f;  // additive mask values at or below this exclude the key (finfo.min, -inf)

inline float load_one(float v) { return v; }
inline float load_one(at::BFloat16 v) { return static_cast<float>(v); }
inline void store_one(float* p, float v) { *p = v; }
inline void store_one(at::BFloat16* p, float v) { *p = at::BFloat16(v); }

// Scores of R query rows (float32, D apart) against nk <= KT keys: s[r * ld + kk] = q_r . k_kk. Each score is one
// accumulator's FMA chain over the D / LANES vectors in order, folded by reduce()'s fixed tree (the same for every
// accumulator), then the D % LANES tail: its value depends on q_r and k_kk only, not on the rows or keys beside it.
// K vectors are loaded once for all R rows.
constexpr int RT = 4, KT = ACC / RT;  // a scores tile: RT x KT accumulators, one reduce()
template <typename T, int R>
inline void score_tile(const float* q, int64_t D, const T* k, int64_t k_slot, int nk, float* s, int64_t ld) {
  const int64_t nv = D / LANES;
  vec acc[ACC];
  for (int i = 0; i < ACC; ++i) acc[i] = vzero();
  for (int64_t c = 0; c < nv; ++c) {
    vec kv[KT];
#pragma GCC unroll 8
    for (int kk = 0; kk < KT; ++kk) kv[kk] = kk < nk ? vload(k + kk * k_slot + c * LANES) : vzero();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const vec qv = vload(q + r * D + c * LANES);
#pragma GCC unroll 8
      for (int kk = 0; kk < KT; ++kk) acc[r * KT + kk] = vfma(qv, kv[kk], acc[r * KT + kk]);
    }
  }
  alignas(64) float sums[ACC];
  vstore(sums, in_order(reduce(acc)));  // accumulator j's sum in lane j
  if (nv * LANES == D && nk == KT) {
    for (int r = 0; r < R; ++r) std::memcpy(s + r * ld, sums + r * KT, KT * sizeof(float));
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int kk = 0; kk < nk; ++kk) {
      float v = sums[r * KT + kk];
      for (int64_t d = nv * LANES; d < D; ++d) v = std::fma(q[r * D + d], load_one(k[kk * k_slot + d]), v);
      s[r * ld + kk] = v;
    }
}

template <typename T>
void score_rows(const float* q, int64_t rows, int64_t D, const T* k, int64_t k_slot, int64_t keys, float* s,
                int64_t ld) {
  for (int64_t r0 = 0; r0 < rows; r0 += RT) {
    const int64_t R = std::min<int64_t>(RT, rows - r0);
    for (int64_t j0 = 0; j0 < keys; j0 += KT) {
      const int nk = static_cast<int>(std::min<int64_t>(KT, keys - j0));
      const float* qr = q + r0 * D;
      const T* kj = k + j0 * k_slot;
      float* sr = s + r0 * ld + j0;
      switch (R) {
        case 4: score_tile<T, 4>(qr, D, kj, k_slot, nk, sr, ld); break;
        case 3: score_tile<T, 3>(qr, D, kj, k_slot, nk, sr, ld); break;
        case 2: score_tile<T, 2>(qr, D, kj, k_slot, nk, sr, ld); break;
        default: score_tile<T, 1>(qr, D, kj, k_slot, nk, sr, ld); break;
      }
    }
  }
}

// out[r][d0 : d0 + CN * LANES] = sum_j p[r][j] v_j over the keys `use` lists, in key order, R rows sharing each V
// load. A key a row may not see has p 0: adding 0 * v (v finite) leaves the row's sum as it was, so each row gets
// the sum over its own keys alone.
template <typename T, int CN, int R>
inline void value_tile(const float* p, int64_t ld, const int64_t* use, int64_t n, const T* v, int64_t v_slot,
                       float* out, int64_t ldo) {
  vec acc[R * CN];
#pragma GCC unroll 32
  for (int i = 0; i < R * CN; ++i) acc[i] = vzero();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = use[i];
    vec vv[CN];
#pragma GCC unroll 8
    for (int c = 0; c < CN; ++c) vv[c] = vload(v + j * v_slot + c * LANES);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vec w = vset(p[r * ld + j]);
#pragma GCC unroll 8
      for (int c = 0; c < CN; ++c) acc[r * CN + c] = vfma(w, vv[c], acc[r * CN + c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CN; ++c) vstore(out + r * ldo + c * LANES, acc[r * CN + c]);
}

constexpr int VCN = 4;                          // V vectors per value tile
constexpr int VROWS = (REGS - VCN - 2) / VCN;  // rows per value tile: every accumulator in a register

// The last rows (fewer than a tile) as one tile of exactly that many: one pass over V, not one per row (a token's
// three grouped heads are three rows).
template <typename T, int CN, int R>
inline void value_rest(int64_t rest, const float* p, int64_t ld, const int64_t* use, int64_t n, const T* v,
                       int64_t v_slot, float* out, int64_t ldo) {
  if constexpr (R > 0) {
    if (rest == R) value_tile<T, CN, R>(p, ld, use, n, v, v_slot, out, ldo);
    else value_rest<T, CN, R - 1>(rest, p, ld, use, n, v, v_slot, out, ldo);
  }
}

template <typename T, int CN>
void value_rows_cn(const float* p, int64_t rows, int64_t ld, const int64_t* use, int64_t n, const T* v, int64_t v_slot,
                   float* out, int64_t ldo) {
  int64_t r0 = 0;
  for (; r0 + VROWS <= rows; r0 += VROWS) value_tile<T, CN, VROWS>(p + r0 * ld, ld, use, n, v, v_slot, out + r0 * ldo, ldo);
  value_rest<T, CN, VROWS - 1>(rows - r0, p + r0 * ld, ld, use, n, v, v_slot, out + r0 * ldo, ldo);
}

template <typename T>
void value_rows(const float* p, int64_t rows, int64_t ld, const int64_t* use, int64_t n, const T* v, int64_t v_slot,
                int64_t D, float* out) {
  const int64_t nv = D / LANES;
  int64_t c0 = 0;
  for (; c0 + VCN <= nv; c0 += VCN) value_rows_cn<T, VCN>(p, rows, ld, use, n, v + c0 * LANES, v_slot, out + c0 * LANES, D);
  switch (nv - c0) {
    case 3: value_rows_cn<T, 3>(p, rows, ld, use, n, v + c0 * LANES, v_slot, out + c0 * LANES, D); break;
    case 2: value_rows_cn<T, 2>(p, rows, ld, use, n, v + c0 * LANES, v_slot, out + c0 * LANES, D); break;
    case 1: value_rows_cn<T, 1>(p, rows, ld, use, n, v + c0 * LANES, v_slot, out + c0 * LANES, D); break;
    default: break;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = nv * LANES; d < D; ++d) {  // D % LANES
      float a = 0.f;
      for (int64_t i = 0; i < n; ++i) a = std::fma(p[r * ld + use[i]], load_one(v[use[i] * v_slot + d]), a);
      out[r * D + d] = a;
    }
}

struct Layout {
  int64_t H, Hkv, D, groups;
  int64_t k_row, k_head, k_slot, v_row, v_head, v_slot, m_row, m_node;
  float scale;
};

struct Scratch {  // one per thread, reused by every unit it takes
  std::vector<float> qf, s, acc, inv;
  std::vector<int64_t> idx, start, use, prefix;
  std::vector<uint8_t> seen;
  int64_t span = 0;
  int64_t group = -1;  // the query group whose keys (idx, start, use, prefix, span) these are
};

// Queries t[0..nq) of one row (query i is node nodes[i] of its mask) and one K/V head: their `groups` query heads
// each, over the keys each one's mask allows. Scores and weighted sums run as small tiles over all nq * groups
// (query, head) rows, reading each key and value once for all of them; the softmax runs per row over its own keys.
// The keys each query of a group may see (idx, from start[i]), their union in key order (use), how far scores are
// needed (span) and each query's all-visible prefix: the same for every K/V head, so computed once per group.
template <typename T>
void group_keys(const T* mask, int64_t row, const int64_t* nodes, int64_t nq, int64_t keys, const Layout& L,
                Scratch& w) {
  w.idx.clear();
  w.start.assign(1, 0);
  int64_t span = 0;  // scores are computed for every key up to the last one any of the queries may see
  w.seen.assign(keys, 0);
  for (int64_t i = 0; i < nq; ++i) {
    const T* m = mask + row * L.m_row + nodes[i] * L.m_node;
    for (int64_t j = 0; j < keys; ++j)
      if (load_one(m[j]) > SKIP) w.idx.push_back(j), w.seen[j] = 1;
    w.start.push_back(static_cast<int64_t>(w.idx.size()));
    if (w.start[i + 1] > w.start[i]) span = std::max(span, w.idx[w.start[i + 1] - 1] + 1);
  }
  w.use.clear();
  for (int64_t j = 0; j < span; ++j)
    if (w.seen[j]) w.use.push_back(j);
  w.span = span;
  std::vector<int64_t>& prefix = w.prefix;  // query i may see keys [0, prefix[i]), and others after
  prefix.resize(nq);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t* idx = w.idx.data() + w.start[i];
    int64_t lo = 0, hi = w.start[i + 1] - w.start[i];  // idx is increasing: idx[a] == a exactly on a prefix
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (idx[mid] == mid) lo = mid + 1; else hi = mid;
    }
    prefix[i] = lo;
  }
}

template <typename T>
void attend_rows(const T* q, const T* k, const T* v, const T* mask, int64_t row, const int64_t* ts,
                 const int64_t* nodes, int64_t nq, int64_t kvh, const Layout& L, T* out, Scratch& w) {
  const int64_t D = L.D, G = L.groups, R = nq * G;
  const int64_t span = w.span;  // the group's keys: group_keys()
  w.qf.resize(R * D);
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t g = 0; g < G; ++g) {
      const T* qh = q + ts[i] * L.H * D + (kvh * G + g) * D;
      for (int64_t d = 0; d < D; ++d) w.qf[(i * G + g) * D + d] = load_one(qh[d]);
    }
  const int64_t ld = std::max<int64_t>(span, 1);
  w.s.resize(R * ld);
  const T* kb = k + row * L.k_row + kvh * L.k_head;
  const T* vb = v + row * L.v_row + kvh * L.v_head;
  score_rows<T>(w.qf.data(), R, D, kb, L.k_slot, span, w.s.data(), ld);
  std::vector<float>& inv = w.inv;
  inv.resize(R);
  const std::vector<int64_t>& prefix = w.prefix;
  alignas(64) float tail[LANES];
  for (int64_t i = 0; i < nq; ++i) {
    const T* m = mask + row * L.m_row + nodes[i] * L.m_node;
    const int64_t* idx = w.idx.data() + w.start[i];
    const int64_t n = w.start[i + 1] - w.start[i];
    for (int64_t g = 0; g < G; ++g) {
      float* s = w.s.data() + (i * G + g) * ld;
      // the row's scores of its own keys, compacted in key order (the softmax's lanes follow that order)
      w.acc.resize(n);
      float* p = w.acc.data();
      // keys [0, pre) are the row's first keys (the committed past): vectors there, one key at a time after
      const int64_t pre = prefix[i];
      const vec scale = vset(L.scale);
      int64_t a = 0;
      for (; a + LANES <= pre; a += LANES) vstore(p + a, vfma(vload(s + a), scale, vload(m + a)));
      for (; a < n; ++a) p[a] = std::fma(s[idx[a]], L.scale, load_one(m[idx[a]]));
      vec topv = vset(-std::numeric_limits<float>::infinity());  // a maximum: the same in any order
      a = 0;
      for (; a + LANES <= n; a += LANES) topv = vmax(topv, vload(p + a));
      float top = hmax(topv);
      for (; a < n; ++a) top = std::max(top, p[a]);
      const vec shift = vset(top);
      vec sum = vzero();
      a = 0;
      for (; a + LANES <= n; a += LANES) {
        const vec e = vexp_nonpositive(vsub(vload(p + a), shift));
        vstore(p + a, e);
        sum = vadd(sum, e);
      }
      if (a < n) {  // the last few: padded with -inf (exp 0), the same lanes as any other block
        for (int l = 0; l < LANES; ++l) tail[l] = a + l < n ? p[a + l] : -std::numeric_limits<float>::infinity();
        const vec e = vexp_nonpositive(vsub(vload(tail), shift));
        vstore(tail, e);
        for (int64_t l = 0; a + l < n; ++l) p[a + l] = tail[l];
        sum = vadd(sum, e);
      }
      const float total = hsum(sum);
      inv[i * G + g] = total > 0.f ? 1.0f / total : 0.f;
      // back to the key axis (the row's keys are a subset of `use`, both in key order): 0 for keys it may not see
      std::memcpy(s, p, pre * sizeof(float));  // keys [0, pre) are the first of `use` too
      int64_t b = pre;
      for (size_t u = pre; u < w.use.size(); ++u) {
        const int64_t j = w.use[u];
        s[j] = b < n && idx[b] == j ? p[b++] : 0.f;
      }
    }
  }
  w.acc.resize(R * D);
  value_rows<T>(w.s.data(), R, ld, w.use.data(), static_cast<int64_t>(w.use.size()), vb, L.v_slot, D, w.acc.data());
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t g = 0; g < G; ++g) {
      T* o = out + ts[i] * L.H * D + (kvh * G + g) * D;
      const float* a = w.acc.data() + (i * G + g) * D;
      const float f = inv[i * G + g];
      for (int64_t d = 0; d < D; ++d) store_one(o + d, a[d] * f);
    }
}

constexpr int64_t QUERIES_PER_UNIT = 8;  // a row's queries are shared out in groups of at most this many

template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask,
         const int64_t* q_row, const int64_t* q_node, const int64_t* key_len, int64_t per_row, const Layout& L,
         torch::Tensor& out) {
  const int64_t N = q.size(0);
  const T* qp = q.data_ptr<T>();
  const T *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>(), *mp = mask.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t keys_all = k.size(2);
  std::vector<int64_t> rows(N), nodes(N), ts(N);
  for (int64_t t = 0; t < N; ++t) {
    rows[t] = q_row ? q_row[t] : t / per_row;
    nodes[t] = q_node ? q_node[t] : t % per_row;
    ts[t] = t;
  }
  // groups: consecutive queries of one row, at most QUERIES_PER_UNIT each
  std::vector<int64_t> first{0};
  int64_t work = 0;  // key reads, to decide whether threads pay
  for (int64_t t = 0; t < N; ++t) {
    work += key_len ? key_len[rows[t]] : keys_all;
    if (t + 1 < N && (rows[t + 1] != rows[t] || t + 1 - first.back() == QUERIES_PER_UNIT)) first.push_back(t + 1);
  }
  first.push_back(N);
  const int64_t groups_n = static_cast<int64_t>(first.size()) - 1;
  const int64_t units = groups_n * L.Hkv;
  const int64_t grain = work * L.H * L.D < (1 << 16) ? units : 1;
  at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    Scratch w;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t gi = u / L.Hkv, kvh = u % L.Hkv;
      const int64_t t0 = first[gi], nq = first[gi + 1] - t0, row = rows[t0];
      const int64_t keys = key_len ? key_len[row] : keys_all;
      if (w.group != gi) {  // a thread's units run in order: a group's K/V heads one after another
        group_keys<T>(mp, row, nodes.data() + t0, nq, keys, L, w);
        w.group = gi;
      }
      attend_rows<T>(qp, kp, vp, mp, row, ts.data() + t0, nodes.data() + t0, nq, kvh, L, op, w);
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
