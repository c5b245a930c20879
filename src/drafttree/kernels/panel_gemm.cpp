// bf16 products on AVX2 over weights repacked as panels of 16 columns ([N / 16][K][16]), for every row count.
//
// Why: the vector path's tiles (small_gemm.cpp) take dot products along K: 8 lanes of an input row against 8 of a
// weight row, two dependent FMAs a step for the bf16 pairs, and a horizontal sum at the end. Without AVX-512 they
// reached ~75-95 GFLOP/s from 8 rows on (a 2-core Zen 3: a 16-token forward cost ~3.6 one-token ones). In a panel the
// 16 columns of one step of K sit side by side: a step broadcasts one input value per row and multiplies it by all 16
// columns, so 6 rows keep 12 independent accumulators busy, 16 weights are widened once (a mask and a shift) for all
// the rows, and no horizontal sums are left at the end.
// Numerics: float32 sums of exact bf16 products (denormals flushed, as the other bf16 paths do), in one fixed order per
// output: K from first to last, whatever the number of rows or the tile's shape, so a row's result never depends on
// the rows computed with it; every row count (a token, a tree, a prompt) takes this path where it is on, so a tree
// gives the logits a one-token step would. The sums differ in order from the other paths', as two GEMM libraries' do.
// Weights are packed once and kept beside the original (packed_weights.cpp).
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels.h"

namespace drafttree_kernels {

#if defined(__AVX2__) && defined(__FMA__)
const bool PANELS_READY = true;
#else
const bool PANELS_READY = false;
#endif
bool PANELS_ON = false;

namespace {
using BF16 = at::BFloat16;
constexpr int64_t WIDTH = 16;  // columns of a panel
constexpr int MAX_TILE_ROWS = 6;  // 6 rows x 16 columns: 12 accumulators + 2 weight vectors + 1 input of 16 registers
// Weights are prefetched this many steps of K ahead (1 KiB of a panel): with few rows a forward streams them from
// memory, and the hardware prefetcher alone left 2-8-row products no faster than the vector path's, which prefetches.
constexpr int64_t AHEAD = 32;

bool panel_shape(const torch::Tensor& w) {
  return w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.size(0) % WIDTH == 0 && w.size(0) > 0 &&
         w.size(1) > 0;
}

#if defined(__AVX2__) && defined(__FMA__)
// R input rows (float32, row stride K) times P panels (`stride` elements apart), the sums to out[r * P * 16 + column].
// A panel step's 16 bf16 values as 8 32-bit lanes: lane i holds column 2i in its low half and 2i + 1 in its high half,
// so a shift gives the even columns and a mask the odd ones, each exact in float32. P > 1 (one or two rows:
// memory-bound, several panels' FMAs in flight).
// Not inlined, and every loop over rows and panels unrolled: inlined into the caller GCC kept the accumulators in
// memory (a store per FMA), 2x slower.
template <int R, int P>
__attribute__((noinline)) void tile(const float* __restrict x, int64_t K, const BF16* __restrict w, int64_t stride,
                                    float* __restrict out) {
  __m256 acc[R * P * 2];  // row r, panel p: even columns at 2 (r P + p), odd ones after them
#pragma GCC unroll 32
  for (int i = 0; i < R * P * 2; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < K; ++k) {
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p)  // each panel's stream AHEAD steps on (past its end: the next panel's start)
      _mm_prefetch(reinterpret_cast<const char*>(w + p * stride + (k + AHEAD) * WIDTH), _MM_HINT_T0);
    if constexpr (P == 1) {  // the weights first, then one row's input at a time (6 rows: 15 registers)
      const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * WIDTH));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(t, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(t, high));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + r * K + k);
        acc[2 * r] = _mm256_fmadd_ps(xv, even, acc[2 * r]);
        acc[2 * r + 1] = _mm256_fmadd_ps(xv, odd, acc[2 * r + 1]);
      }
    } else {  // the rows' inputs first (one or two), then each panel's weights
      __m256 xv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) xv[r] = _mm256_broadcast_ss(x + r * K + k);
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) {
        const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * stride + k * WIDTH));
        const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(t, 16));
        const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(t, high));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[2 * (r * P + p)] = _mm256_fmadd_ps(xv[r], even, acc[2 * (r * P + p)]);
          acc[2 * (r * P + p) + 1] = _mm256_fmadd_ps(xv[r], odd, acc[2 * (r * P + p) + 1]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R * P; ++i) {  // even and odd lanes back in column order (a permutation: values unchanged)
    const __m256 lo = _mm256_unpacklo_ps(acc[2 * i], acc[2 * i + 1]);  // columns 0-3 | 8-11
    const __m256 hi = _mm256_unpackhi_ps(acc[2 * i], acc[2 * i + 1]);  // columns 4-7 | 12-15
    _mm256_storeu_ps(out + i * WIDTH, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(out + i * WIDTH + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
}

void run_tile(int rows, int panels, const float* x, int64_t K, const BF16* w, int64_t stride, float* out) {
  if (panels == 1) {
    switch (rows) {
      case 1: return tile<1, 1>(x, K, w, stride, out);
      case 2: return tile<2, 1>(x, K, w, stride, out);
      case 3: return tile<3, 1>(x, K, w, stride, out);
      case 4: return tile<4, 1>(x, K, w, stride, out);
      case 5: return tile<5, 1>(x, K, w, stride, out);
      default: return tile<6, 1>(x, K, w, stride, out);
    }
  }
  if (rows == 2) return tile<2, 2>(x, K, w, stride, out);
  switch (panels) {
    case 2: return tile<1, 2>(x, K, w, stride, out);
    case 3: return tile<1, 3>(x, K, w, stride, out);
    default: return tile<1, 4>(x, K, w, stride, out);
  }
}
#endif

}  // namespace

bool panel_packable(const torch::Tensor& w) {
  return PANELS_ON && w.device().is_cpu() && panel_shape(w) && w.is_contiguous();
}

torch::Tensor panel_pack(const torch::Tensor& w) {
  TORCH_CHECK(panel_shape(w), "panel_pack: a bf16 weight of 16k rows");
  c10::InferenceMode guard;
  const int64_t N = w.size(0), K = w.size(1);
  return w.view({N / WIDTH, WIDTH, K}).transpose(1, 2).contiguous().view({-1});
}

// y_i = x W_i^T (+ b_i) for bf16 weights that panel_packable() took: as linears() (its bf16 branch), on panels.
std::vector<torch::Tensor> panel_linears(const torch::Tensor& x2, const std::vector<torch::Tensor>& ws,
                                         const std::vector<torch::Tensor>& fbias) {
  const int64_t M = x2.size(0), K = x2.size(1);
  // one row: 4 panels a tile, two rows: 2 (memory-bound: more FMAs in flight); more: one panel, 6 rows a tile
  const int64_t per_unit = M == 1 ? 4 : (M == 2 ? 2 : 1);
  std::vector<torch::Tensor> outs, packs;
  std::vector<int64_t> first(ws.size() + 1, 0);  // first unit of each weight
  for (size_t s = 0; s < ws.size(); ++s) {
    packs.push_back(packed_weight(ws[s]));
    outs.push_back(torch::empty({M, ws[s].size(0)}, x2.options()));
    first[s + 1] = first[s] + (ws[s].size(0) / WIDTH + per_unit - 1) / per_unit;
  }
  if (M == 0) return outs;
#if defined(__AVX2__) && defined(__FMA__)
  const torch::Tensor xf = x2.to(torch::kFloat32).contiguous();  // exact
  const float* xd = xf.data_ptr<float>();
  // the rows in tiles of at most 6, as even as can be (8 rows: 4 + 4, not 6 + 2, whose 4 accumulators wait on the
  // FMAs' latency); tile t's rows
  const int64_t tiles = (M + MAX_TILE_ROWS - 1) / MAX_TILE_ROWS, base = M / tiles, extra = M % tiles;
  auto rows_of = [&](int64_t t) { return static_cast<int>(base + (t < extra ? 1 : 0)); };
  at::parallel_for(0, first.back(), M <= 2 ? 2 : 4, [&](int64_t u0, int64_t u1) {
    FlushDenormals flush(true);
    alignas(32) float sums[MAX_TILE_ROWS * 4 * WIDTH];
    size_t s = std::upper_bound(first.begin(), first.end(), u0) - first.begin() - 1;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= first[s + 1]) ++s;
      const int64_t N = ws[s].size(0), p0 = (u - first[s]) * per_unit;
      const int panels = static_cast<int>(std::min(per_unit, N / WIDTH - p0));
      const int64_t n0 = p0 * WIDTH, width = panels * WIDTH;
      const BF16* w = packs[s].data_ptr<BF16>() + n0 * K;
      const float* bias = fbias[s].defined() ? fbias[s].data_ptr<float>() + n0 : nullptr;
      BF16* out = outs[s].data_ptr<BF16>();
      for (int64_t m = 0, t = 0; m < M; m += rows_of(t++)) {
        const int rows = rows_of(t);
        run_tile(rows, panels, xd + m * K, K, w, WIDTH * K, sums);
        for (int r = 0; r < rows; ++r) round_run(sums + r * width, bias, out + (m + r) * N + n0, width);
      }
    }
  });
#else
  TORCH_CHECK(false, "panel_linears: this build has no AVX2");
#endif
  return outs;
}

}  // namespace drafttree_kernels
