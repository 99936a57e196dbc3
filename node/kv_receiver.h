// The receiving side of KV transfer: the reservations pd-decode's Decode.Reserve hands out, and
// those pd-prefill opens to fetch a prompt prefix from a decode node (docs/cluster.md, "Prefix
// pull").
//
// A reservation is one request accepted by the Scheduler through SubmitImport whose prompt's K/V
// another node pushes over this node's KvTransport. Its life:
//
//   Reserve (RPC thread)        SubmitImport; the engine thread reserves the prompt's blocks and
//                               opens a transfer (KvTransport::Reserve) -> the descriptor. With a
//                               host-memory cache the transfer gets the blocks as its
//                               ReceiveTarget: the transport's delivery thread writes each layer
//                               into them (copy and checksum in one pass) through the sequence's
//                               KvWriteFence, which the engine closes before it frees them.
//   on_layer (delivery thread)  a landed layer: nothing to do. Otherwise (a device cache)
//                               Scheduler::PostImport(ImportLayer(payload)): the verified layer
//                               is written into the reserved blocks on the engine thread.
//   on_done (delivery thread)   the transfer ended: OK, or the reason (checksum, short transfer,
//                               deadline, peer gone) -> local prefill at once.
//   Attach (RPC thread)         Decode.Generate with the reservation: with the first token the
//                               sequence joins the batch once the transfer ended OK; without
//                               (the prefill failed) the transfer is aborted and the node
//                               prefills the prompt itself.
//   Release (RPC thread)        the stream ended: an unfinished transfer is aborted.
//
// A reservation nobody attaches to by its deadline + 10 s (the router died) is cancelled: its
// request ends and its blocks are freed. Every path frees the blocks exactly once: the Scheduler
// owns them (Cancel, CompleteImport with an error, or the sequence's normal end).
//
// Metrics (docs/metrics.md): pdserve_kv_transfer_received_total{result} (ok, or the status code
// name of a failed transfer), pdserve_kv_transfer_layers_total{path} (verified layers, landed in
// place by the transport or imported on the engine thread) and pdserve_kv_reservations (gauge:
// live reservations).
//
// Ownership: borrows the Scheduler and the transport (both must outlive it); owns the reaper
// thread, joined by the destructor. Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "engine/sched/scheduler.h"
#include "kvtransfer/kv_transport.h"

namespace pd::node {

class KvReceiver {
 public:
  // `metrics` may be null. `attach_grace`: how long after its transfer deadline a reservation
  // nobody attached to is kept.
  KvReceiver(engine::Scheduler& scheduler, kvtransfer::KvTransport& transport,
             MetricsRegistry* metrics, absl::Duration attach_grace = absl::Seconds(10));
  ~KvReceiver();  // Shutdown()

  // Joins the reaper, cancels the reservations nobody attached to and aborts open transfers;
  // later transfer callbacks are ignored. Call before destroying the transport (whose last
  // callbacks may still run until it is gone), destroy this object after it. Idempotent.
  void Shutdown();

  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  struct Reserved {
    uint64_t reservation = 0;
    // The serialized TransferDescriptor; empty when no transfer was opened (no free blocks now,
    // or the transport refused): the request prefills here.
    std::string descriptor;
  };
  // Accepts `request` (its tokens and finish go to `sink`) and opens its transfer, with the KV
  // sent as `wire` (kF16/kF32: the cache's dtype as is, kI8: compressed). Blocks until the engine
  // thread reserved the blocks (one step at most) or `deadline`. Errors: the Scheduler's
  // acceptance errors (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE);
  // DEADLINE_EXCEEDED when the engine did not reserve in time (the request is cancelled).
  absl::StatusOr<Reserved> Reserve(engine::GenerationRequest request,
                                   std::shared_ptr<engine::GenerationSink> sink,
                                   engine::KvDType wire, absl::Time deadline);

  struct Attached {
    std::string request_id;
    std::shared_ptr<engine::GenerationSink> sink;
  };
  // Decode.Generate with `reservation`: see the header comment. NOT_FOUND for an unknown or
  // expired reservation, FAILED_PRECONDITION when it is already attached.
  absl::StatusOr<Attached> Attach(uint64_t reservation, std::optional<int32_t> first_token);
  // The attached stream ended: aborts the transfer if it still runs and forgets the reservation.
  void Release(uint64_t reservation);
  // Decode.Release: a reservation nobody will attach to. Its request is cancelled (blocks
  // freed) unless attached, its transfer aborted, the reservation forgotten. No-op if unknown.
  void Drop(uint64_t reservation);
  // Decode.Release by request id, for a caller that gave up on Decode.Reserve before it answered
  // (its client went away) and so never learned the reservation: drops every reservation of
  // `request_id`, and any Reserve of it still under way (or arriving within 60 s) ends CANCELLED
  // with nothing kept. The ids are remembered 60 s (at most 4,096 of them).
  void DropRequest(const std::string& request_id);

  int live() const;  // reservations not yet released

  struct Held {
    std::string request_id;
    std::vector<int32_t> prompt;
    // Leading prompt tokens the reservation took from this node's prefix cache (whole blocks):
    // what Decode.SendPrefix may send on. 0 until the engine reserved the blocks.
    int cached_tokens = 0;
  };
  // What reservation `reservation` holds. NOT_FOUND for an unknown or expired one.
  absl::StatusOr<Held> Prefix(uint64_t reservation) const;

 private:
  struct Res;
  void OnDone(uint64_t reservation, absl::Status status);
  // Gives the Scheduler the outcome once it is known (transfer failed, or OK + first token).
  void MaybeComplete(Res& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reap();

  engine::Scheduler& scheduler_;
  kvtransfer::KvTransport& transport_;
  const absl::Duration attach_grace_;
  Family<Counter>* received_ = nullptr;  // {result}
  Family<Counter>* layers_ = nullptr;    // {path}: landed | engine
  Gauge* reservations_ = nullptr;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Res>> res_ ABSL_GUARDED_BY(mu_);
  // DropRequest's ids, oldest first, and when each was dropped.
  std::deque<std::pair<std::string, absl::Time>> dropped_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> dropped_ ABSL_GUARDED_BY(mu_);
  // Forgets DropRequest's ids older than 60 s, and the oldest while 4,096 or more are kept.
  void ForgetOldDrops() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::thread reaper_;
};

}  // namespace pd::node
