// Weights repacked once for a bf16 backend that reads them in its own layout (AMX tiles: amx_gemm.cpp; panels on
// AVX2: panel_gemm.cpp) and kept beside the original, looked up by (address, rows, columns) and checked against the
// weight's storage and version counter: a weight freed or changed in place is repacked. At most one backend is on
// in a process (AMX where the CPU has it, else panels where they are on), so one cache serves both.
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace drafttree_kernels {
namespace {

struct Packed {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // the weight's: expired once it is freed
  int64_t version;
  torch::Tensor packed;
};
using Key = std::tuple<const void*, int64_t, int64_t>;  // (address, N, K): a view of a weight's first rows is its own
std::mutex packed_lock;
// never destroyed: at exit its tensors may view memory that Python already freed (a huge-page mapping)
std::map<Key, Packed>& packed_cache = *new std::map<Key, Packed>();

Key key_of(const torch::Tensor& w) { return {w.data_ptr(), w.size(0), w.size(1)}; }

// Entries of freed weights leave the cache (into `dropped`, destroyed by the caller after it let go of the lock: a
// huge-page mapping's deleter takes the GIL).
void sweep(std::vector<Packed>& dropped) {
  for (auto i = packed_cache.begin(); i != packed_cache.end();) {
    if (i->second.storage.expired()) {
      dropped.push_back(std::move(i->second));
      i = packed_cache.erase(i);
    } else {
      ++i;
    }
  }
}

int64_t version_of(const torch::Tensor& w) { return w.is_inference() ? -1 : static_cast<int64_t>(w._version()); }

// w's packed copy into the cache (the lock held), in place of freed weights' and of w's earlier ones (into `dropped`).
void store(const torch::Tensor& w, const torch::Tensor& packed, std::vector<Packed>& dropped) {
  sweep(dropped);
  auto it = packed_cache.find(key_of(w));
  if (it != packed_cache.end()) {
    dropped.push_back(std::move(it->second));
    packed_cache.erase(it);
  }
  packed_cache.emplace(key_of(w), Packed{w.storage().getWeakStorageImpl(), version_of(w), packed.view({-1})});
}

}  // namespace

bool packable(const torch::Tensor& w) { return amx_packable(w) || (!AMX_ON && panel_packable(w)); }

torch::Tensor pack_weight(const torch::Tensor& w) {
  TORCH_CHECK(packable(w), "pack_weight: no packed backend takes this weight here");
  return AMX_ON ? amx_pack(w) : panel_pack(w);
}

// The weight's packed copy: made on first use, and again after the weight changed in place (its version counter) or
// was freed and another tensor put at its address. Not seen: writes that bypass the version counter (through
// ``.data``, numpy, another tensor over the same memory; an inference tensor's in-place change): forget_packed() then.
torch::Tensor packed_weight(const torch::Tensor& w) {
  std::vector<Packed> dropped;  // destroyed after the lock is released
  std::lock_guard<std::mutex> guard(packed_lock);
  auto it = packed_cache.find(key_of(w));
  if (it != packed_cache.end() && it->second.storage.lock().get() == w.storage().unsafeGetStorageImpl() &&
      it->second.version == version_of(w))
    return it->second.packed;
  const torch::Tensor packed = pack_weight(w);
  store(w, packed, dropped);
  return packed;
}

// A copy packed by the caller (in memory of its choice: gemm.pack_weights puts a model's in huge pages), laid out as
// pack_weight lays it out, for weight w.
void register_packed(const torch::Tensor& w, const torch::Tensor& packed) {
  TORCH_CHECK(packable(w) && packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous() &&
              packed.numel() == w.numel(), "register_packed: not a packable weight and its packed copy");
  std::vector<Packed> dropped;
  std::lock_guard<std::mutex> guard(packed_lock);
  store(w, packed, dropped);
}

// Forget every weight's packed copy (after writes the cache cannot see); they are packed again on next use.
void forget_packed() {
  std::map<Key, Packed> dropped;
  std::lock_guard<std::mutex> guard(packed_lock);
  dropped.swap(packed_cache);
}

std::vector<torch::Tensor> packed_linears(const torch::Tensor& x2, const std::vector<torch::Tensor>& ws,
                                          const std::vector<torch::Tensor>& fbias) {
  return AMX_ON ? amx_linears(x2, ws, fbias) : panel_linears(x2, ws, fbias);
}

}  // namespace drafttree_kernels
