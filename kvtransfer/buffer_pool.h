// A thread-safe pool of uninitialised byte buffers, so that steady-state transfers neither
// allocate nor page-fault (a fresh 16 MiB malloc costs ~4k page faults, about as long as moving
// it over shared memory). Buffers are handed out as kvtransfer::Buffer and come back when
// destroyed; the pool keeps at most `max_idle_bytes` of idle buffers and frees the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/kv_transport.h"

namespace pd::kvtransfer {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> Create(size_t max_idle_bytes);
  ~BufferPool();
  // A buffer of exactly `n` visible bytes (capacity may be larger, up to n + n / 8).
  Buffer Get(size_t n);
  size_t idle_bytes() const;

 private:
  friend class Buffer;
  explicit BufferPool(size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  void Return(uint8_t* data, size_t capacity);

  const size_t max_idle_bytes_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, uint8_t*> idle_ ABSL_GUARDED_BY(mu_);  // capacity -> buffer
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pd::kvtransfer
