// Helpers for KV transfer tests: caches on the CPU backend with random contents, a receiver owner
// that imports delivered layers on its own ("engine") thread, and byte comparisons.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "kvtransfer/kv_codec.h"
#include "kvtransfer/kv_transport.h"

namespace pd::kvtransfer::testing {

inline engine::KvCacheOptions CacheOptions(KvDType dtype, int n_layer = 4, int n_kv_heads = 2,
                                           int head_dim = 64, int block_size = 16,
                                           int n_blocks = 64) {
  engine::KvCacheOptions o;
  o.n_layer = n_layer;
  o.n_kv_heads = n_kv_heads;
  o.head_dim = head_dim;
  o.block_size = block_size;
  o.n_blocks = n_blocks;
  o.dtype = dtype;
  return o;
}

// Reserves `n_tokens` for `seq` and fills every block of every layer (whole blocks) with normal
// random values (sigma 1, a few outliers), stored in the cache's dtype.
inline absl::Status FillRandom(engine::KvCache& kv, int64_t seq, int n_tokens, uint32_t seed) {
  PD_RETURN_IF_ERROR(kv.Reserve(seq, n_tokens));
  const engine::KvCacheOptions& o = kv.options();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t n = static_cast<size_t>(o.block_size) * o.n_kv_heads * o.head_dim;
  std::vector<float> f(n);
  std::vector<uint8_t> block(kv.BlockBytes().span());
  const int n_blocks = static_cast<int>(kv.BlockTable(seq).size());
  for (int l = 0; l < o.n_layer; ++l) {
    for (int b = 0; b < n_blocks; ++b) {
      for (auto part : {engine::KvPart::kK, engine::KvPart::kV}) {
        for (size_t i = 0; i < n; ++i) f[i] = nd(rng) * (i % 97 == 0 ? 8.f : 1.f);
        ConvertBlock(KvDType::kF32, f.data(), o.dtype, block.data(), o.block_size, o.n_kv_heads,
                     o.head_dim);
        PD_RETURN_IF_ERROR(kv.Import(seq, l, b, part, block.data(), block.size()));
      }
    }
  }
  return absl::OkStatus();
}

// One block of `seq` as bytes.
inline std::vector<uint8_t> BlockBytes(engine::KvCache& kv, int64_t seq, int layer, int block,
                                       engine::KvPart part) {
  std::vector<uint8_t> out(kv.BlockBytes().span());
  PD_CHECK_OK(kv.Export(seq, layer, block, part, out.data(), out.size()));
  return out;
}

// A receiver's owner: callbacks queue into here (transport delivery thread); the test thread plays
// the engine loop, importing layers into its cache unless the transport landed them there (a
// ReceiveTarget).
class Owner {
 public:
  ReceiveCallbacks Callbacks() {
    ReceiveCallbacks cb;
    cb.on_layer = [this](LayerPayload p) {
      absl::MutexLock lock(&mu_);
      layers_.push_back(std::move(p));
    };
    cb.on_done = [this](uint64_t, absl::Status s) {
      absl::MutexLock lock(&mu_);
      ++done_calls_;
      done_ = s;
    };
    return cb;
  }

  // Engine loop: imports layers until on_done fired (or `timeout`), returns the final status.
  // Import errors are returned as they are. Layers after the end are imported too if queued.
  absl::Status Run(engine::KvCache* kv, int64_t seq, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time until = absl::Now() + timeout;
    for (;;) {
      std::deque<LayerPayload> batch;
      std::optional<absl::Status> done;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !layers_.empty() || done_.has_value();
        };
        mu_.AwaitWithDeadline(absl::Condition(&ready), until);
        batch.swap(layers_);
        done = done_;
      }
      for (LayerPayload& p : batch) {
        layers_seen_.push_back(p.layer);
        if (p.landed) {
          ++landed_;  // the transport wrote it into the receive target
        } else if (kv != nullptr) {
          PD_RETURN_IF_ERROR(ImportLayer(p, *kv, seq));
        }
      }
      if (done.has_value() && batch.empty()) return *done;
      if (absl::Now() >= until) return absl::DeadlineExceededError("test owner: no on_done");
    }
  }
  // Blocks until `n` layers were delivered (and not yet imported) or `timeout` passed.
  bool WaitForLayers(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return layers_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }
  int done_calls() {
    absl::MutexLock lock(&mu_);
    return done_calls_;
  }
  const std::vector<int>& layers_seen() const { return layers_seen_; }
  int landed() const { return landed_; }

 private:
  absl::Mutex mu_;
  std::deque<LayerPayload> layers_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> done_ ABSL_GUARDED_BY(mu_);
  int done_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> layers_seen_;
  int landed_ = 0;
};

}  // namespace pd::kvtransfer::testing
