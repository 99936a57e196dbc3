#include "node/kv_receiver.h"

#include <utility>
#include <vector>

#include "common/log.h"
#include "common/strings.h"
#include "kvtransfer/kv_codec.h"

namespace pd::node {

struct KvReceiver::Res {
  std::string id;
  std::vector<int32_t> prompt;
  int cached_tokens = 0;  // the prefix taken from the cache at the reservation
  std::shared_ptr<engine::GenerationSink> sink;
  absl::Time expires;
  bool reserved = false;    // the engine thread ran on_reserved
  bool handed_out = false;  // Reserve returned it: from now on only the caller's Release/Drop,
                            // DropRequest and the reaper end it (before, only Reserve itself)
  std::string descriptor;
  uint64_t transfer_id = 0;
  bool transferring = false;             // a transfer was opened
  std::optional<absl::Status> transfer;  // how it ended
  std::optional<int32_t> first_token;
  bool attached = false;
  bool completed = false;  // the Scheduler was told (CompleteImport), or it prefills anyway
};

KvReceiver::KvReceiver(engine::Scheduler& scheduler, kvtransfer::KvTransport& transport,
                       MetricsRegistry* metrics, absl::Duration attach_grace)
    : scheduler_(scheduler), transport_(transport), attach_grace_(attach_grace) {
  if (metrics != nullptr) {
    received_ = &metrics->AddCounter(
        "pdserve_kv_transfer_received_total",
        "KV transfers received by this node (decode: prompts; prefill: prefix pulls), by "
        "result (ok, or the failure's status code).",
        {"result"});
    layers_ = &metrics->AddCounter(
        "pdserve_kv_transfer_layers_total",
        "Verified KV layers received, by where they were written into the cache: landed (by the "
        "transport's delivery thread, in place) or engine (imported on the engine thread).",
        {"path"});
    reservations_ = &metrics
                         ->AddGauge("pdserve_kv_reservations",
                                    "Requests waiting for (or streaming after) a KV transfer.", {})
                         .Get();
  }
  reaper_ = std::thread([this] { Reap(); });
}

KvReceiver::~KvReceiver() { Shutdown(); }

void KvReceiver::Shutdown() {
  std::vector<uint64_t> aborts;
  {
    absl::MutexLock l(&mu_);
    if (stop_) return;
    stop_ = true;
    cv_.SignalAll();
  }
  reaper_.join();
  {
    absl::MutexLock l(&mu_);
    for (auto& [rn, r] : res_) {
      if (!r->attached) scheduler_.Cancel(r->id, engine::FinishReason::kCancelled);
      if (r->transferring && !r->transfer) aborts.push_back(r->transfer_id);
    }
    res_.clear();
    if (reservations_ != nullptr) reservations_->Set(0);
  }
  for (uint64_t id : aborts) {
    transport_.AbortReceive(id, absl::UnavailableError("the node is shutting down"));
  }
}

int KvReceiver::live() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(res_.size());
}

absl::StatusOr<KvReceiver::Reserved> KvReceiver::Reserve(
    engine::GenerationRequest request, std::shared_ptr<engine::GenerationSink> sink,
    engine::KvDType wire, absl::Time deadline) {
  const std::string id = request.id;
  const int n_prompt = static_cast<int>(request.prompt.size());
  uint64_t rn;
  {
    absl::MutexLock l(&mu_);
    ForgetOldDrops();
    if (dropped_.contains(id)) {
      return absl::CancelledError(StrCat("request ", id, " was released"));
    }
    rn = next_++;
    auto r = std::make_unique<Res>();
    r->id = id;
    r->prompt = request.prompt;
    r->sink = sink;
    r->expires = deadline + attach_grace_;
    res_[rn] = std::move(r);
    if (reservations_ != nullptr) reservations_->Set(static_cast<double>(res_.size()));
  }
  // Runs on the engine thread at the next intake.
  auto on_reserved = [this, rn, id, n_prompt, wire,
                      deadline](absl::StatusOr<engine::Scheduler::ImportTarget> reserved) {
    std::optional<absl::StatusOr<kvtransfer::TransferDescriptor>> d;
    const int cached =
        reserved.ok() ? reserved->first_block * scheduler_.kv_options().block_size : 0;
    if (reserved.ok()) {
      kvtransfer::TransferGeometry g =
          kvtransfer::TransferGeometry::ForCache(scheduler_.kv_options(), n_prompt, wire);
      // Blocks this node took from its prefix cache do not travel (docs/cluster.md).
      g.first_block = reserved->first_block;
      kvtransfer::ReceiveCallbacks cb;
      cb.on_layer = [this, id](kvtransfer::LayerPayload payload) {
        if (layers_ != nullptr)
          layers_->WithLabels({payload.landed ? "landed" : "engine"}).Increment();
        if (payload.landed) return;  // the transport wrote it into the reserved blocks
        auto p = std::make_shared<kvtransfer::LayerPayload>(std::move(payload));
        scheduler_.PostImport(id, [p](engine::KvCache& kv, int64_t seq) {
          return kvtransfer::ImportLayer(*p, kv, seq);
        });
      };
      cb.on_done = [this, rn](uint64_t, absl::Status status) { OnDone(rn, std::move(status)); };
      // A host-memory cache: the transport lands each layer in the blocks itself, on its delivery
      // thread, through the fence the engine closes before it takes them back (a device cache's
      // target is empty: payloads then come to on_layer).
      kvtransfer::ReceiveTarget target = std::move(*reserved);  // the blocks, without kv_seq
      d = transport_.Reserve(g, deadline, std::move(cb), std::move(target));
    }
    absl::MutexLock l(&mu_);
    auto it = res_.find(rn);
    if (d.has_value() && !d->ok()) {
      PD_LOG(kWarning, "request ", id, ": cannot open a KV transfer (", d->status().ToString(),
             "); prefilling here");
      scheduler_.CompleteImport(id, d->status());
    }
    if (it == res_.end()) {
      // Reserve gave up waiting (and cancelled the request): drop the transfer.
      if (d.has_value() && d->ok()) {
        transport_.AbortReceive((*d)->transfer_id, absl::CancelledError("reservation dropped"));
      }
      return;
    }
    Res& r = *it->second;
    r.reserved = true;
    r.cached_tokens = cached;
    if (d.has_value() && d->ok()) {
      r.transfer_id = (*d)->transfer_id;
      r.transferring = true;
      r.descriptor = (*d)->Serialize();
    } else {
      r.completed = true;  // no blocks now, or no transfer: the Scheduler prefills it
    }
    // Reserve's AwaitWithDeadline re-checks r.reserved when mu_ is released.
  };
  // A lossless wire (the cache's own dtype) delivers the bytes this node would compute: the
  // prompt's blocks may then serve later prompts from the prefix cache (the next turn of a chat
  // is prefilled here, on top of them). An INT8 wire into an f16 cache does not.
  const bool publish = wire == scheduler_.kv_options().dtype;
  if (absl::Status s =
          scheduler_.SubmitImport(std::move(request), std::move(sink), on_reserved, publish);
      !s.ok()) {
    absl::MutexLock l(&mu_);
    res_.erase(rn);
    if (reservations_ != nullptr) reservations_->Set(static_cast<double>(res_.size()));
    return s;
  }
  uint64_t abort_id = 0;
  absl::Status gone;
  {
    absl::MutexLock l(&mu_);
    Res* r = res_[rn].get();
    auto ready = [r]() { return r->reserved; };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (r->reserved && !dropped_.contains(id)) {
      r->handed_out = true;
      return Reserved{rn, r->descriptor};
    }
    // Not reserved in time, or released by request id meanwhile (DropRequest leaves a reservation
    // still being made to this call): nothing of it may stay.
    gone = r->reserved ? absl::CancelledError(StrCat("request ", id, " was released"))
                       : absl::DeadlineExceededError(
                             "the node's engine did not reserve the KV blocks before the "
                             "transfer deadline");
    if (r->transferring && !r->transfer.has_value()) abort_id = r->transfer_id;
    scheduler_.Cancel(id, engine::FinishReason::kCancelled);
    res_.erase(rn);
    if (reservations_ != nullptr) reservations_->Set(static_cast<double>(res_.size()));
  }
  if (abort_id != 0) transport_.AbortReceive(abort_id, gone);
  return gone;
}

void KvReceiver::ForgetOldDrops() {
  const absl::Time forget = absl::Now() - absl::Seconds(60);
  while (!dropped_order_.empty() &&
         (dropped_order_.front().second < forget || dropped_order_.size() >= 4096)) {
    dropped_.erase(dropped_order_.front().first);
    dropped_order_.pop_front();
  }
}

void KvReceiver::DropRequest(const std::string& request_id) {
  std::vector<uint64_t> reserved;
  {
    absl::MutexLock l(&mu_);
    ForgetOldDrops();
    if (dropped_.insert(request_id).second) dropped_order_.emplace_back(request_id, absl::Now());
    for (const auto& [rn, r] : res_) {
      // One still being made is ended by its Reserve call, which sees the id dropped (and owns
      // the entry until it returns).
      if (r->id == request_id && r->handed_out) reserved.push_back(rn);
    }
  }
  for (uint64_t rn : reserved) Drop(rn);
}

absl::StatusOr<KvReceiver::Held> KvReceiver::Prefix(uint64_t rn) const {
  absl::MutexLock l(&mu_);
  auto it = res_.find(rn);
  if (it == res_.end()) {
    return absl::NotFoundError(StrCat("reservation ", rn, " is unknown or expired on this node"));
  }
  return Held{it->second->id, it->second->prompt, it->second->cached_tokens};
}

void KvReceiver::MaybeComplete(Res& r) {
  if (r.completed || !r.transfer.has_value()) return;
  if (!r.transfer->ok()) {
    scheduler_.CompleteImport(r.id, *r.transfer);
    r.completed = true;
  } else if (r.first_token.has_value()) {
    scheduler_.CompleteImport(r.id, *r.first_token);
    r.completed = true;
  }
}

void KvReceiver::OnDone(uint64_t rn, absl::Status status) {
  if (received_ != nullptr) {
    received_
        ->WithLabels({status.ok() ? std::string("ok") : absl::StatusCodeToString(status.code())})
        .Increment();
  }
  absl::MutexLock l(&mu_);
  auto it = res_.find(rn);
  if (it == res_.end()) return;
  Res& r = *it->second;
  if (!status.ok()) {
    PD_LOG(kWarning, "request ", r.id, ": KV transfer failed (", status.ToString(),
           "); prefilling here");
  }
  if (!r.transfer.has_value()) r.transfer = std::move(status);
  MaybeComplete(r);
}

absl::StatusOr<KvReceiver::Attached> KvReceiver::Attach(uint64_t rn,
                                                        std::optional<int32_t> first_token) {
  uint64_t abort_id = 0;
  Attached out;
  {
    absl::MutexLock l(&mu_);
    auto it = res_.find(rn);
    if (it == res_.end()) {
      return absl::NotFoundError(StrCat("reservation ", rn, " is unknown or expired on this node"));
    }
    Res& r = *it->second;
    if (r.attached) {
      return absl::FailedPreconditionError(StrCat("reservation ", rn, " is already attached"));
    }
    r.attached = true;
    out.request_id = r.id;
    out.sink = r.sink;
    if (first_token.has_value()) {
      r.first_token = first_token;
      MaybeComplete(r);
    } else if (!r.completed) {
      // The prefill failed: whatever arrived is of no use; prefill here.
      scheduler_.CompleteImport(r.id, absl::AbortedError("no first token from a prefill node"));
      r.completed = true;
      if (r.transferring && !r.transfer.has_value()) {
        abort_id = r.transfer_id;
        r.transfer = absl::AbortedError("the router gave up on the prefill node");
      }
    }
  }
  if (abort_id != 0) {
    transport_.AbortReceive(abort_id, absl::AbortedError("the router gave up on the prefill node"));
  }
  return out;
}

void KvReceiver::Release(uint64_t rn) {
  uint64_t abort_id = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = res_.find(rn);
    if (it == res_.end()) return;
    if (it->second->transferring && !it->second->transfer.has_value()) {
      abort_id = it->second->transfer_id;
    }
    res_.erase(it);
    if (reservations_ != nullptr) reservations_->Set(static_cast<double>(res_.size()));
  }
  if (abort_id != 0) transport_.AbortReceive(abort_id, absl::CancelledError("the stream ended"));
}

void KvReceiver::Drop(uint64_t rn) {
  {
    absl::MutexLock l(&mu_);
    auto it = res_.find(rn);
    if (it == res_.end()) return;
    if (!it->second->attached) scheduler_.Cancel(it->second->id, engine::FinishReason::kCancelled);
  }
  Release(rn);
}

void KvReceiver::Reap() {
  absl::MutexLock l(&mu_);
  while (!stop_) {
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
    const absl::Time now = absl::Now();
    std::vector<uint64_t> aborts;
    for (auto it = res_.begin(); it != res_.end();) {
      Res& r = *it->second;
      if (r.attached || !r.handed_out || now < r.expires) {
        ++it;
        continue;
      }
      PD_LOG(kWarning, "request ", r.id,
             ": nobody attached to its KV reservation before the deadline; cancelled");
      scheduler_.Cancel(r.id, engine::FinishReason::kCancelled);
      if (r.transferring && !r.transfer.has_value()) aborts.push_back(r.transfer_id);
      res_.erase(it++);
    }
    if (reservations_ != nullptr) reservations_->Set(static_cast<double>(res_.size()));
    for (uint64_t id : aborts) {
      transport_.AbortReceive(id, absl::DeadlineExceededError("reservation expired"));
    }
  }
}

}  // namespace pd::node
