#include "cpu/buffer_pool.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <string>

namespace cudnn_rnn {
namespace cpu {
namespace {

constexpr size_t kAlignment = 64;

// Requests are rounded up to a multiple of 1/16 of their power of two, so that calls whose sizes
// differ a little (another batch size, sequence length) still share buffers.
size_t size_class(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  const size_t step = std::max<size_t>(p / 16, kAlignment);
  return (n + step - 1) / step * step;
}

int64_t limit_from_env() {
  const char* v = std::getenv("CUDNN_RNN_CPU_CACHE_MB");
  if (v == nullptr || *v == '\0') return int64_t(512) << 20;
  long long mb = -1;
  size_t used = 0;
  try {
    mb = std::stoll(v, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  TORCH_CHECK_VALUE(used == std::strlen(v) && mb >= 0, "CUDNN_RNN_CPU_CACHE_MB must be a non-negative number of MiB; got ", v);
  return static_cast<int64_t>(std::min<long long>(mb, 1LL << 30)) << 20;  // at most 1 PiB
}

struct Block {
  void* ptr;
  size_t bytes;
};

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: tensors may outlive static destruction
    return *pool;
  }

  at::DataPtr allocate(size_t n) {
    const size_t bytes = size_class(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->bytes == bytes) {
          void* p = it->ptr;
          idle_bytes_ -= static_cast<int64_t>(bytes);
          idle_.erase(it);
          return wrap(p, bytes);
        }
      }
    }
    void* p = nullptr;
    if (posix_memalign(&p, kAlignment, bytes) != 0 || p == nullptr) {
      empty();  // give back what sits idle, then try once more
      if (posix_memalign(&p, kAlignment, bytes) != 0 || p == nullptr) {
        TORCH_CHECK(false, "cudnn_rnn: out of memory allocating ", bytes, " bytes on the CPU");
      }
    }
    return wrap(p, bytes);
  }

  void release(Block* b) {
    std::unique_lock<std::mutex> lock(mu_);
    if (static_cast<int64_t>(b->bytes) > limit_) {
      lock.unlock();
      std::free(b->ptr);
      delete b;
      return;
    }
    idle_.push_front(*b);
    idle_bytes_ += static_cast<int64_t>(b->bytes);
    delete b;
    std::list<Block> evicted;
    while (idle_bytes_ > limit_) {  // the least recently freed go first
      idle_bytes_ -= static_cast<int64_t>(idle_.back().bytes);
      evicted.splice(evicted.begin(), idle_, std::prev(idle_.end()));
    }
    lock.unlock();
    for (const Block& e : evicted) std::free(e.ptr);
  }

  void empty() {
    std::list<Block> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(idle_);
      idle_bytes_ = 0;
    }
    for (const Block& e : all) std::free(e.ptr);
  }

  int64_t idle_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_bytes_;
  }
  int64_t limit() const { return limit_; }

 private:
  Pool() : limit_(limit_from_env()) {}

  static void deleter(void* ctx) { Pool::get().release(static_cast<Block*>(ctx)); }

  at::DataPtr wrap(void* p, size_t bytes) {
    return at::DataPtr(p, new Block{p, bytes}, &Pool::deleter, at::Device(at::kCPU));
  }

  std::mutex mu_;
  std::list<Block> idle_;
  int64_t idle_bytes_ = 0;
  const int64_t limit_;
};

struct PoolAllocator final : at::Allocator {
  at::DataPtr allocate(size_t n) override {
    if (n < static_cast<size_t>(kMinPooledBytes) || Pool::get().limit() == 0) {
      return c10::GetDefaultCPUAllocator()->allocate(n);
    }
    return Pool::get().allocate(n);
  }
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

PoolAllocator& allocator() {
  static PoolAllocator* a = new PoolAllocator();  // never destroyed: storages keep a pointer to it
  return *a;
}

}  // namespace

at::Tensor pooled_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_generic(sizes, &allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                   c10::nullopt));
}

int64_t cached_bytes() { return Pool::get().idle_bytes(); }
int64_t cache_limit_bytes() { return Pool::get().limit(); }
void empty_cache() { Pool::get().empty(); }

}  // namespace cpu
}  // namespace cudnn_rnn
