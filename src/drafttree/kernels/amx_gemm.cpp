// bf16 products on Intel AMX tiles (Sapphire/Emerald/Granite Rapids), for every row count the kernel takes.
//
// Why: a vector-FMA tile is bound by arithmetic from ~4 rows on, so a 16-token tree cost ~2.2 one-token steps on an
// AMX Xeon; one tdpbf16ps multiplies a 16-row input tile by a 16-column weight tile over 32 elements of K at once,
// so up to 16 rows cost what one row costs (the weights' read from memory), 32 rows little more.
// Numerics: float32 sums of exact bf16 products (denormals flushed, as the instruction does), in one fixed order per
// output: K from first to last, whatever the number of rows, so a row's result never depends on the rows computed
// with it; every row count (1 to the kernel's limit) takes this path, so a tree gives the logits a one-token step
// would. The sums differ in order from the vector path's, as two GEMM libraries' do.
// Weights are repacked once into tiles ([N/16, K/32, 16 pairs of K, 16 columns x 2]) and kept beside the original
// (looked up by the weight's storage; a weight freed or changed in place is repacked).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
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

struct Packed {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // the weight's: expired once it is freed
  int64_t version;
  std::vector<int64_t> sizes;
  torch::Tensor tiles;
};
std::mutex packed_lock;
// never destroyed: at exit its tensors may view memory that Python already freed (a huge-page mapping)
std::unordered_map<const void*, Packed>& packed_cache = *new std::unordered_map<const void*, Packed>();

int64_t version_of(const torch::Tensor& w) { return w.is_inference() ? -1 : static_cast<int64_t>(w._version()); }

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

// Input rows [m, m + 16 * (1 + TWO_ROWS)) (x padded to whole tiles, row stride K) times one or two 16-column weight
// blocks (w0, w1: their K / 32 tiles in a row), the float32 sums written to c (row stride 32 floats).
template <bool TWO_ROWS, bool TWO_COLS>
void tile_pair(const BF16* x, int64_t K, const BF16* w0, const BF16* w1, float* c) {
  const int64_t chunks = K / 32, stride = K * static_cast<int64_t>(sizeof(BF16));
  _tile_zero(0);
  if constexpr (TWO_COLS) _tile_zero(1);
  if constexpr (TWO_ROWS) _tile_zero(2);
  if constexpr (TWO_ROWS && TWO_COLS) _tile_zero(3);
  for (int64_t kc = 0; kc < chunks; ++kc) {
    _tile_loadd(4, x + kc * 32, stride);
    _tile_loadd(6, w0 + kc * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TWO_COLS) {
      _tile_loadd(7, w1 + kc * 512, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (TWO_ROWS) {
      _tile_loadd(5, x + 16 * K + kc * 32, stride);
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

bool amx_packable(const torch::Tensor& w) {
  return AMX_ON && w.scalar_type() == torch::kBFloat16 && w.dim() == 2 && w.size(0) % 16 == 0 &&
         w.size(1) % 32 == 0 && w.size(0) > 0 && w.size(1) > 0 && w.is_contiguous();
}

// The weight's tiles: repacked on first use, and again after the weight changed (in place, or freed and another
// tensor put at its address); entries of freed weights are dropped when a new one is packed.
torch::Tensor amx_tiles(const torch::Tensor& w) {
  std::lock_guard<std::mutex> guard(packed_lock);
  const void* key = w.data_ptr();
  auto it = packed_cache.find(key);
  const auto* storage = w.storage().unsafeGetStorageImpl();
  if (it != packed_cache.end() && it->second.storage.lock().get() == storage &&
      it->second.version == version_of(w) && it->second.sizes == w.sizes().vec())
    return it->second.tiles;
  for (auto i = packed_cache.begin(); i != packed_cache.end();) i = i->second.storage.expired() ? packed_cache.erase(i) : std::next(i);
  const int64_t N = w.size(0), K = w.size(1);
  torch::Tensor tiles;
  {
    c10::InferenceMode guard_inference;
    tiles = w.detach().view({N / 16, 16, K / 32, 16, 2}).permute({0, 2, 3, 1, 4}).contiguous().view({N / 16, K / 32, 512});
  }
  packed_cache.erase(key);
  packed_cache.emplace(key, Packed{w.storage().getWeakStorageImpl(), version_of(w), w.sizes().vec(), tiles});
  return tiles;
}

// Tiles packed by the caller (in memory of its choice: gemm.pack_tiles puts a model's in huge pages) for weight w.
void amx_register(const torch::Tensor& w, const torch::Tensor& tiles) {
  TORCH_CHECK(amx_packable(w) && tiles.scalar_type() == torch::kBFloat16 && tiles.is_contiguous() &&
              tiles.numel() == w.numel(), "amx_register: not a packable weight and its tiles");
  std::lock_guard<std::mutex> guard(packed_lock);
  packed_cache.erase(w.data_ptr());
  packed_cache.emplace(w.data_ptr(), Packed{w.storage().getWeakStorageImpl(), version_of(w), w.sizes().vec(),
                                            tiles.view({w.size(0) / 16, w.size(1) / 32, 512})});
}

// y_i = x W_i^T (+ b_i) for bf16 weights that amx_packable() took: as linears() (its bf16 branch), on AMX tiles.
std::vector<torch::Tensor> amx_linears(const torch::Tensor& x2, const std::vector<torch::Tensor>& ws,
                                       const std::vector<torch::Tensor>& fbias) {
  const int64_t M = x2.size(0), K = x2.size(1);
  std::vector<torch::Tensor> outs, tiles;
  std::vector<int64_t> first(ws.size() + 1, 0);  // first unit (pair of 16-column blocks) of each weight
  for (size_t s = 0; s < ws.size(); ++s) {
    tiles.push_back(amx_tiles(ws[s]));
    outs.push_back(torch::empty({M, ws[s].size(0)}, x2.options()));
    first[s + 1] = first[s] + (ws[s].size(0) / 16 + 1) / 2;
  }
  if (M == 0) return outs;
#ifdef DRAFTTREE_AMX
  // up to 16 rows: tiles of exactly M rows; more: whole tiles of 16, the rows past M zero (their sums never read)
  const int64_t padded = M <= 16 ? M : (M + 15) / 16 * 16;
  const int tile_rows = static_cast<int>(std::min<int64_t>(M, 16));
  const BF16* xd = x2.data_ptr<BF16>();
  thread_local std::vector<BF16> pad;
  if (padded != M) {
    if (static_cast<int64_t>(pad.size()) < padded * K) pad.resize(padded * K);
    std::memcpy(pad.data(), xd, M * K * sizeof(BF16));
    std::memset(static_cast<void*>(pad.data() + M * K), 0, (padded - M) * K * sizeof(BF16));
    xd = pad.data();
  }
  at::parallel_for(0, first.back(), 1, [&](int64_t u0, int64_t u1) {
    configure_tiles(tile_rows);
    thread_local std::vector<float> sums;
    if (static_cast<int64_t>(sums.size()) < (padded + 15) / 16 * 16 * 32) sums.resize((padded + 15) / 16 * 16 * 32);
    size_t s = std::upper_bound(first.begin(), first.end(), u0) - first.begin() - 1;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= first[s + 1]) ++s;
      const int64_t N = ws[s].size(0), blocks = N / 16, b = 2 * (u - first[s]);
      const bool two_cols = b + 1 < blocks;
      const BF16* w0 = tiles[s].data_ptr<BF16>() + b * (K / 32) * 512;
      const BF16* w1 = two_cols ? w0 + (K / 32) * 512 : nullptr;
      for (int64_t m = 0; m < padded; m += 32) {
        const BF16* xm = xd + m * K;
        float* c = sums.data() + m * 32;
        const bool two_rows = m + 16 < padded;
        if (two_rows && two_cols) tile_pair<true, true>(xm, K, w0, w1, c);
        else if (two_rows) tile_pair<true, false>(xm, K, w0, w1, c);
        else if (two_cols) tile_pair<false, true>(xm, K, w0, w1, c);
        else tile_pair<false, false>(xm, K, w0, w1, c);
      }
      const int64_t width = two_cols ? 32 : 16, n0 = b * 16;
      const float* bias = fbias[s].defined() ? fbias[s].data_ptr<float>() + n0 : nullptr;
      BF16* out = outs[s].data_ptr<BF16>();
      for (int64_t r = 0; r < M; ++r) round_run(sums.data() + r * 32, bias, out + r * N + n0, width);
    }
    _tile_release();
  });
#else
  TORCH_CHECK(false, "amx_linears: this build has no AMX");
#endif
  return outs;
}

}  // namespace drafttree_kernels
