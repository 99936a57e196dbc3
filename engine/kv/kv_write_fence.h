// A gate through which a thread other than a KvCache's owner may write into blocks the owner has
// set aside for it, and which the owner closes before it takes the blocks back.
//
// The decode node's scheduler reserves a prompt's blocks for KV arriving from a prefill node; the
// transport's delivery thread writes each verified layer straight into them (docs/kv_transfer.md,
// "Landing in the cache"). The owner (the engine thread) frees or reuses those blocks only after
// Close(): Close waits for a Write in progress and makes every later Write a no-op, so no write
// can land in a block after it went back to the cache.
//
// Thread safety: every method may be called from any thread. Write holds the gate's lock while its
// function runs (one layer's copy, milliseconds): the function must not block on anything else.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv/kv_cache.h"

namespace pd::engine {

class KvWriteFence {
 public:
  KvWriteFence() = default;
  KvWriteFence(const KvWriteFence&) = delete;
  KvWriteFence& operator=(const KvWriteFence&) = delete;

  // Runs `fn()` under the gate's lock if it is still open; returns false (fn not run) once it
  // is closed.
  template <typename Fn>
  bool Write(Fn&& fn) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    std::forward<Fn>(fn)();
    return true;
  }
  // Closes the gate: returns once no Write is running; every later Write returns false.
  // Idempotent.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// A reserved sequence's blocks handed to another thread: for every layer its
// KvCache::ExportSpans (host memory), and the fence guarding them. The scheduler makes one per
// importing sequence (Scheduler::ImportTarget); the KV transport lands layers in it
// (kvtransfer::ReceiveTarget).
struct KvWriteTarget {
  std::vector<std::vector<KvSpan>> layers;  // [layer] -> ExportSpans(seq, layer)
  std::shared_ptr<KvWriteFence> fence;
  bool empty() const { return layers.empty(); }
};

}  // namespace pd::engine
