// bf16 products on Intel AMX tiles (Sapphire/Emerald/Granite Rapids), for every row count.
//
// Why: a vector-FMA tile is bound by arithmetic from ~4 rows on, so a 16-token tree cost ~2.2 one-token steps on an
// AMX Xeon; one tdpbf16ps multiplies a 16-row input tile by a 16-column weight tile over 32 elements of K at once,
// so up to 16 rows cost what one row costs (the weights' read from memory), 32 rows little more.
// Numerics: float32 sums of exact bf16 products (denormals flushed, as the instruction does), in one fixed order per
// output: K from first to last, whatever the number of rows, so a row's result never depends on the rows computed
// with it; every row count (a token, a tree, a prompt) takes this path, so a tree gives the logits a one-token step
// would. The sums differ in order from the vector path's, as two GEMM libraries' do.
// Weights are repacked once into tiles (amx_pack) and kept beside the original (packed_weights.cpp).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DRAFTTREE_AMX 1
#endif

namespace drafttree_kernels {
namespace {
using BF16 = at::BFloat16;

bool amx_usable() {
#ifdef DRAFTTREE_AMX
  // Linux hands out the tile registers' state only on request (once per process: ARCH_REQ_XCOMP_PERM, XTILEDATA)
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  return false;
#endif
}

#ifdef DRAFTTREE_AMX
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3: sums (2 row blocks x 2 column blocks), 4-5: input rows, 6-7: weights; all 64 bytes wide, the weights'
// 16 rows (pairs of K), the others `rows` (up to 16 input rows: exactly as many, which measured 2x faster for one row
// than 16 rows of which 15 are padding)
void configure_tiles(int rows) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = t < 6 ? rows : 16;
  _tile_loadconfig(&cfg);
}

// One or two blocks of input rows (x, and x1 for the second; row stride K) times one or two 16-column weight
// blocks (w0, w1: their tiles `step` elements apart along K), the float32 sums written to c (row stride 32 floats).
template <bool TWO_ROWS, bool TWO_COLS>
void tile_pair(const BF16* x, const BF16* x1, int64_t K, const BF16* w0, const BF16* w1, int64_t step, float* c) {
  const int64_t chunks = K / 32, stride = K * static_cast<int64_t>(sizeof(BF16));
  _tile_zero(0);
  if constexpr (TWO_COLS) _tile_zero(1);
  if constexpr (TWO_ROWS) _tile_zero(2);
  if constexpr (TWO_ROWS && TWO_COLS) _tile_zero(3);
  for (int64_t kc = 0; kc < chunks; ++kc) {
    _tile_loadd(4, x + kc * 32, stride);
    _tile_loadd(6, w0 + kc * step, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TWO_COLS) {
      _tile_loadd(7, w1 + kc * step, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (TWO_ROWS) {
      _tile_loadd(5, x1 + kc * 32, stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (TWO_COLS) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 128);
  if constexpr (TWO_COLS) _tile_stored(1, c + 16, 128);
  if constexpr (TWO_ROWS) _tile_stored(2, c + 16 * 32, 128);
  if constexpr (TWO_ROWS && TWO_COLS) _tile_stored(3, c + 16 * 32 + 16, 128);
}
#endif

}  // namespace

const bool AMX_READY = amx_usable();
bool AMX_ON = false;

namespace {
bool tile_shape(const torch::Tensor& w) {  // bf16 [N, K], N a multiple of 16 (columns of a tile), K of 32
  return w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.size(0) % 16 == 0 && w.size(1) % 32 == 0 &&
         w.size(0) > 0 && w.size(1) > 0;
}
}  // namespace

bool amx_packable(const torch::Tensor& w) {
  return AMX_ON && w.device().is_cpu() && tile_shape(w) && w.is_contiguous();
}

// A weight [N, K] as tiles of 16 pairs of K x 16 columns x 2 (1 KiB; tdpbf16ps's layout), the blocks of 16 columns
// in pairs whose tiles alternate along K ([N / 32][K / 32][2][16][16][2]), an odd last block's tiles after them.
torch::Tensor amx_pack(const torch::Tensor& w) {
  TORCH_CHECK(tile_shape(w), "amx_pack: a bf16 weight of 16k rows and 32k columns");
  c10::InferenceMode guard;
  const int64_t N = w.size(0), K = w.size(1), paired = N / 32 * 32;
  auto out = torch::empty({N * K}, w.options());
  if (paired > 0)
    out.narrow(0, 0, paired * K)
        .view({paired / 32, K / 32, 2, 16, 16, 2})
        .copy_(w.narrow(0, 0, paired).view({paired / 32, 2, 16, K / 32, 16, 2}).permute({0, 3, 1, 4, 2, 5}));
  if (paired < N)
    out.narrow(0, paired * K, 16 * K).view({K / 32, 16, 16, 2})
        .copy_(w.narrow(0, paired, 16).view({16, K / 32, 16, 2}).permute({1, 2, 0, 3}));
  return out;
}

// y_i = x W_i^T (+ b_i) for bf16 weights that amx_packable() took: as linears() (its bf16 branch), on AMX tiles.
std::vector<torch::Tensor> amx_linears(const torch::Tensor& x2, const std::vector<torch::Tensor>& ws,
                                       const std::vector<torch::Tensor>& fbias) {
  const int64_t M = x2.size(0), K = x2.size(1);
  std::vector<torch::Tensor> outs, tiles;
  std::vector<int64_t> first(ws.size() + 1, 0);  // first unit (pair of 16-column blocks) of each weight
  for (size_t s = 0; s < ws.size(); ++s) {
    tiles.push_back(packed_weight(ws[s]));
    outs.push_back(torch::empty({M, ws[s].size(0)}, x2.options()));
    first[s + 1] = first[s] + (ws[s].size(0) / 16 + 1) / 2;
  }
  if (M == 0) return outs;
#ifdef DRAFTTREE_AMX
  // up to 16 rows: tiles of exactly M rows; more: blocks of 16, the last one ending at row M (it overlaps the one
  // before; a tile row's sums do not depend on the others, so the overlap's rows are the same and written once)
  const int tile_rows = static_cast<int>(std::min<int64_t>(M, 16));
  const int64_t blocks_of_rows = (M + 15) / 16;
  const BF16* xd = x2.data_ptr<BF16>();
  auto start = [&](int64_t r) { return M <= 16 ? int64_t{0} : std::min(r * 16, M - 16); };
  at::parallel_for(0, first.back(), 1, [&](int64_t u0, int64_t u1) {
    configure_tiles(tile_rows);
    float sums[32 * 32];
    size_t s = std::upper_bound(first.begin(), first.end(), u0) - first.begin() - 1;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= first[s + 1]) ++s;
      const int64_t N = ws[s].size(0), blocks = N / 16, b = 2 * (u - first[s]);
      const bool two_cols = b + 1 < blocks;
      // a pair's tiles interleaved along K (one stream of 2 KiB steps), an odd last block's alone
      const BF16* w0 = tiles[s].data_ptr<BF16>() + b * (K / 32) * 512;
      const BF16* w1 = two_cols ? w0 + 512 : nullptr;
      const int64_t step = two_cols ? 1024 : 512, width = two_cols ? 32 : 16, n0 = b * 16;
      const float* bias = fbias[s].defined() ? fbias[s].data_ptr<float>() + n0 : nullptr;
      BF16* out = outs[s].data_ptr<BF16>();
      for (int64_t r = 0; r < blocks_of_rows; r += 2) {
        const bool two_rows = r + 1 < blocks_of_rows;
        const BF16* x0 = xd + start(r) * K;
        const BF16* x1 = two_rows ? xd + start(r + 1) * K : nullptr;
        if (two_rows && two_cols) tile_pair<true, true>(x0, x1, K, w0, w1, step, sums);
        else if (two_rows) tile_pair<true, false>(x0, x1, K, w0, w1, step, sums);
        else if (two_cols) tile_pair<false, true>(x0, x1, K, w0, w1, step, sums);
        else tile_pair<false, false>(x0, x1, K, w0, w1, step, sums);
        for (int64_t row = r * 16; row < std::min(M, (r + 2) * 16); ++row) {  // sums row: block, then row in it
          const int64_t block = row < (r + 1) * 16 ? r : r + 1;
          round_run(sums + ((block - r) * 16 + row - start(block)) * 32, bias, out + row * N + n0, width);
        }
      }
    }
    _tile_release();
  });
#else
  TORCH_CHECK(false, "amx_linears: this build has no AMX");
#endif
  return outs;
}

}  // namespace drafttree_kernels
