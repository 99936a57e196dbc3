// Fuzz target: what a KV transport takes from the network (kvtransfer/): transfer descriptors
// (TransferDescriptor::Parse) and the protocol messages (transport_base.h, MsgHeader + body) that
// reach a receiver holding a real reservation in a KvCache.
//
// Input: byte 0 picks the mode.
//   bit 7 set: the rest is a descriptor. Parse() either refuses it with INVALID_ARGUMENT or
//     accepts a valid geometry that serializes back to the same bytes; an accepted descriptor is
//     then handed to Connect, as a prefill node does.
//   bit 7 clear: a receiver. Bits 0-1 pick the cache dtype (f16, f32, int8), bit 2 an INT8 wire
//     (else the cache's dtype: the two a decode node asks for). Then the number of prompt tokens,
//     the first block sent, and messages until the input ends: a control byte, a 56-byte MsgHeader
//     and a body. The control byte may repair parts of the header (magic and version, kind and
//     layer range, the reservation's transfer id and lease or the open send stream's, body_bytes,
//     the checksum) and choose the body (free bytes, one layer of the right size, one byte off,
//     a sender address), so that the fuzzer reaches every branch past the lease check; and it
//     may close the reservation's KvWriteFence after the message, as the engine does when it
//     takes the blocks back.
//
// The receiver is TransportBase itself (the protocol core every transport shares) under a
// transport whose network is this harness: messages are handed to its loop thread as a UCX or
// in-process transport hands them over. What must hold, from kv_transport.h and transport_base.h:
//  - no byte of the cache outside the reservation's blocks (those from first_block on) changes,
//    and none of them changes after the fence was closed;
//  - a layer delivered to the owner is one the receiver accepted whole: its blocks hold exactly
//    that layer's payload (same dtype on the wire and in the cache);
//  - on_layer fires at most once per layer and only for layers in range, on_done exactly once;
//    the send stream's done callback exactly once.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_write_fence.h"
#include "kvtransfer/checksum.h"
#include "kvtransfer/kv_transport.h"
#include "kvtransfer/transport_base.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_targets.h"

namespace pd::fuzz {
namespace {

using kvtransfer::KvDType;
using kvtransfer::TransferDescriptor;
using kvtransfer::TransferGeometry;
using kvtransfer::internal::MsgHeader;
using kvtransfer::internal::MsgKind;

constexpr std::string_view kPeerName = "fuzz-peer";  // the one address GetPeer resolves
constexpr int kMaxMessages = 48;

// A transport whose network is the harness: Inject() hands a message to the loop thread, which
// runs the shared protocol code (OnMessage) on it; what the protocol sends goes nowhere.
class HarnessTransport final : public kvtransfer::internal::TransportBase {
 public:
  HarnessTransport() : TransportBase(kvtransfer::TransportOptions()) { Start("fuzz-receiver"); }
  ~HarnessTransport() override { Stop(/*graceful=*/true); }

  std::string_view kind() const override { return "fuzz"; }

  // Delivers `bytes` as one incoming message and returns once the loop thread has handled it.
  void Inject(std::string_view bytes) {
    kvtransfer::Buffer msg = pool().Get(bytes.size());
    if (!bytes.empty()) std::memcpy(msg.data(), bytes.data(), bytes.size());
    absl::MutexLock lock(&mu_);
    inbox_.push_back(std::move(msg));
    const uint64_t want = ++injected_;
    auto done = [this, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return handled_ >= want; };
    mu_.Await(absl::Condition(&done));
  }

 protected:
  absl::StatusOr<kvtransfer::internal::Peer*> GetPeer(const std::string& address) override {
    if (address != kPeerName) return absl::UnavailableError("fuzz: no such peer");
    return &peer_;
  }
  void SendMessage(kvtransfer::internal::Peer*, MsgKind, uint64_t, uint32_t,
                   kvtransfer::Buffer) override {}
  bool Progress() override {
    std::vector<kvtransfer::Buffer> batch;
    {
      absl::MutexLock lock(&mu_);
      batch.swap(inbox_);
    }
    for (kvtransfer::Buffer& m : batch) {
      OnMessage(std::move(m));
      absl::MutexLock lock(&mu_);
      ++handled_;
    }
    return !batch.empty();
  }
  void WaitForEvents(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !inbox_.empty() || woken_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    woken_ = false;
  }
  void Wake() override {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  }
  void CloseAll(bool) override {}

 private:
  kvtransfer::internal::Peer peer_;
  absl::Mutex mu_;
  std::vector<kvtransfer::Buffer> inbox_ ABSL_GUARDED_BY(mu_);
  uint64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handled_ ABSL_GUARDED_BY(mu_) = 0;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

engine::Backend& Cpu() {
  static engine::Backend* b = engine::CreateCpuBackend({.threads = 1}).release();
  return *b;
}

void QuietLogs() {
  static const bool once = [] {
    SetMinLogLevel(LogLevel::kError);  // every ended transfer logs at info level
    return true;
  }();
  (void)once;
}

// ---- descriptors --------------------------------------------------------------------------

void FuzzDescriptor(std::string_view bytes) {
  absl::StatusOr<TransferDescriptor> d = TransferDescriptor::Parse(bytes);
  if (!d.ok()) {
    PD_CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  PD_CHECK_MSG(d->geometry.Validate().ok(), "Parse accepted an invalid geometry");
  PD_CHECK(d->geometry.n_blocks() >= 1);
  PD_CHECK(d->geometry.LayerBytes() <= (size_t{1} << 32));
  PD_CHECK_MSG(d->Serialize() == bytes, "a parsed descriptor does not serialize back");
  // As a prefill node: connect to what it names (refused, or a stream to a peer that is not
  // there, or to the harness's one peer), then drop the stream.
  HarnessTransport t;
  absl::StatusOr<std::unique_ptr<kvtransfer::KvSendStream>> s =
      t.Connect(*d, KvDType::kF16, nullptr);
  if (s.ok()) {
    PD_CHECK(d->transport == t.kind());
    s->reset();
  } else {
    PD_CHECK(s.status().code() == absl::StatusCode::kInvalidArgument ||
             s.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
}

// ---- a receiver on messages ---------------------------------------------------------------

struct Owner {
  absl::Mutex mu;
  std::vector<int> layers ABSL_GUARDED_BY(mu);
  bool bad_layer ABSL_GUARDED_BY(mu) = false;
  int done_calls ABSL_GUARDED_BY(mu) = 0;
  int send_done_calls ABSL_GUARDED_BY(mu) = 0;
};

// Every byte of every layer's K and V tensor.
std::vector<std::string> Snapshot(engine::KvCache& kv) {
  std::vector<std::string> out;
  for (int l = 0; l < kv.options().n_layer; ++l) {
    for (engine::KvTensor* t : {&kv.k(l), &kv.v(l)}) {
      out.emplace_back(static_cast<const char*>(t->data), t->bytes());
    }
  }
  return out;
}

void FuzzReceiver(uint8_t mode, FuzzInput& in) {
  static const KvDType kDTypes[] = {KvDType::kF16, KvDType::kF32, KvDType::kI8, KvDType::kF16};
  const KvDType dtype = kDTypes[mode & 3];
  const KvDType wire = mode & 4 ? KvDType::kI8 : dtype;
  engine::KvCacheOptions o;
  o.n_layer = 2;
  o.n_kv_heads = 2;
  o.head_dim = 16;
  o.block_size = 4;
  o.n_blocks = 8;
  o.dtype = dtype;
  std::unique_ptr<engine::KvCache> kv = *engine::KvCache::Create(o, Cpu());
  // The reservation (sequence 2, up to 3 blocks) between two other sequences' blocks.
  const int n_tokens = 1 + static_cast<int>(in.Pick(12));
  PD_CHECK_OK(kv->Reserve(1, 4));
  PD_CHECK_OK(kv->Reserve(2, n_tokens));
  PD_CHECK_OK(kv->Reserve(3, 4));
  TransferGeometry g = TransferGeometry::ForCache(o, n_tokens, wire);
  g.first_block = static_cast<int>(in.Pick(static_cast<size_t>(g.total_blocks())));
  for (int l = 0; l < o.n_layer; ++l) {
    for (engine::KvTensor* t : {&kv->k(l), &kv->v(l)}) {
      auto* p = static_cast<uint8_t*>(t->data);
      for (size_t i = 0; i < t->bytes(); ++i) p[i] = static_cast<uint8_t>(i * 131 + l * 7 + 1);
    }
  }
  const std::vector<std::string> before = Snapshot(*kv);
  // Where the transport may write: the reservation's blocks from first_block on.
  std::vector<std::vector<bool>> writable;
  for (const std::string& t : before) writable.emplace_back(t.size(), false);
  kvtransfer::ReceiveTarget target;
  target.fence = std::make_shared<engine::KvWriteFence>();
  for (int l = 0; l < o.n_layer; ++l) {
    target.layers.push_back(*kv->ExportSpans(2, l));
    for (const engine::KvSpan& s : target.layers.back()) {
      if (s.block_index < g.first_block) continue;
      engine::KvTensor& t = s.part == engine::KvPart::kK ? kv->k(l) : kv->v(l);
      const size_t off =
          static_cast<size_t>(static_cast<char*>(s.data) - static_cast<char*>(t.data));
      std::vector<bool>& w = writable[2 * l + (s.part == engine::KvPart::kK ? 0 : 1)];
      std::fill(w.begin() + off, w.begin() + off + s.bytes, true);
    }
  }
  const std::vector<std::vector<engine::KvSpan>> spans = target.layers;
  const std::shared_ptr<engine::KvWriteFence> fence = target.fence;

  Owner owner;
  auto transport = std::make_unique<HarnessTransport>();
  kvtransfer::ReceiveCallbacks cb;
  cb.on_layer = [&owner, &g](kvtransfer::LayerPayload p) {
    absl::MutexLock lock(&owner.mu);
    if (p.layer < 0 || p.layer >= g.n_layer || !p.landed ||
        std::count(owner.layers.begin(), owner.layers.end(), p.layer) > 0) {
      owner.bad_layer = true;
    }
    owner.layers.push_back(p.layer);
  };
  cb.on_done = [&owner](uint64_t, absl::Status) {
    absl::MutexLock lock(&owner.mu);
    ++owner.done_calls;
  };
  absl::StatusOr<TransferDescriptor> d =
      transport->Reserve(g, absl::Now() + absl::Seconds(60), cb, std::move(target));
  PD_CHECK_OK(d.status());

  // A send stream of this transport, to the harness's peer, so that ACK / RECEIVER_ABORT
  // messages have a stream to reach. Ids are sequential per transport (transport_base.h): the
  // reservation took the first, the stream takes the next.
  TransferDescriptor to_peer = *d;
  to_peer.address = std::string(kPeerName);
  to_peer.transfer_id = 1000;
  to_peer.lease = 0x5eed5eed5eed5eedULL;
  auto sent = transport->Connect(to_peer, dtype, [&owner](absl::Status) {
    absl::MutexLock lock(&owner.mu);
    ++owner.send_done_calls;
  });
  PD_CHECK_OK(sent.status());
  const uint64_t stream_id = d->transfer_id + 1;

  std::map<int, std::string> accepted_payload;  // the first well-formed payload of each layer
  std::vector<std::string> after_close;
  for (int i = 0; i < kMaxMessages && !in.empty(); ++i) {
    const uint8_t ctl = in.Byte();
    MsgHeader h;
    const std::string_view raw = in.Bytes(sizeof(h));
    std::memset(&h, 0, sizeof(h));
    std::memcpy(&h, raw.data(), raw.size());
    if (ctl & 1) {
      h.magic = kvtransfer::internal::kMsgMagic;
      h.version = kvtransfer::internal::kMsgVersion;
    }
    if (ctl & 2) {
      h.kind = static_cast<uint8_t>(1 + h.kind % 6);
      h.layer %= static_cast<uint32_t>(g.n_layer + 1);
    }
    const bool to_receiver = kvtransfer::internal::ToReceiver(static_cast<MsgKind>(h.kind));
    if (ctl & 4) {
      h.transfer_id = to_receiver ? d->transfer_id : stream_id;
      h.lease = to_receiver ? d->lease : to_peer.lease;
    }
    std::string body;
    switch ((ctl >> 3) & 3) {
      case 0:
        body = std::string(in.Short());
        break;
      case 1:
      case 2: {  // a layer's size (or one byte off), from the input's bytes repeated
        const std::string_view fill = in.Short();
        size_t n = g.LayerBytes();
        if (((ctl >> 3) & 3) == 2) n = ctl & 0x80 ? n + 1 : n - 1;
        body.resize(n);
        for (size_t k = 0; k < n; ++k) body[k] = fill.empty() ? 0 : fill[k % fill.size()];
        break;
      }
      case 3:
        body = std::string(kPeerName);
        break;
    }
    if (ctl & 0x20) h.body_bytes = body.size();
    if (ctl & 0x40) h.checksum = kvtransfer::Checksum64(body.data(), body.size());
    const bool well_formed = h.magic == kvtransfer::internal::kMsgMagic &&
                             h.version == kvtransfer::internal::kMsgVersion &&
                             h.kind == static_cast<uint8_t>(MsgKind::kLayer) &&
                             h.transfer_id == d->transfer_id && h.lease == d->lease &&
                             h.layer < static_cast<uint32_t>(g.n_layer) &&
                             body.size() == g.LayerBytes() && h.body_bytes == body.size();
    if (well_formed && !accepted_payload.count(static_cast<int>(h.layer))) {
      accepted_payload[static_cast<int>(h.layer)] = body;
    }
    std::string msg(reinterpret_cast<const char*>(&h), sizeof(h));
    msg += body;
    transport->Inject(msg);
    if (well_formed) {
      // The loop thread has taken the layer; the delivery thread lands and verifies it. Either it
      // reaches the owner or the transfer ends (checksum, fence, a duplicate, ended before):
      // wait for that, so that the next message meets the state this one left.
      const int layer = static_cast<int>(h.layer);
      absl::MutexLock lock(&owner.mu);
      auto settled = [&owner, layer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner.mu) {
        return owner.done_calls > 0 ||
               std::count(owner.layers.begin(), owner.layers.end(), layer) > 0;
      };
      PD_CHECK_MSG(owner.mu.AwaitWithTimeout(absl::Condition(&settled), absl::Seconds(20)),
                   "a whole layer was neither delivered nor did it end the transfer");
    }
    // The engine takes its blocks back (bit 7 with a free body: no size meaning there).
    if ((ctl & 0x80) && ((ctl >> 3) & 3) != 2 && after_close.empty()) {
      fence->Close();
      after_close = Snapshot(*kv);
    }
  }

  // The owner gives up on the transfer (no-op if it ended), then everything is torn down; the
  // delivery thread has run every callback once the transport is gone.
  transport->AbortReceive(d->transfer_id, absl::CancelledError("fuzz input over"));
  {
    absl::MutexLock lock(&owner.mu);
    auto done = [&owner]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner.mu) { return owner.done_calls > 0; };
    PD_CHECK_MSG(owner.mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(20)),
                 "on_done never fired");
  }
  sent->reset();
  transport.reset();

  absl::MutexLock lock(&owner.mu);
  PD_CHECK_MSG(owner.done_calls == 1, "on_done fired more than once");
  PD_CHECK_MSG(owner.send_done_calls == 1, "the send stream's done did not fire exactly once");
  PD_CHECK_MSG(!owner.bad_layer, "on_layer: a layer out of range, twice, or not landed");
  const std::vector<std::string> now = Snapshot(*kv);
  for (size_t t = 0; t < now.size(); ++t) {
    for (size_t i = 0; i < now[t].size(); ++i) {
      if (!writable[t][i]) {
        PD_CHECK_MSG(now[t][i] == before[t][i], "a write outside the reservation");
      }
    }
  }
  if (!after_close.empty()) PD_CHECK_MSG(now == after_close, "a write after the fence closed");
  if (wire != dtype) return;  // converted on landing: the payload bytes are not what is stored
  const size_t span = g.SpanBytes(wire);
  const int nb = g.n_blocks();
  for (int layer : owner.layers) {
    auto it = accepted_payload.find(layer);
    PD_CHECK_MSG(it != accepted_payload.end(), "a layer was delivered that was never sent whole");
    for (int w = 0; w < 2 * nb; ++w) {  // wire order: K of each block, then V
      const int block = g.first_block + (w < nb ? w : w - nb);
      const engine::KvSpan& s = spans[layer][2 * block + (w < nb ? 0 : 1)];
      PD_CHECK_MSG(std::memcmp(s.data, it->second.data() + w * span, span) == 0,
                   "a delivered layer's blocks differ from its payload");
    }
  }
}

}  // namespace

int FuzzKvFrame(const uint8_t* data, size_t size) {
  QuietLogs();
  FuzzInput in(data, size);
  const uint8_t mode = in.Byte();
  if (mode & 0x80) {
    FuzzDescriptor(in.Rest());
  } else {
    FuzzReceiver(mode, in);
  }
  return 0;
}

}  // namespace pd::fuzz
