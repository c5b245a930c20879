// y = x W^T (+ b) for the few rows of decoding (1 to ~48: a token, a draft tree, a batch of trees); on CPUs with AMX
// every bf16 product goes to amx_gemm.cpp instead, and where the vector path is AVX2 to panel_gemm.cpp (any row
// count; each its own summation order).
//
// Why: torch's CPU GEMM packs the weight matrix on every call, so a product with a handful of rows reads the
// weights several times over; decoding is a stream of exactly such products. Here each block of weight rows
// is read from memory once and used for every input row while it sits in L1.
// Numerics: float32 accumulation of products of the stored values (float32, or bf16 widened exactly), one
// fixed summation order per output whatever the number of rows: a row's result does not depend on the
// rows computed with it (tree verification gives the logits a one-token step would, for products the
// kernel takes: up to gemm.py's MAX_ROWS rows; bigger ones go to torch, or to the AMX tiles).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace {
using namespace drafttree_simd;
using drafttree_kernels::FlushDenormals;
using drafttree_kernels::round_run;

// Up to this many rows a vdpbf16ps product is one tile (6 x 4 accumulators + 4 weight vectors + 1 input vector fit
// in 32 registers; larger tiles measured slower per row than 4 x 4 ones).
constexpr int DOT_ONE_TILE = REGS >= 32 ? 6 : TILE_ROWS;

// Elements of K one inner iteration takes: LANES float32 values, or 2 x LANES bf16 values as LANES pairs.
template <typename T>
constexpr bool is_bf16 = std::is_same_v<T, at::BFloat16>;
template <typename T>
constexpr int64_t STEP = is_bf16<T> ? 2 * LANES : LANES;

// R input rows times C weight rows, written to out[r * ldo + c]; accumulators folded ACC at a time.
// bf16: lane i of an accumulator adds the products of elements 2i+1 and then 2i of each step, the order of the
// vdpbf16ps instruction, which DOT tiles use (twice the products per instruction: for many rows, bound by
// arithmetic) and the others emulate with two exact FMAs (for few rows, bound by memory); with denormals flushed
// as the instruction does (FlushDenormals), both give the same bits, so a row's result never depends on the path.
// SPLIT (bf16, FMA path): the input rows come already widened, as split_rows lays them out (xs), so a tile widens only
// its weight vectors: the widening shifts and masks issue on the FMA ports of an Intel core.
template <typename T, int R, int C, bool DOT = false, bool SPLIT = false>
// pf/ppi/pf_lines: prefetch ppi cache lines of pf per inner iteration, never beyond its first pf_lines lines; into L1
// for the memory-bound paths, into L2 for DOT tiles (see DOT_AHEAD).
inline void tile(const T* x, const T* w, int64_t K, float* out, int64_t ldo, const T* pf = nullptr, int ppi = 0,
                 int64_t pf_lines = 0, const float* xs = nullptr) {
  const int64_t xs_row = (K / STEP<T>) * 2 * LANES;  // floats of one split row
  constexpr int GROUPS = (R * C + ACC - 1) / ACC;
  constexpr int64_t line = 64 / sizeof(T);
  vec acc[GROUPS * ACC];
  for (int i = 0; i < GROUPS * ACC; ++i) acc[i] = vzero();
  int64_t k = 0;
  const T* pf_next = pf;
  int64_t pf_left = pf == nullptr ? 0 : pf_lines;
#pragma GCC unroll 2
  for (; k + STEP<T> <= K; k += STEP<T>) {
    for (int i = 0; i < ppi && pf_left > 0; ++i, --pf_left, pf_next += line)
      if constexpr (DOT) _mm_prefetch(reinterpret_cast<const char*>(pf_next), _MM_HINT_T1);
      else _mm_prefetch(reinterpret_cast<const char*>(pf_next), _MM_HINT_T0);
    if constexpr (!is_bf16<T>) {
      vec wv[C];
      for (int c = 0; c < C; ++c) wv[c] = vload(w + c * K + k);
      for (int r = 0; r < R; ++r) {
        vec xv = vload(x + r * K + k);
        if constexpr (C > 1 && R * C + C + 1 <= REGS) in_register(xv);  // one load for its C products
        for (int c = 0; c < C; ++c) acc[r * C + c] = vfma(xv, wv[c], acc[r * C + c]);
      }
    } else if constexpr (DOT) {
      raw wv[C];
      for (int c = 0; c < C; ++c) wv[c] = rload(w + c * K + k);
      for (int r = 0; r < R; ++r) {
        const raw xv = rload(x + r * K + k);
        for (int c = 0; c < C; ++c) acc[r * C + c] = vdot(xv, wv[c], acc[r * C + c]);
      }
    } else if constexpr (SPLIT && REGS < 32) {
      // 16 registers: the R rows' widened inputs stay in registers and each weight vector is widened and used at
      // once (R x C accumulators + 2R inputs + 2 weight halves; SPLIT_ROWS x SPLIT_COLS = 2 x 4 measured 1.2x the
      // 4 x 3 tiles that widened all C weight vectors first, which left too few registers)
      const float* p = xs + (k / STEP<T>) * 2 * LANES;
      vec xo[R], xe[R];
      for (int r = 0; r < R; ++r) xo[r] = vload(p + r * xs_row), xe[r] = vload(p + r * xs_row + LANES);
      for (int c = 0; c < C; ++c) {
        raw t = rload(w + c * K + k);
        in_register(t);
        const vec wo = odd_half(t), we = even_half(t);
        for (int r = 0; r < R; ++r) acc[r * C + c] = vfma(xe[r], we, vfma(xo[r], wo, acc[r * C + c]));
      }
    } else {
      vec wo[C], we[C];
      for (int c = 0; c < C; ++c) {
        raw t = rload(w + c * K + k);
        in_register(t);  // one load for both halves (two loads of each line measured 18% slower for one row)
        wo[c] = odd_half(t);
        we[c] = even_half(t);
      }
      for (int r = 0; r < R; ++r) {
        vec xo, xe;
        if constexpr (SPLIT) {
          const float* p = xs + r * xs_row + (k / STEP<T>) * 2 * LANES;
          xo = vload(p), xe = vload(p + LANES);
        } else {
          raw t = rload(x + r * K + k);
          in_register(t);
          xo = odd_half(t), xe = even_half(t);
        }
        for (int c = 0; c < C; ++c) acc[r * C + c] = vfma(xe, we[c], vfma(xo, wo[c], acc[r * C + c]));
      }
    }
  }
#if defined(__AVX512F__)
  if (k == K) {
    // no scalar tail: each group's sums put in accumulator order in a register and stored a row's run at a time (the
    // same values; reading them one by one from a stored vector cost ~400 cycles a tile on a Zen 4: half of a 6 x 4
    // tile's time at K = 576)
    for (int g = 0; g < GROUPS; ++g) {
      const vec sums = in_order(reduce(acc + g * ACC));
      for (int j = g * ACC; j < std::min((g + 1) * ACC, R * C);) {
        const int r = j / C, end = std::min({(r + 1) * C, (g + 1) * ACC, R * C});
        const __mmask16 run = static_cast<__mmask16>(((1u << (end - j)) - 1) << (j - g * ACC));
        _mm512_mask_storeu_ps(out + r * ldo + j % C, static_cast<__mmask16>((1u << (end - j)) - 1),
                              _mm512_maskz_compress_ps(run, sums));
        j = end;
      }
    }
    return;
  }
#endif
  float sums[GROUPS * ACC];
  for (int g = 0; g < GROUPS; ++g) vstore(sums + g * ACC, reduce(acc + g * ACC));
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const int j = r * C + c;
      float s = sums[(j / ACC) * ACC + LANE_OF[j % ACC]];
      for (int64_t t = k; t < K; ++t) s = std::fma(widen(x[r * K + t]), widen(w[c * K + t]), s);  // fixed: one fma
      out[r * ldo + c] = s;
    }
}

// The last rows of a block when M is not a multiple of TILE_ROWS: one tile of exactly that many rows.
template <typename T, int R, int C, bool DOT, bool SPLIT = false>
inline void last_rows(int64_t rest, const T* x, const T* w, int64_t K, float* out, int64_t ldo, const T* pf, int ppi,
                      int64_t pf_lines, const float* xs = nullptr) {
  if constexpr (R > 0) {
    if (rest == R) tile<T, R, C, DOT, SPLIT>(x, w, K, out, ldo, pf, ppi, pf_lines, xs);
    else last_rows<T, R - 1, C, DOT, SPLIT>(rest, x, w, K, out, ldo, pf, ppi, pf_lines, xs);
  }
}

template <typename T, int C, bool DOT = false, bool SPLIT = false, int RT = TILE_ROWS>
void rows_times_cols(const T* x, int64_t M, const T* w, int64_t K, float* out, int64_t N, const T* next,
                     const float* xs = nullptr) {
  // C weight rows times every input row. While the tiles of this block compute, the next block (C weight rows,
  // contiguous) is prefetched, spread evenly over all their inner iterations: memory and arithmetic overlap
  // instead of taking turns.
  constexpr int64_t line = 64 / sizeof(T);
  const int64_t chunks = (M + RT - 1) / RT, iters = K / STEP<T>;
  const int64_t lines = (C * K + line - 1) / line;  // the next block, exactly
  const int ppi = next == nullptr || iters == 0 ? 0 : static_cast<int>((lines + chunks * iters - 1) / (chunks * iters));
  int64_t m = 0, chunk = 0;
  auto share = [&](int64_t c) { return next == nullptr ? nullptr : next + c * iters * ppi * line; };
  auto left = [&](int64_t c) { return next == nullptr ? int64_t{0} : lines - c * iters * ppi; };
  if constexpr (DOT) {
    if (M <= DOT_ONE_TILE) {  // one tile: 5 or 6 rows as 4 + 1 or 4 + 2 measured 25% slower
      last_rows<T, DOT_ONE_TILE, C, DOT>(M, x, w, K, out, N, next,
                                         next == nullptr || iters == 0 ? 0 : (lines + iters - 1) / iters,
                                         lines);
      return;
    }
  }
  const int64_t xs_row = iters * 2 * LANES;
  auto split = [&](int64_t row) { return xs == nullptr ? nullptr : xs + row * xs_row; };
  for (; m + RT <= M; m += RT, ++chunk)
    tile<T, RT, C, DOT, SPLIT>(x + m * K, w, K, out + m * N, N, share(chunk), ppi, left(chunk), split(m));
  last_rows<T, RT - 1, C, DOT, SPLIT>(M - m, x + m * K, w, K, out + m * N, N, share(chunk), ppi, left(chunk),
                                             split(m));
}

// Whether this CPU's vdpbf16ps gives exactly the FMA path's bits (checked once when the module loads, see
// dot_matches_fma) and is the faster of the two here (dot_wanted): where not, every bf16 product takes the FMA path.
// DOT_ROWS: from this many input rows on the instruction is faster. Measured on a 2-core Zen 4 (bf16 products of a
// SmolLM2-135M forward, interleaved A/B against the FMA path, best of 9): 4 rows 8.6 -> 7.7 ms, 8 rows 15.0 -> 12.9,
// 16 rows 29.0 -> 16.5, 64 rows 110.6 -> 57.6.
bool DOT_WORKS = false;
constexpr int64_t DOT_ROWS = 4;

// DOT tiles prefetch the weight block DOT_AHEAD blocks ahead into L2 (not the next one into L1): with 8 rows a core
// spends as long computing a block as reading it, and the L1 has too few misses in flight to hide that read behind
// the arithmetic. Measured on a 2-core Zen 4 (bf16 products of a SmolLM2-135M forward, interleaved, median of 11):
// 8 rows 15.2 -> 10.4 ms, 12 rows 17.1 -> 13.3, 16 rows 16.8 -> 16.0, 6 rows 10.5 -> 10.2; for 1 and 2 rows the L2
// hint measured 10% slower than L1, so the memory-bound paths keep theirs.
constexpr int64_t DOT_AHEAD = 4;

// vdpbf16ps against two FMAs, lane by lane, on pseudo-random pairs of every magnitude (denormals, cancellations).
bool dot_matches_fma() {
  if constexpr (!HAS_DOT) {
    return false;
  } else {
    FlushDenormals flush(true);
    uint64_t state = 0x9E3779B97F4A7C15ull;
    auto next = [&]() {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      return state;
    };
    alignas(64) uint16_t a[2 * LANES], b[2 * LANES];
    alignas(64) float c[LANES], got[LANES], want[LANES];
    for (int trial = 0; trial < 20000; ++trial) {
      const int spread = trial % 4 == 0 ? 250 : (trial % 4 == 1 ? 60 : 12);  // exponent spread of the values
      for (int i = 0; i < 2 * LANES; ++i) {
        const uint64_t r = next();
        const int ea = 127 + static_cast<int>(r % spread) - spread / 2;
        const int eb = 127 + static_cast<int>((r >> 8) % spread) - spread / 2;
        a[i] = static_cast<uint16_t>(((r >> 16) & 0x8000) | (std::clamp(ea, 0, 254) << 7) | ((r >> 20) & 0x7F));
        b[i] = static_cast<uint16_t>(((r >> 27) & 0x8000) | (std::clamp(eb, 0, 254) << 7) | ((r >> 32) & 0x7F));
      }
      for (int i = 0; i < LANES; ++i) {
        const uint64_t r = next();
        const int e = std::clamp(127 + static_cast<int>(r % spread) - spread / 2, 0, 254);
        const uint32_t bits = static_cast<uint32_t>(((r & 1) << 31) | (static_cast<uint64_t>(e) << 23) | ((r >> 8) & 0x7FFFFF));
        std::memcpy(c + i, &bits, 4);
      }
      const raw xa = rload(reinterpret_cast<const at::BFloat16*>(a));
      const raw wb = rload(reinterpret_cast<const at::BFloat16*>(b));
      const vec acc = vload(c);
      vstore(got, vdot(xa, wb, acc));
      vstore(want, vfma(even_half(xa), even_half(wb), vfma(odd_half(xa), odd_half(wb), acc)));
      if (std::memcmp(got, want, sizeof(got)) != 0) return false;
    }
    return true;
  }
}

// Whether the vdpbf16ps tiles are faster than the FMA path on this CPU: they are on a Zen 4 (one instruction a cycle,
// twice the products of an FMA), not on a 2-core Xeon (Emerald Rapids, model 207), where the instruction issues ~0.4
// a cycle against two FMAs a cycle: a register loop gave 1.1 vdpbf16ps/ns against 5.5 FMA/ns per core, and a
// SmolLM2-135M forward over 16 tokens took 48.6 ms with them against 41.5 ms without. Both give the same bits, so the
// choice is only about speed: timed once when the module loads (8 rows x 64 weight rows x 576, in cache, alternated,
// best of 7 each, ~2 ms), the instruction kept where it is 10% faster or more. DRAFTTREE_BF16_DOT=0/1 overrides.
bool dot_wanted() {
  if (const char* env = std::getenv("DRAFTTREE_BF16_DOT")) {
    if (std::strcmp(env, "0") == 0) return false;
    if (std::strcmp(env, "1") == 0) return true;
  }
  if constexpr (!HAS_DOT) {
    return false;
  } else {
    using B = at::BFloat16;
    constexpr int64_t M = 8, N = 64, K = 576;
    std::vector<B> x(M * K), w(N * K);
    std::vector<float> out(M * N);
    for (int64_t i = 0; i < M * K; ++i) x[i] = B(static_cast<float>((i * 37) % 101) / 101.0f - 0.5f);
    for (int64_t i = 0; i < N * K; ++i) w[i] = B(static_cast<float>((i * 53) % 97) / 97.0f - 0.5f);
    FlushDenormals flush(true);
    auto run = [&](bool dot) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int rep = 0; rep < 8; ++rep)
        for (int64_t n = 0; n < N; n += TILE_COLS) {
          if (dot) rows_times_cols<B, TILE_COLS, true>(x.data(), M, w.data() + n * K, K, out.data() + n, N, nullptr);
          else rows_times_cols<B, TILE_COLS, false>(x.data(), M, w.data() + n * K, K, out.data() + n, N, nullptr);
        }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    double best_dot = 1e9, best_fma = 1e9;
    for (int i = 0; i < 7; ++i) best_dot = std::min(best_dot, run(true)), best_fma = std::min(best_fma, run(false));
    return best_dot * 1.1 <= best_fma;
  }
}

// bf16 rows widened to float32 for SPLIT tiles: per row and inner iteration, the LANES odd elements then the LANES
// even ones (odd_half / even_half of that step's raw vector: exact, the same values the tile would compute). The
// last K % STEP elements are left out; the tiles' scalar tail reads them from x.
template <typename T>
std::unique_ptr<float[]> split_rows(const T* x, int64_t M, int64_t K) {
  const int64_t iters = K / STEP<T>;
  if (iters == 0) return nullptr;
  std::unique_ptr<float[]> xs(new float[M * iters * 2 * LANES]);  // every element written below: no zero fill
  for (int64_t r = 0; r < M; ++r)
    for (int64_t i = 0; i < iters; ++i) {
      const raw t = rload(x + r * K + i * STEP<T>);
      float* p = xs.get() + (r * iters + i) * 2 * LANES;
      vstore(p, odd_half(t));
      vstore(p + LANES, even_half(t));
    }
  return xs;
}

// One weight matrix of a product: its N rows and where its [M, N] float32 sums go; for bf16 weights, also where the
// sums (plus the bias, in float32) go rounded to bf16, by the thread that computed them: the same values as torch's
// add_ and .to(bfloat16) of the float32 outputs, without those two passes and tensors per product.
template <typename T>
struct Segment {
  const T* w;
  int64_t N;
  float* out;
  at::BFloat16* rounded = nullptr;
  const float* bias = nullptr;
};

// A float32 row alone streams best in tiles of ACC weight rows on the hardware prefetchers alone; a bf16 row (and
// several rows) in narrow blocks with the next one prefetched. Both paths sum each output in the same order.
template <typename T>
constexpr bool wide_one_row(int64_t M) { return M == 1 && !std::is_same_v<T, at::BFloat16>; }

// Weight rows [n, n + step) of one segment times every input row.
template <typename T>
inline void block(const T* x, int64_t M, int64_t K, const Segment<T>& seg, int64_t n, int64_t step, bool few,
                  bool dot, const float* xs) {
  const int64_t N = seg.N;
  const T* w = seg.w;
  float* out = seg.out;
  if (n + step <= N) {
    // the next block is prefetched while this one computes (4+ rows: the linears of a SmolLM2 forward 4 rows
    // 27 -> 24 ms, 16 rows 50 -> 42; a bf16 row alone on Zen 4 19-22 -> 33-37 GB/s); see wide_one_row
    const int64_t ahead = is_bf16<T> && HAS_DOT && dot && !few ? DOT_AHEAD : 1;
    const T* next = n + (ahead + 1) * step <= N ? w + (n + ahead * step) * K : nullptr;
    if (wide_one_row<T>(M)) tile<T, 1, ACC>(x, w + n * K, K, out + n, N);
    else if (few) rows_times_cols<T, FEW_ROWS_COLS>(x, M, w + n * K, K, out + n, N, next);
    else if (is_bf16<T> && HAS_DOT && dot) rows_times_cols<T, TILE_COLS, true>(x, M, w + n * K, K, out + n, N, next);
    else if (xs != nullptr) rows_times_cols<T, SPLIT_COLS, false, true, SPLIT_ROWS>(x, M, w + n * K, K, out + n, N, next, xs);
    else rows_times_cols<T, TILE_COLS>(x, M, w + n * K, K, out + n, N, next);
  } else {
    for (int64_t j = n; j < N; ++j)
      for (int64_t m = 0; m < M; ++m) tile<T, 1, 1>(x + m * K, w + j * K, K, out + m * N + j, N);
  }
}

// The same input rows times several weight matrices (q/k/v, gate/up) in one pass over all their blocks: one
// fork/join of the threads instead of one per matrix, and small matrices shared out evenly.
template <typename T>
void gemm(const T* x, int64_t M, int64_t K, const std::vector<Segment<T>>& segs) {
  if (M == 0) return;
  // one float32 row: ACC weight rows per tile; fewer rows than a tile (or one bf16 row): FEW_ROWS_COLS weight rows
  // (memory-bound: prefetched blocks); more: TILE_ROWS x TILE_COLS tiles (bound by arithmetic: every register used)
  const bool few = M < TILE_ROWS;
  const bool dot = DOT_WORKS && M >= DOT_ROWS;
  // bf16 tiles on the FMA path widen the input rows once here instead of once per block (split_rows), and take
  // SPLIT_ROWS x SPLIT_COLS tiles
  std::unique_ptr<float[]> xs;
  if constexpr (is_bf16<T>) {
    if (!few && !dot) xs = split_rows(x, M, K);
  }
  const float* xsp = xs.get();
  const int64_t step = wide_one_row<T>(M) ? ACC : (few ? FEW_ROWS_COLS : (xsp != nullptr ? SPLIT_COLS : TILE_COLS));
  std::vector<int64_t> first(segs.size() + 1, 0);  // first block of each segment
  for (size_t s = 0; s < segs.size(); ++s) first[s + 1] = first[s] + (segs[s].N + step - 1) / step;
  at::parallel_for(0, first.back(), M == 1 ? 8 : 16, [&](int64_t b0, int64_t b1) {
    {
      FlushDenormals flush(is_bf16<T>);
      size_t s = std::upper_bound(first.begin(), first.end(), b0) - first.begin() - 1;
      for (int64_t b = b0; b < b1; ++b) {
        while (b >= first[s + 1]) ++s;
        block<T>(x, M, K, segs[s], (b - first[s]) * step, step, few, dot, xsp);
      }
    }
    // this thread's columns of each segment, rounded to bf16 where asked (row by row: contiguous runs), with IEEE
    // denormals as torch's add_ and conversion had them
    for (size_t s = 0; s < segs.size(); ++s) {
      const int64_t lo = std::max(b0, first[s]), hi = std::min(b1, first[s + 1]);
      if (segs[s].rounded == nullptr || lo >= hi) continue;
      const int64_t N = segs[s].N, c0 = (lo - first[s]) * step, c1 = std::min((hi - first[s]) * step, N);
      for (int64_t m = 0; m < M; ++m)
        round_run(segs[s].out + m * N + c0, segs[s].bias == nullptr ? nullptr : segs[s].bias + c0,
                  segs[s].rounded + m * N + c0, c1 - c0);
    }
  });
}

}  // namespace

namespace drafttree_kernels {

// y_i = x W_i^T (+ b_i) for every i, in one call.
std::vector<torch::Tensor> linears(const torch::Tensor& x, const std::vector<torch::Tensor>& ws,
                                   const std::vector<c10::optional<torch::Tensor>>& biases) {
  TORCH_CHECK(!ws.empty() && (biases.empty() || biases.size() == ws.size()), "small_gemm: one bias per weight");
  TORCH_CHECK(x.device().is_cpu(), "small_gemm: CPU tensors only");
  for (const auto& w : ws) {
    TORCH_CHECK(w.device().is_cpu(), "small_gemm: CPU tensors only");
    TORCH_CHECK(x.scalar_type() == w.scalar_type(), "small_gemm: x and w must share a dtype");
    TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && x.size(-1) == w.size(1), "small_gemm: bad shapes");
  }
  auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  const int64_t M = x2.size(0), K = x2.size(1);
  auto bias = [&](size_t i) { return !biases.empty() && biases[i].has_value(); };
  std::vector<torch::Tensor> outs;
  if (x.scalar_type() == torch::kFloat32) {
    std::vector<Segment<float>> segs;
    for (const auto& w : ws) {
      outs.push_back(torch::empty({M, w.size(0)}, x.options()));
      segs.push_back({w.data_ptr<float>(), w.size(0), outs.back().data_ptr<float>()});
    }
    gemm<float>(x2.data_ptr<float>(), M, K, segs);
    for (size_t i = 0; i < ws.size(); ++i)
      if (bias(i)) outs[i].add_(biases[i]->to(torch::kFloat32));
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "small_gemm: float32 or bfloat16 weights only");
    std::vector<torch::Tensor> fbias(ws.size());
    for (size_t i = 0; i < ws.size(); ++i)
      if (bias(i)) {
        fbias[i] = biases[i]->to(torch::kFloat32).contiguous();
        TORCH_CHECK(fbias[i].numel() == ws[i].size(0), "small_gemm: bad bias");
      }
    // each weight on its packed copy where one backend takes it (AMX tiles, AVX2 panels: packed_weights.cpp), else on
    // the vector path: a weight's result never depends on the weights computed with it
    std::vector<size_t> tiled, vectored;
    for (size_t i = 0; i < ws.size(); ++i) (packable(ws[i]) ? tiled : vectored).push_back(i);
    outs.resize(ws.size());
    if (!tiled.empty()) {
      std::vector<torch::Tensor> tw, tb;
      for (size_t i : tiled) tw.push_back(ws[i]), tb.push_back(fbias[i]);
      auto got = packed_linears(x2, tw, tb);
      for (size_t j = 0; j < tiled.size(); ++j) outs[tiled[j]] = got[j];
    }
    if (!vectored.empty()) {
      int64_t total = 0;
      for (size_t i : vectored) total += M * ws[i].size(0);
      thread_local std::vector<float> sums;  // the float32 sums, before round_run
      if (static_cast<int64_t>(sums.size()) < total) sums.resize(total);
      std::vector<Segment<at::BFloat16>> segs;
      int64_t offset = 0;
      for (size_t i : vectored) {
        const int64_t N = ws[i].size(0);
        outs[i] = torch::empty({M, N}, x.options());
        segs.push_back({ws[i].data_ptr<at::BFloat16>(), N, sums.data() + offset, outs[i].data_ptr<at::BFloat16>(),
                        bias(i) ? fbias[i].data_ptr<float>() : nullptr});
        offset += M * N;
      }
      gemm<at::BFloat16>(x2.data_ptr<at::BFloat16>(), M, K, segs);
    }
  }
  auto sizes = x.sizes().vec();
  for (size_t i = 0; i < ws.size(); ++i) {
    sizes.back() = ws[i].size(0);
    outs[i] = outs[i].view(sizes);
  }
  return outs;
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias) {
  return linears(x, {w}, {bias})[0];
}

// A gated MLP, down(silu(gate(x)) * up(x)), in one call from Python: the products by the kernel, the activation and
// the product by torch's own elementwise ops on the rounded products, so the bits are those of the module's forward
// with the kernel's linear layers; only the Python between them is gone (~35 us a layer).
torch::Tensor gated_mlp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up,
                        const torch::Tensor& down, const std::vector<c10::optional<torch::Tensor>>& biases) {
  TORCH_CHECK(biases.empty() || biases.size() == 3, "gated_mlp: no biases, or one per weight (gate, up, down)");
  const c10::optional<torch::Tensor> none;
  auto gu = biases.empty() ? linears(x, {gate, up}, {}) : linears(x, {gate, up}, {biases[0], biases[1]});
  auto h = at::silu(gu[0]).mul_(gu[1]);
  return linears(h, {down}, {biases.empty() ? none : biases[2]})[0];
}

}  // namespace drafttree_kernels

namespace {
std::string env_word(const char* name) {  // a switch's value, trimmed and lower-cased ("" when unset)
  const char* v = std::getenv(name);
  if (v == nullptr) return "";
  std::string s(v);
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
bool env_says_off(const char* name) {  // 0 / off / false / no, as the Python side reads its switches
  const std::string s = env_word(name);
  return s == "0" || s == "off" || s == "false" || s == "no";
}
bool env_says_on(const char* name) {
  const std::string s = env_word(name);
  return s == "1" || s == "on" || s == "true" || s == "yes";
}

// Panels where the vector path is AVX2 (8 lanes: measured faster there) or DRAFTTREE_PANELS=1 asks for them; never with
// AMX on; DRAFTTREE_PANELS=0 keeps the vector path. Returns whether they are on now.
bool set_panels(bool on) {
  drafttree_kernels::PANELS_ON = on && drafttree_kernels::PANELS_READY && !drafttree_kernels::AMX_ON;
  return drafttree_kernels::PANELS_ON;
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  init_lanes();
  const bool exact = dot_matches_fma();
  DOT_WORKS = exact && dot_wanted();
  m.attr("bf16_dot_exact") = exact;  // this CPU's vdpbf16ps gives the FMA path's bits
  m.attr("lanes") = LANES;  // the backend built here (16: AVX-512, 8: AVX2), part of cached cost curves' key
  m.attr("bf16_dot") = DOT_WORKS;  // many-row bf16 products take vdpbf16ps (exact, and the faster path here)
  using drafttree_kernels::AMX_ON, drafttree_kernels::AMX_READY;
  AMX_ON = AMX_READY && !env_says_off("DRAFTTREE_AMX");
  m.attr("amx_ready") = AMX_READY;  // this build and this process can use AMX tiles
  m.attr("amx") = AMX_ON;  // bf16 products of every row count take them (amx_gemm.cpp), unless DRAFTTREE_AMX=0
  set_panels(env_says_on("DRAFTTREE_PANELS") || (LANES == 8 && !env_says_off("DRAFTTREE_PANELS")));
  m.attr("panels_ready") = drafttree_kernels::PANELS_READY;
  m.def("panels_on", []() { return drafttree_kernels::PANELS_ON; });  // bf16 products on AVX2 panels (panel_gemm.cpp)
  m.def("set_panels", &set_panels, py::arg("on"));  // switch them (tests, in-process A/B): whether they are on now
  m.def("linear", &drafttree_kernels::linear, py::arg("x"), py::arg("w"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>());  // only torch ops inside: other Python threads keep running
  m.def("linears", &drafttree_kernels::linears, py::arg("x"), py::arg("ws"), py::arg("biases"),
        py::call_guard<py::gil_scoped_release>());
  m.def("gated_mlp", &drafttree_kernels::gated_mlp, py::arg("x"), py::arg("gate"), py::arg("up"), py::arg("down"),
        py::arg("biases"),
        py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm", &drafttree_kernels::rms_norm, py::arg("x"), py::arg("w"), py::arg("eps"),
        py::call_guard<py::gil_scoped_release>());
  m.def("apply_token_bitmask", &drafttree_kernels::apply_token_bitmask, py::arg("logits"), py::arg("bits"),
        py::call_guard<py::gil_scoped_release>());
  m.def("rotary", &drafttree_kernels::rotary, py::arg("q"), py::arg("k"), py::arg("cos"), py::arg("sin"),
        py::call_guard<py::gil_scoped_release>());
  m.def("tree_attention", &drafttree_kernels::tree_attention, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("mask"), py::arg("q_row"), py::arg("q_node"), py::arg("key_len"), py::arg("per_row"),
        py::arg("scale"), py::call_guard<py::gil_scoped_release>());
  m.def("packable", &drafttree_kernels::packable, py::arg("w"));  // a packed backend (AMX, panels) takes it here
  m.def("pack_weight", &drafttree_kernels::pack_weight, py::arg("w"), py::call_guard<py::gil_scoped_release>());
  m.def("register_packed", &drafttree_kernels::register_packed, py::arg("w"), py::arg("packed"),
        py::call_guard<py::gil_scoped_release>());
  m.def("forget_packed", &drafttree_kernels::forget_packed, py::call_guard<py::gil_scoped_release>());
  m.def("decode_layer", &drafttree_kernels::decode_layer, py::call_guard<py::gil_scoped_release>());
  m.attr("prompt_attention_ready") = drafttree_kernels::prompt_attention_ready();  // AVX-512 bf16 build
  m.def("prompt_attention", &drafttree_kernels::prompt_attention, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("scale"), py::call_guard<py::gil_scoped_release>());
}
