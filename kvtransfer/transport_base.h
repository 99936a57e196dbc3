// The KV transfer protocol, shared by every transport: transfer state on both sides, the message
// format, deadlines, the progress (loop) thread and the delivery thread. A transport subclass only
// moves messages (docs/kv_transfer.md, "Protocol"): it resolves peer addresses, sends a message
// buffer to a peer, drives its network, and reports incoming messages and broken peers.
//
// Threads: the loop thread runs Progress()/WaitForEvents() of the subclass, the commands that API
// calls post, and the deadline checks; all transfer state below is touched only there (except the
// sender's per-stream API state, guarded by its own mutex). The delivery thread verifies layer
// checksums and runs the owners' callbacks in order, so neither slows the network.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/buffer_pool.h"
#include "kvtransfer/kv_codec.h"
#include "kvtransfer/kv_transport.h"

namespace pd::kvtransfer::internal {

enum class MsgKind : uint8_t {
  kHello = 1,        // sender -> receiver: body = the sender's transport address
  kLayer = 2,        // sender -> receiver: body = one layer payload (TransferGeometry::LayerBytes)
  kComplete = 3,     // sender -> receiver: `layer` = number of layers the sender pushed
  kSenderAbort = 4,  // sender -> receiver: `code` = absl::StatusCode, body = the message
  kAck = 5,          // receiver -> sender: every layer verified and delivered
  kReceiverAbort = 6,  // receiver -> sender: `code` = absl::StatusCode, body = the message
};

// At the start of every message. Little-endian; 56 bytes.
struct MsgHeader {
  uint32_t magic;        // kMsgMagic
  uint8_t version;       // kMsgVersion
  uint8_t kind;          // MsgKind
  uint16_t reserved;     // 0
  uint64_t transfer_id;  // in the destination's namespace: receiver id, or the sender's stream id
  uint64_t reply_id;     // kHello: the sender's stream id (for kAck / kAbort back); else 0
  uint32_t layer;        // kLayer: layer index; kComplete: layers pushed
  uint32_t code;         // k*Abort: absl::StatusCode
  uint64_t body_bytes;   // bytes after the header
  uint64_t checksum;     // kLayer: Checksum64 (XXH3-64) of the body; else 0
  // The transfer's lease (TransferDescriptor::lease), in both directions: a message whose lease is
  // not its transfer's is dropped unread (refused_messages()).
  uint64_t lease;
};
static_assert(sizeof(MsgHeader) == 56);
constexpr uint32_t kMsgMagic = 0x4d4b4450;  // "PDKM"
constexpr uint8_t kMsgVersion = 2;

// 64 bits from the kernel's CSPRNG (getrandom), never 0: the transfers' leases.
uint64_t RandomId();

// Whom a message is for: the receiving half or the sending half of the destination transport.
inline bool ToReceiver(MsgKind k) {
  return k == MsgKind::kHello || k == MsgKind::kLayer || k == MsgKind::kComplete ||
         k == MsgKind::kSenderAbort;
}

// A connection to another transport, owned by the subclass. Valid until the subclass reports it
// failed (OnPeerFailed) or the transport stops.
class Peer {
 public:
  virtual ~Peer() = default;
};

class TransportBase : public KvTransport {
 public:
  ~TransportBase() override;

  absl::StatusOr<TransferDescriptor> Reserve(const TransferGeometry& geometry, absl::Time deadline,
                                             ReceiveCallbacks callbacks,
                                             ReceiveTarget target) override;
  void AbortReceive(uint64_t transfer_id, absl::Status reason) override;
  absl::StatusOr<std::unique_ptr<KvSendStream>> Connect(const TransferDescriptor& descriptor,
                                                        KvDType source_dtype,
                                                        SendDone done) override;
  const std::string& address() const override { return address_; }
  int active_transfers() const override { return active_.load(); }
  int64_t refused_messages() const override { return refused_.load(); }
  void CrashForTest() override { Stop(/*graceful=*/false); }

  struct SendState;  // one send stream (kv_transport's KvSendStream shares it)

 protected:
  explicit TransportBase(const TransportOptions& options);

  // ---- for subclasses ----
  // Starts the loop and delivery threads; call at the end of the subclass constructor.
  void Start(std::string address);
  // Stops both threads (idempotent). graceful: abort open transfers telling the peers, then
  // CloseAll(true); otherwise end them locally (UNAVAILABLE) and CloseAll(false). Subclass
  // destructors must call it before their members go away.
  void Stop(bool graceful);
  // Posts `fn` to run on the loop thread.
  void Post(std::function<void()> fn);
  // Loop thread: a complete message arrived (header + body in `msg`). A layer's checksum is
  // verified on the delivery thread.
  void OnMessage(Buffer msg);
  // Loop thread: a message to transfer `transfer_id` (of `kind`) could not be received.
  void OnReceiveFailed(MsgKind kind, uint64_t transfer_id, absl::Status status);
  // Loop thread: `peer` is broken; every transfer using it ends UNAVAILABLE. The subclass may
  // destroy `peer` after this returns.
  void OnPeerFailed(Peer* peer, absl::Status status);
  BufferPool& pool() { return *pool_; }

  // ---- subclass hooks, all on the loop thread ----
  // The peer at `address`, connecting if needed (UNAVAILABLE if it cannot).
  virtual absl::StatusOr<Peer*> GetPeer(const std::string& address) = 0;
  // Sends `msg` (header + body) to `peer`, tagged for `kind`/`transfer_id`/`layer`; takes
  // ownership of `msg`. Failures are reported through OnPeerFailed.
  virtual void SendMessage(Peer* peer, MsgKind kind, uint64_t transfer_id, uint32_t layer,
                           Buffer msg) = 0;
  // Sends a layer message whose body is not in `header` but in `runs` (host memory that stays
  // valid until the transfer ends: TransportOptions::zero_copy_send); `header` holds the
  // MsgHeader only, its body_bytes the runs' total. The receiving side must hand OnMessage the
  // same bytes as SendMessage(header + runs) would. Default: copies the runs into one buffer
  // and calls SendMessage.
  virtual void SendLayerRuns(Peer* peer, uint64_t transfer_id, uint32_t layer, Buffer header,
                             std::vector<ByteRun> runs);
  // Drives the network once; calls OnMessage / OnReceiveFailed / OnPeerFailed. True if it did work.
  virtual bool Progress() = 0;
  // Blocks up to `timeout` for network activity or Wake().
  virtual void WaitForEvents(absl::Duration timeout) = 0;
  // Any thread: makes WaitForEvents return.
  virtual void Wake() = 0;
  // Loop thread, at stop: graceful: flush and close every connection; else drop them at once.
  virtual void CloseAll(bool graceful) = 0;

  const TransportOptions options_;

 private:
  struct RecvState;
  friend class SendStreamImpl;

  void LoopThread();
  void DeliveryThread();
  void Deliver(std::function<void()> fn);
  void RunCommands();
  absl::Duration CheckDeadlines();
  void HandleToReceiver(const MsgHeader& h, Buffer msg);
  void HandleToSender(const MsgHeader& h, Buffer msg);
  void FinishRecv(RecvState& r, absl::Status status, bool tell_sender);
  void MaybeCompleteRecv(RecvState& r);
  void FinishSend(SendState& s, absl::Status status, bool tell_receiver);
  // Counts a message dropped unread (`why`), and logs it at most every 10 s.
  void Refused(const MsgHeader& h, const char* why);
  void SendControl(Peer* peer, MsgKind kind, uint64_t transfer_id, uint64_t lease, uint64_t reply_id,
                   uint32_t layer, const absl::Status& status, std::string_view body);
  // Sender API (any thread) -> loop.
  absl::Status PushLayer(const std::shared_ptr<SendState>& s, int layer,
                         absl::Span<const engine::KvSpan> spans);
  absl::Status CompleteSend(const std::shared_ptr<SendState>& s);
  void AbortSend(const std::shared_ptr<SendState>& s, absl::Status reason);

  std::shared_ptr<BufferPool> pool_;
  std::string address_;
  std::atomic<int> active_{0};
  // Transfer and stream ids: unique, sequential (UCX tags carry their low 40 bits). The lease,
  // not the id, is the secret.
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> refused_{0};  // messages dropped: no such transfer, or a wrong lease
  absl::Time last_refused_log_ = absl::InfinitePast();  // loop thread

  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool graceful_stop_ ABSL_GUARDED_BY(mu_) = true;
  bool accepting_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex delivery_mu_;
  std::deque<std::function<void()>> deliveries_ ABSL_GUARDED_BY(delivery_mu_);
  bool delivery_stop_ ABSL_GUARDED_BY(delivery_mu_) = false;

  std::thread loop_thread_, delivery_thread_;
  bool stopped_ = false;  // Stop() ran (owner thread only)
  bool crashed_ = false;  // loop thread: stopping without telling peers (CrashForTest)

  // Loop thread only.
  std::map<uint64_t, std::shared_ptr<RecvState>> recv_;
  std::map<uint64_t, std::shared_ptr<SendState>> send_;
};

}  // namespace pd::kvtransfer::internal
