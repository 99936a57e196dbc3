#include "kvtransfer/transport_base.h"

#include <algorithm>
#include <sys/random.h>

#include <cstring>
#include <utility>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "kvtransfer/kv_codec.h"

namespace pd::kvtransfer::internal {
namespace {

constexpr absl::Duration kMaxWait = absl::Milliseconds(50);
constexpr absl::Duration kTombstone = absl::Seconds(30);
// The receiver owns the deadline (it holds the blocks); the sender's own timer is a backstop for a
// receiver it cannot hear from, so it fires a little later and the two do not race.
constexpr absl::Duration kSenderDeadlineGrace = absl::Milliseconds(250);
// More runs than this in one layer: the staging copy is cheaper than a message per run.
constexpr size_t kMaxRunsInPlace = 64;

std::string_view KindName(MsgKind k) {
  switch (k) {
    case MsgKind::kHello:
      return "HELLO";
    case MsgKind::kLayer:
      return "LAYER";
    case MsgKind::kComplete:
      return "COMPLETE";
    case MsgKind::kSenderAbort:
      return "SENDER_ABORT";
    case MsgKind::kReceiverAbort:
      return "RECEIVER_ABORT";
    case MsgKind::kAck:
      return "ACK";
  }
  return "?";
}

// The header of a LAYER message.
MsgHeader LayerHeader(uint64_t transfer_id, uint64_t lease, int layer, uint64_t checksum,
                      size_t body_bytes) {
  MsgHeader h{};
  h.magic = kMsgMagic;
  h.version = kMsgVersion;
  h.kind = static_cast<uint8_t>(MsgKind::kLayer);
  h.transfer_id = transfer_id;
  h.lease = lease;
  h.layer = static_cast<uint32_t>(layer);
  h.checksum = checksum;
  h.body_bytes = body_bytes;
  return h;
}

}  // namespace

uint64_t RandomId() {
  for (;;) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof(x), 0) == static_cast<ssize_t>(sizeof(x)) && x != 0) return x;
  }
}

namespace {

absl::Status WithPrefix(const absl::Status& s, std::string_view prefix) {
  return absl::Status(s.code(), pd::StrCat(prefix, s.message()));
}

// The checksum of layer `layer` of transfer `id`'s payload, taken while landing it in `target`'s
// blocks when there is a target (LandLayer, under its fence). CANCELLED when the owner has
// already taken the blocks back.
absl::StatusOr<uint64_t> HashOrLandLayer(const TransferGeometry& g, uint64_t id, int layer,
                                         absl::Span<const uint8_t> payload,
                                         const ReceiveTarget& target) {
  if (target.empty()) return Checksum64(payload.data(), payload.size());
  absl::StatusOr<uint64_t> landed;
  if (!target.fence->Write([&] { landed = LandLayer(g, layer, payload, target.layers[layer]); })) {
    return absl::CancelledError(
        pd::StrCat("KV transfer ", id, ": the receiver took its reserved blocks back"));
  }
  return landed;
}

}  // namespace

struct TransportBase::RecvState {
  uint64_t id = 0;
  uint64_t lease = 0;
  TransferGeometry g;
  absl::Time deadline;
  ReceiveCallbacks cb;
  ReceiveTarget target;  // empty: layers go to the owner as payloads
  Peer* peer = nullptr;
  uint64_t sender_id = 0;
  std::vector<uint8_t> layer_state;  // 0 not seen, 1 verifying, 2 delivered
  int delivered = 0;
  bool complete = false;
  bool ended = false;
  absl::Status final;
  absl::Time erase_at = absl::InfiniteFuture();
  std::atomic<bool> dead{false};  // read by the delivery thread: no more on_layer
};

struct TransportBase::SendState {
  uint64_t id = 0;
  TransferDescriptor d;
  KvDType source = KvDType::kF16;
  SendDone done;
  Peer* peer = nullptr;     // loop thread
  bool ended_loop = false;  // loop thread

  absl::Mutex mu;
  std::vector<bool> pushed ABSL_GUARDED_BY(mu);
  bool completed ABSL_GUARDED_BY(mu) = false;
  bool ended ABSL_GUARDED_BY(mu) = false;
  absl::Status final ABSL_GUARDED_BY(mu);
};

// The KvSendStream handed to callers: a handle on a SendState of its transport.
class SendStreamImpl final : public KvSendStream {
 public:
  SendStreamImpl(TransportBase* t, std::shared_ptr<TransportBase::SendState> s)
      : t_(t), s_(std::move(s)) {}
  ~SendStreamImpl() override {
    bool ended;
    {
      absl::MutexLock lock(&s_->mu);
      ended = s_->ended;
    }
    if (!ended) Abort(absl::AbortedError("sender stream destroyed before it ended"));
  }
  absl::Status Push(int layer, absl::Span<const engine::KvSpan> spans) override {
    return t_->PushLayer(s_, layer, spans);
  }
  absl::Status Complete() override { return t_->CompleteSend(s_); }
  void Abort(absl::Status reason) override { t_->AbortSend(s_, std::move(reason)); }
  absl::Status Wait(absl::Duration timeout) override {
    absl::MutexLock lock(&s_->mu);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s_->mu) { return s_->ended; };
    if (!s_->mu.AwaitWithTimeout(absl::Condition(&ended), timeout)) {
      return absl::DeadlineExceededError(
          pd::StrCat("KV transfer ", s_->d.transfer_id, " still running"));
    }
    return s_->final;
  }
  bool Ended() override {
    absl::MutexLock lock(&s_->mu);
    return s_->ended;
  }
  uint64_t transfer_id() const override { return s_->d.transfer_id; }

 private:
  TransportBase* t_;
  std::shared_ptr<TransportBase::SendState> s_;
};

TransportBase::TransportBase(const TransportOptions& options)
    : options_(options), pool_(BufferPool::Create(options.pool_bytes)) {}

TransportBase::~TransportBase() {
  // Subclasses stop first (their hooks must not run on a half-destroyed object).
  PD_CHECK_MSG(stopped_ || !loop_thread_.joinable(), "transport subclass did not call Stop()");
}

void TransportBase::Start(std::string address) {
  address_ = std::move(address);
  {
    absl::MutexLock lock(&mu_);
    accepting_ = true;
  }
  loop_thread_ = std::thread([this] { LoopThread(); });
  delivery_thread_ = std::thread([this] { DeliveryThread(); });
}

void TransportBase::Stop(bool graceful) {
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock lock(&mu_);
    stop_requested_ = true;
    graceful_stop_ = graceful;
    accepting_ = false;
  }
  Wake();
  if (loop_thread_.joinable()) loop_thread_.join();
  {
    absl::MutexLock lock(&delivery_mu_);
    delivery_stop_ = true;
  }
  if (delivery_thread_.joinable()) delivery_thread_.join();
}

void TransportBase::Post(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    commands_.push_back(std::move(fn));
  }
  Wake();
}

void TransportBase::Deliver(std::function<void()> fn) {
  absl::MutexLock lock(&delivery_mu_);
  deliveries_.push_back(std::move(fn));
}

void TransportBase::DeliveryThread() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&delivery_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(delivery_mu_) {
        return !deliveries_.empty() || delivery_stop_;
      };
      delivery_mu_.Await(absl::Condition(&ready));
      if (deliveries_.empty()) return;  // stopping and drained
      fn = std::move(deliveries_.front());
      deliveries_.pop_front();
    }
    fn();
  }
}

void TransportBase::RunCommands() {
  for (;;) {
    std::deque<std::function<void()>> batch;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(commands_);
    }
    if (batch.empty()) return;
    for (auto& fn : batch) fn();
  }
}

void TransportBase::LoopThread() {
  bool graceful = true;
  for (;;) {
    bool busy = Progress();
    RunCommands();
    const absl::Duration next = CheckDeadlines();
    {
      absl::MutexLock lock(&mu_);
      if (stop_requested_) {
        graceful = graceful_stop_;
        break;
      }
      if (!commands_.empty()) busy = true;
    }
    if (!busy) WaitForEvents(std::min(next, kMaxWait));
  }
  crashed_ = !graceful;
  RunCommands();
  const absl::Status down = absl::UnavailableError(graceful ? "KV transport shut down"
                                                            : "KV transport crashed (test hook)");
  for (auto& [id, r] : recv_) FinishRecv(*r, down, graceful);
  std::vector<std::shared_ptr<SendState>> sends;
  for (auto& [id, s] : send_) sends.push_back(s);
  for (auto& s : sends) FinishSend(*s, down, graceful);
  CloseAll(graceful);
}

absl::Duration TransportBase::CheckDeadlines() {
  const absl::Time now = absl::Now();
  absl::Time next = absl::InfiniteFuture();
  for (auto it = recv_.begin(); it != recv_.end();) {
    RecvState& r = *it->second;
    if (r.ended) {
      if (now >= r.erase_at) {
        it = recv_.erase(it);
        continue;
      }
      next = std::min(next, r.erase_at);
    } else if (now >= r.deadline) {
      FinishRecv(
          r,
          absl::DeadlineExceededError(pd::StrCat(
              "KV transfer ", r.id, " missed its deadline (", r.delivered, " of ", r.g.n_layer,
              " layers delivered", r.peer ? "" : ", sender never connected", ")")),
          /*tell_sender=*/true);
    } else {
      next = std::min(next, r.deadline);
    }
    ++it;
  }
  std::vector<std::shared_ptr<SendState>> late;
  for (auto& [id, s] : send_) {
    const absl::Time deadline = s->d.deadline + kSenderDeadlineGrace;
    if (now >= deadline) {
      late.push_back(s);
    } else {
      next = std::min(next, deadline);
    }
  }
  for (auto& s : late) {
    FinishSend(*s,
               absl::DeadlineExceededError(pd::StrCat("KV transfer ", s->d.transfer_id,
                                                      " missed its deadline (sender side)")),
               /*tell_receiver=*/true);
  }
  return next == absl::InfiniteFuture() ? kMaxWait : std::max(next - now, absl::ZeroDuration());
}

void TransportBase::Refused(const MsgHeader& h, const char* why) {
  const int64_t n = refused_.fetch_add(1) + 1;
  const absl::Time now = absl::Now();
  if (now - last_refused_log_ < absl::Seconds(10)) return;
  last_refused_log_ = now;
  PD_LOG(kWarning, "KV transport: dropped a ", KindName(static_cast<MsgKind>(h.kind)),
         " message that ", why, " (", n, " dropped so far)");
}

void TransportBase::SendControl(Peer* peer, MsgKind kind, uint64_t transfer_id, uint64_t lease,
                                uint64_t reply_id, uint32_t layer, const absl::Status& status,
                                std::string_view body) {
  if (peer == nullptr || crashed_) return;
  Buffer msg = pool_->Get(sizeof(MsgHeader) + body.size());
  MsgHeader h{};
  h.magic = kMsgMagic;
  h.version = kMsgVersion;
  h.kind = static_cast<uint8_t>(kind);
  h.transfer_id = transfer_id;
  h.lease = lease;
  h.reply_id = reply_id;
  h.layer = layer;
  h.code = static_cast<uint32_t>(status.code());
  h.body_bytes = body.size();
  std::memcpy(msg.data(), &h, sizeof(h));
  if (!body.empty()) std::memcpy(msg.data() + sizeof(h), body.data(), body.size());
  SendMessage(peer, kind, transfer_id, layer, std::move(msg));
}

// ---- receiver ---------------------------------------------------------------------------------

absl::StatusOr<TransferDescriptor> TransportBase::Reserve(const TransferGeometry& geometry,
                                                          absl::Time deadline,
                                                          ReceiveCallbacks callbacks,
                                                          ReceiveTarget target) {
  PD_RETURN_IF_ERROR(geometry.Validate());
  if (!callbacks.on_layer || !callbacks.on_done) {
    return absl::InvalidArgumentError("Reserve: on_layer and on_done callbacks are required");
  }
  if (!target.empty()) {
    if (target.fence == nullptr) {
      return absl::InvalidArgumentError("Reserve: a receive target needs its KvWriteFence");
    }
    if (static_cast<int>(target.layers.size()) != geometry.n_layer) {
      return absl::InvalidArgumentError(pd::StrCat("Reserve: the receive target has ",
                                                   target.layers.size(), " layers, the transfer ",
                                                   geometry.n_layer));
    }
    for (int l = 0; l < geometry.n_layer; ++l) {
      PD_RETURN_IF_ERROR(CheckLandingSpans(geometry, l, target.layers[l]));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (!accepting_) return absl::FailedPreconditionError("KV transport is shut down");
  }
  auto r = std::make_shared<RecvState>();
  r->id = next_id_.fetch_add(1);
  r->lease = RandomId();
  r->g = geometry;
  r->deadline = deadline;
  r->cb = std::move(callbacks);
  r->target = std::move(target);
  r->layer_state.assign(geometry.n_layer, 0);
  ++active_;
  TransferDescriptor d;
  d.transport = std::string(kind());
  d.address = address_;
  d.transfer_id = r->id;
  d.lease = r->lease;
  d.geometry = geometry;
  d.deadline = deadline;
  Post([this, r] { recv_[r->id] = r; });
  return d;
}

void TransportBase::AbortReceive(uint64_t transfer_id, absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError("aborted by the receiver");
  Post([this, transfer_id, reason] {
    auto it = recv_.find(transfer_id);
    if (it == recv_.end()) return;
    FinishRecv(*it->second, reason, /*tell_sender=*/true);
  });
}

void TransportBase::FinishRecv(RecvState& r, absl::Status status, bool tell_sender) {
  if (r.ended) return;
  r.ended = true;
  r.final = status;
  r.dead = true;
  r.erase_at = absl::Now() + kTombstone;
  --active_;
  if (tell_sender && r.peer != nullptr) {
    SendControl(r.peer, status.ok() ? MsgKind::kAck : MsgKind::kReceiverAbort, r.sender_id,
                r.lease, 0, 0, status, std::string(status.message()));
  }
  if (!status.ok()) {
    PD_LOG(kInfo, "KV transfer ", r.id, " (receiver) ended: ", status.ToString());
  }
  auto on_done = r.cb.on_done;
  const uint64_t id = r.id;
  Deliver([on_done, id, status] { on_done(id, status); });
}

void TransportBase::MaybeCompleteRecv(RecvState& r) {
  if (!r.ended && r.complete && r.delivered == r.g.n_layer) {
    FinishRecv(r, absl::OkStatus(), /*tell_sender=*/true);
  }
}

void TransportBase::OnMessage(Buffer msg) {
  MsgHeader h;
  if (msg.size() < sizeof(h)) {
    PD_LOG(kWarning, "KV transport: dropped a ", msg.size(), "-byte message (no header)");
    return;
  }
  std::memcpy(&h, msg.data(), sizeof(h));
  if (h.magic != kMsgMagic || h.version != kMsgVersion || h.kind < 1 || h.kind > 6) {
    PD_LOG(kWarning, "KV transport: dropped a message with a bad header");
    return;
  }
  if (ToReceiver(static_cast<MsgKind>(h.kind))) {
    HandleToReceiver(h, std::move(msg));
  } else {
    HandleToSender(h, std::move(msg));
  }
}

void TransportBase::HandleToReceiver(const MsgHeader& h, Buffer msg) {
  const MsgKind kind = static_cast<MsgKind>(h.kind);
  const size_t body = msg.size() - sizeof(MsgHeader);
  auto it = recv_.find(h.transfer_id);
  if (it == recv_.end()) {
    RunCommands();  // a Reserve posted just before the descriptor left may not have run yet
    it = recv_.find(h.transfer_id);
  }
  // Only the holder of the transfer's lease is heard. Anything else (an unknown id, a guessed or
  // replayed one with the wrong lease) is dropped before a byte of it is used: no reply, so a
  // forged hello cannot make this node connect to an address of the forger's choosing.
  if (it == recv_.end() || it->second->lease != h.lease) {
    Refused(h, it == recv_.end() ? "names no open transfer" : "carries a wrong lease");
    return;
  }
  if (it->second->ended) {
    // Tell the lease holder that says hello to a transfer that is over why.
    if (kind == MsgKind::kHello) {
      auto peer =
          GetPeer(std::string(reinterpret_cast<const char*>(msg.data()) + sizeof(MsgHeader), body));
      const absl::Status why = it->second->final;
      if (peer.ok()) {
        SendControl(*peer, why.ok() ? MsgKind::kAck : MsgKind::kReceiverAbort, h.reply_id,
                    h.lease, 0, 0, why, std::string(why.message()));
      }
    }
    return;
  }
  const std::shared_ptr<RecvState> rp = it->second;
  RecvState& r = *rp;
  switch (kind) {
    case MsgKind::kHello: {
      auto peer =
          GetPeer(std::string(reinterpret_cast<const char*>(msg.data()) + sizeof(MsgHeader), body));
      if (!peer.ok()) {
        FinishRecv(r, WithPrefix(peer.status(), "cannot reach the sender: "), false);
        return;
      }
      r.peer = *peer;
      r.sender_id = h.reply_id;
      return;
    }
    case MsgKind::kLayer: {
      const int layer = static_cast<int>(h.layer);
      if (layer < 0 || layer >= r.g.n_layer) {
        FinishRecv(r,
                   absl::InvalidArgumentError(pd::StrCat("KV transfer ", r.id, ": layer ", layer,
                                                         " out of range [0, ", r.g.n_layer, ")")),
                   true);
        return;
      }
      if (r.layer_state[layer] != 0) {
        FinishRecv(r,
                   absl::InvalidArgumentError(
                       pd::StrCat("KV transfer ", r.id, ": layer ", layer, " sent twice")),
                   true);
        return;
      }
      if (h.body_bytes != body || body != r.g.LayerBytes()) {
        FinishRecv(r,
                   absl::DataLossError(pd::StrCat(
                       "KV transfer ", r.id, ": short transfer: layer ", layer, " carried ", body,
                       " bytes (header says ", h.body_bytes, "), expected ", r.g.LayerBytes(),
                       " = ", r.g.n_blocks(), " blocks x 2 x ", r.g.SpanBytes(r.g.wire_dtype),
                       " bytes of ", engine::KvDTypeName(r.g.wire_dtype))),
                   true);
        return;
      }
      r.layer_state[layer] = 1;
      auto holder = std::make_shared<Buffer>(std::move(msg));
      const uint64_t expected = h.checksum;
      // The delivery thread hashes the layer (landing it in the target's blocks in the same pass
      // when there is one): the loop thread goes on receiving the next one.
      Deliver([this, rp, layer, holder, expected] {
        if (rp->dead) return;
        const absl::StatusOr<uint64_t> hashed = HashOrLandLayer(
            rp->g, rp->id, layer,
            {holder->data() + sizeof(MsgHeader), holder->size() - sizeof(MsgHeader)}, rp->target);
        if (!hashed.ok()) {
          rp->dead = true;
          Post([this, rp, st = hashed.status()] { FinishRecv(*rp, st, true); });
          return;
        }
        const uint64_t got = *hashed;
        const bool landed = !rp->target.empty();
        if (landed) *holder = Buffer();  // back to the pool now: the bytes are in the cache
        if (got != expected) {
          rp->dead = true;
          Post([this, rp, layer, got, expected] {
            FinishRecv(*rp,
                       absl::DataLossError(pd::StrCat("KV transfer ", rp->id,
                                                      ": checksum mismatch in layer ", layer,
                                                      " (xxh3 of the payload ", absl::Hex(got),
                                                      ", sender's ", absl::Hex(expected), ")")),
                       true);
          });
          return;
        }
        LayerPayload p;
        p.transfer_id = rp->id;
        p.layer = layer;
        p.geometry = rp->g;
        p.landed = landed;
        if (!landed) {
          p.storage = std::move(*holder);
          p.offset = sizeof(MsgHeader);
        }
        rp->cb.on_layer(std::move(p));
        Post([this, rp, layer] {
          if (rp->ended) return;
          rp->layer_state[layer] = 2;
          ++rp->delivered;
          MaybeCompleteRecv(*rp);
        });
      });
      return;
    }
    case MsgKind::kComplete: {
      r.complete = true;
      if (static_cast<int>(h.layer) != r.g.n_layer) {
        FinishRecv(r,
                   absl::DataLossError(pd::StrCat("KV transfer ", r.id,
                                                  ": short transfer: the sender completed after ",
                                                  h.layer, " of ", r.g.n_layer, " layers")),
                   true);
        return;
      }
      MaybeCompleteRecv(r);
      return;
    }
    case MsgKind::kSenderAbort: {
      const std::string text(reinterpret_cast<const char*>(msg.data()) + sizeof(MsgHeader), body);
      absl::StatusCode code = static_cast<absl::StatusCode>(h.code);
      if (h.code == 0 || h.code > 16) code = absl::StatusCode::kAborted;
      FinishRecv(r, absl::Status(code, pd::StrCat("sender aborted KV transfer ", r.id, ": ", text)),
                 false);
      return;
    }
    default:
      return;
  }
}

// ---- sender -----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvSendStream>> TransportBase::Connect(
    const TransferDescriptor& descriptor, KvDType source_dtype, SendDone done) {
  if (descriptor.transport != kind()) {
    return absl::InvalidArgumentError(pd::StrCat(
        "descriptor is for transport '", descriptor.transport, "', this one is '", kind(), "'"));
  }
  PD_RETURN_IF_ERROR(descriptor.geometry.Validate());
  if (absl::Now() >= descriptor.deadline) {
    return absl::DeadlineExceededError(
        pd::StrCat("KV transfer ", descriptor.transfer_id, ": deadline passed before Connect"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!accepting_) return absl::FailedPreconditionError("KV transport is shut down");
  }
  auto s = std::make_shared<SendState>();
  s->id = next_id_.fetch_add(1);
  s->d = descriptor;
  if (options_.faults.wrong_lease) s->d.lease ^= 0x9e3779b97f4a7c15ULL;
  s->source = source_dtype;
  s->done = std::move(done);
  {
    absl::MutexLock lock(&s->mu);
    s->pushed.assign(descriptor.geometry.n_layer, false);
  }
  ++active_;
  Post([this, s] {
    send_[s->id] = s;
    auto peer = GetPeer(s->d.address);
    if (!peer.ok()) {
      FinishSend(*s, WithPrefix(peer.status(), "cannot reach the receiver: "), false);
      return;
    }
    s->peer = *peer;
    SendControl(s->peer, MsgKind::kHello, s->d.transfer_id, s->d.lease, s->id, 0,
                absl::OkStatus(), address_);
  });
  return std::unique_ptr<KvSendStream>(new SendStreamImpl(this, s));
}

absl::Status TransportBase::PushLayer(const std::shared_ptr<SendState>& s, int layer,
                                      absl::Span<const engine::KvSpan> spans) {
  const TransferGeometry& g = s->d.geometry;
  {
    absl::MutexLock lock(&s->mu);
    if (s->ended) return s->final.ok() ? absl::FailedPreconditionError("transfer ended") : s->final;
    if (layer < 0 || layer >= g.n_layer) {
      return absl::InvalidArgumentError(
          pd::StrCat("Push: layer ", layer, " out of range [0, ", g.n_layer, ")"));
    }
    if (s->pushed[layer]) {
      return absl::InvalidArgumentError(pd::StrCat("Push: layer ", layer, " pushed twice"));
    }
    if (s->completed) return absl::FailedPreconditionError("Push after Complete");
    s->pushed[layer] = true;
  }
  const FaultOptions& f = options_.faults;
  // A layer sent in place cannot have its payload altered (it is the cache): corrupt_layer flips
  // a bit of its checksum instead; the other faults go through the staging path.
  const bool staged_faults =
      f.truncate_layer >= 0 || f.stall_after_layers >= 0 || f.overrun_layer >= 0;
  if (options_.zero_copy_send && s->source == g.wire_dtype && !staged_faults) {
    std::vector<ByteRun> runs;
    uint64_t checksum = 0;
    absl::Status found = LayerRuns(g, s->source, layer, spans, &runs, &checksum);
    if (!found.ok()) {
      absl::MutexLock lock(&s->mu);
      s->pushed[layer] = false;
      return found;
    }
    // A badly fragmented layer (blocks scattered over the cache) goes through the staging copy:
    // one network message per run would cost more than the copy.
    if (runs.size() <= kMaxRunsInPlace) {
      if (f.corrupt_layer == layer) checksum ^= 1;
      Buffer header = pool_->Get(sizeof(MsgHeader));
      const MsgHeader h =
          LayerHeader(s->d.transfer_id, s->d.lease, layer, checksum, g.LayerBytes());
      std::memcpy(header.data(), &h, sizeof(h));
      auto holder = std::make_shared<Buffer>(std::move(header));
      Post([this, s, layer, holder, runs = std::move(runs)]() mutable {
        if (s->ended_loop || s->peer == nullptr || crashed_) return;
        SendLayerRuns(s->peer, s->d.transfer_id, static_cast<uint32_t>(layer), std::move(*holder),
                      std::move(runs));
      });
      return absl::OkStatus();
    }
  }
  size_t body = g.LayerBytes();
  const size_t extra = f.overrun_layer == layer ? g.SpanBytes(g.wire_dtype) : 0;
  Buffer msg = pool_->Get(sizeof(MsgHeader) + body + extra);
  uint64_t checksum = 0;
  absl::Status packed = PackLayer(g, s->source, layer, spans,
                                  absl::MakeSpan(msg.data() + sizeof(MsgHeader), body), &checksum);
  if (!packed.ok()) {
    absl::MutexLock lock(&s->mu);
    s->pushed[layer] = false;
    return packed;
  }
  if (f.corrupt_layer == layer) msg.data()[sizeof(MsgHeader) + body / 2] ^= 0x5a;
  if (f.truncate_layer == layer) {
    body -= g.SpanBytes(g.wire_dtype);
    msg.set_size(sizeof(MsgHeader) + body);
  }
  if (extra > 0) {
    std::memset(msg.data() + sizeof(MsgHeader) + body, 0x7f, extra);
    body += extra;
  }
  const MsgHeader h = LayerHeader(s->d.transfer_id, s->d.lease, layer, checksum, body);
  std::memcpy(msg.data(), &h, sizeof(h));
  if (f.stall_after_layers >= 0 && layer >= f.stall_after_layers) return absl::OkStatus();
  auto holder = std::make_shared<Buffer>(std::move(msg));
  Post([this, s, layer, holder] {
    if (s->ended_loop || s->peer == nullptr || crashed_) return;
    SendMessage(s->peer, MsgKind::kLayer, s->d.transfer_id, static_cast<uint32_t>(layer),
                std::move(*holder));
  });
  return absl::OkStatus();
}

void TransportBase::SendLayerRuns(Peer* peer, uint64_t transfer_id, uint32_t layer, Buffer header,
                                  std::vector<ByteRun> runs) {
  size_t body = 0;
  for (const ByteRun& r : runs) body += r.bytes;
  Buffer msg = pool_->Get(sizeof(MsgHeader) + body);
  std::memcpy(msg.data(), header.data(), sizeof(MsgHeader));
  uint8_t* p = msg.data() + sizeof(MsgHeader);
  for (const ByteRun& r : runs) {
    std::memcpy(p, r.data, r.bytes);
    p += r.bytes;
  }
  SendMessage(peer, MsgKind::kLayer, transfer_id, layer, std::move(msg));
}

absl::Status TransportBase::CompleteSend(const std::shared_ptr<SendState>& s) {
  int pushed = 0;
  {
    absl::MutexLock lock(&s->mu);
    if (s->ended) return s->final.ok() ? absl::FailedPreconditionError("transfer ended") : s->final;
    if (s->completed) return absl::FailedPreconditionError("Complete called twice");
    s->completed = true;
    pushed = static_cast<int>(std::count(s->pushed.begin(), s->pushed.end(), true));
  }
  Post([this, s, pushed] {
    if (s->ended_loop || s->peer == nullptr) return;
    SendControl(s->peer, MsgKind::kComplete, s->d.transfer_id, s->d.lease, 0,
                static_cast<uint32_t>(pushed), absl::OkStatus(), {});
  });
  return absl::OkStatus();
}

void TransportBase::AbortSend(const std::shared_ptr<SendState>& s, absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError("aborted by the sender");
  Post([this, s, reason] { FinishSend(*s, reason, /*tell_receiver=*/true); });
}

void TransportBase::FinishSend(SendState& s, absl::Status status, bool tell_receiver) {
  if (s.ended_loop) return;
  s.ended_loop = true;
  if (tell_receiver && !status.ok() && s.peer != nullptr) {
    SendControl(s.peer, MsgKind::kSenderAbort, s.d.transfer_id, s.d.lease, 0, 0, status,
                std::string(status.message()));
  }
  {
    absl::MutexLock lock(&s.mu);
    s.ended = true;
    s.final = status;
  }
  --active_;
  if (!status.ok()) {
    PD_LOG(kInfo, "KV transfer ", s.d.transfer_id, " (sender) ended: ", status.ToString());
  }
  if (s.done) {
    auto done = s.done;
    Deliver([done, status] { done(status); });
  }
  send_.erase(s.id);  // may destroy the last loop reference; `s` is kept alive by callers
}

void TransportBase::HandleToSender(const MsgHeader& h, Buffer msg) {
  auto it = send_.find(h.transfer_id);
  if (it == send_.end()) return;  // ended already: late ACK / ABORT
  if (it->second->d.lease != h.lease) {
    Refused(h, "carries a wrong lease");  // a forged ACK or ABORT for one of our streams
    return;
  }
  const std::shared_ptr<SendState> s = it->second;
  const size_t body = msg.size() - sizeof(MsgHeader);
  if (static_cast<MsgKind>(h.kind) == MsgKind::kAck) {
    FinishSend(*s, absl::OkStatus(), false);
    return;
  }
  const std::string text(reinterpret_cast<const char*>(msg.data()) + sizeof(MsgHeader), body);
  absl::StatusCode code = static_cast<absl::StatusCode>(h.code);
  if (h.code == 0 || h.code > 16) code = absl::StatusCode::kAborted;
  FinishSend(
      *s,
      absl::Status(code, pd::StrCat("receiver aborted KV transfer ", s->d.transfer_id, ": ", text)),
      false);
}

// ---- failures reported by the subclass --------------------------------------------------------

void TransportBase::OnReceiveFailed(MsgKind kind, uint64_t transfer_id, absl::Status status) {
  const absl::Status st =
      absl::UnavailableError(pd::StrCat("receiving ", KindName(kind), " of KV transfer ",
                                        transfer_id, " failed: ", status.message()));
  if (ToReceiver(kind)) {
    auto it = recv_.find(transfer_id);
    if (it != recv_.end()) FinishRecv(*it->second, st, true);
  } else {
    auto it = send_.find(transfer_id);
    if (it != send_.end()) {
      auto s = it->second;
      FinishSend(*s, st, true);
    }
  }
}

void TransportBase::OnPeerFailed(Peer* peer, absl::Status status) {
  for (auto& [id, r] : recv_) {
    if (r->peer != peer) continue;
    FinishRecv(*r, WithPrefix(status, "sender disconnected: "), false);
    r->peer = nullptr;
  }
  std::vector<std::shared_ptr<SendState>> hit;
  for (auto& [id, s] : send_) {
    if (s->peer == peer) hit.push_back(s);
  }
  for (auto& s : hit) {
    s->peer = nullptr;
    FinishSend(*s, WithPrefix(status, "receiver disconnected: "), false);
  }
}

}  // namespace pd::kvtransfer::internal
