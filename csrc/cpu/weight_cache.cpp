#include "cpu/weight_cache.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdlib>
#include <list>
#include <mutex>
#include <string>
#include <vector>

namespace cudnn_rnn {
namespace cpu {
namespace {

struct Entry {
  // The tensor itself (its version counter is its own: another tensor on the same storage, a
  // `.data` or a tied Parameter, counts its writes apart) and its storage, both held weakly.
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
  const c10::TensorImpl* tensor_key;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  const c10::StorageImpl* key;
  int64_t offset;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  std::string what;
  uint32_t version;
  at::Tensor packed;
};

struct Cache {
  std::mutex mutex;
  std::list<Entry> entries;  // most recently used first
  std::atomic<int64_t> packs{0};
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: no teardown order against ATen's allocators
  return *c;
}

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("CUDNN_RNN_CPU_WEIGHT_CACHE");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

bool same_place(const Entry& e, const at::Tensor& w, const char* what) {
  return e.tensor_key == w.unsafeGetTensorImpl() && e.key == w.storage().unsafeGetStorageImpl() &&
         e.offset == w.storage_offset() &&
         at::IntArrayRef(e.sizes) == w.sizes() && at::IntArrayRef(e.strides) == w.strides() &&
         e.dtype == w.scalar_type() && e.what == what;
}

}  // namespace

at::Tensor cached_pack(const at::Tensor& weight, const char* what, const std::function<at::Tensor()>& make) {
  Cache& c = cache();
  if (!enabled() || weight.is_inference() || !weight.has_storage()) {
    c.packs.fetch_add(1);
    return make();
  }
  const uint32_t version = weight._version();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    for (auto it = c.entries.begin(); it != c.entries.end(); ++it) {
      if (!same_place(*it, weight, what)) continue;
      if (!it->tensor.expired() && !it->storage.expired() && it->version == version) {
        c.entries.splice(c.entries.begin(), c.entries, it);
        return it->packed;
      }
      c.entries.erase(it);  // stale: the weight changed since
      break;
    }
  }
  at::Tensor packed = make();
  c.packs.fetch_add(1);
  std::lock_guard<std::mutex> lock(c.mutex);
  // Entries whose storage is gone can never hit again.
  c.entries.remove_if([](const Entry& e) { return e.tensor.expired() || e.storage.expired(); });
  c10::StorageImpl* impl = weight.storage().unsafeGetStorageImpl();
  c.entries.push_front(Entry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(weight.getIntrusivePtr()),
                             weight.unsafeGetTensorImpl(),
                             c10::weak_intrusive_ptr<c10::StorageImpl>(
                                 c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl)),
                             impl, weight.storage_offset(), weight.sizes().vec(), weight.strides().vec(),
                             weight.scalar_type(), what, version, packed});
  while (static_cast<int64_t>(c.entries.size()) > kWeightCacheEntries) c.entries.pop_back();
  return packed;
}

int64_t weight_cache_entries() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return static_cast<int64_t>(c.entries.size());
}

int64_t weight_cache_packs() { return cache().packs.load(); }

void clear_weight_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.entries.clear();
}

}  // namespace cpu
}  // namespace cudnn_rnn
