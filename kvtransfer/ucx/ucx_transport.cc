#include "kvtransfer/ucx/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "kvtransfer/transport_base.h"
#include "kvtransfer/ucx/ucx_handles.h"

namespace pd::kvtransfer {
namespace {

using internal::MsgKind;

// Tag: [63:56] message kind, [55:40] layer, [39:0] transfer id (in the destination's namespace).
// Every message on a worker is taken by a wildcard probe; the tag tells which transfer a failed
// receive belonged to before its header has arrived.
// `kind` is a MsgKind or one of the UCX-only kinds below.
uint64_t MakeTag(uint8_t kind, uint64_t transfer_id, uint32_t layer) {
  return (static_cast<uint64_t>(kind) << 56) | ((static_cast<uint64_t>(layer) & 0xffff) << 40) |
         (transfer_id & ((uint64_t{1} << 40) - 1));
}
uint64_t MakeTag(MsgKind kind, uint64_t transfer_id, uint32_t layer) {
  return MakeTag(static_cast<uint8_t>(kind), transfer_id, layer);
}
uint8_t TagKind(uint64_t tag) { return static_cast<uint8_t>(tag >> 56); }

// A layer sent in place (SendLayerRuns) travels as one LAYER_HEAD message, [MsgHeader][uint64
// number of parts], then that many LAYER_PART messages, each one contiguous run of the payload in
// order, sent zero-copy from the sender's cache. UCX matches messages from one endpoint in the
// order they were sent, so a layer's parts are probed after its head; the receiver receives them
// one after the other into a single buffer and hands it to the protocol as one LAYER message.
// These two kinds exist only on the UCX wire (outside MsgKind's range). Runs are cut into parts
// of at most kPartBytes, so that no single copy (done inside the receiver's worker progress)
// holds its loop thread for long: other transfers' messages and deadlines are served in between.
constexpr uint8_t kTagLayerHead = 0x40;
constexpr uint8_t kTagLayerPart = 0x41;
constexpr size_t kPartBytes = size_t{1} << 20;
uint32_t TagLayer(uint64_t tag) { return static_cast<uint32_t>((tag >> 40) & 0xffff); }
uint64_t TagTransfer(uint64_t tag) { return tag & ((uint64_t{1} << 40) - 1); }

class UcxTransport;

struct UcxPeer final : internal::Peer {
  UcxTransport* t = nullptr;
  std::string address;
  ucx::Endpoint ep;
  bool failed = false;
};

class UcxTransport;

struct SendReq {
  UcxTransport* t;
  std::shared_ptr<UcxPeer> peer;
  Buffer msg;
};
struct RecvReq {
  UcxTransport* t;
  uint64_t tag;
  Buffer msg;
};

// A layer arriving in parts (LAYER_HEAD + LAYER_PART messages), received one after the other into
// one buffer. Its checksum is verified by the delivery thread once every part is in (so that this
// thread, which does the copies, goes on to the next part at once).
struct Assembly {
  uint64_t tag = 0;         // the LAYER tag (kind, layer, transfer) failures are reported under
  Buffer msg;               // MsgHeader + body, filled part by part
  size_t filled = 0;        // body bytes received into msg (or posted)
  uint64_t parts_left = 0;  // parts not yet probed
  int pending = 0;          // parts posted and not yet received
  absl::Status failed;      // a part did not fit or failed
};
struct PartReq {
  UcxTransport* t;
  std::shared_ptr<Assembly> a;
};

class UcxTransport final : public internal::TransportBase {
 public:
  explicit UcxTransport(const TransportOptions& options) : TransportBase(options) {}
  ~UcxTransport() override {
    Stop(/*graceful=*/true);
    peers_.clear();
    worker_.reset();
    context_.reset();
  }

  absl::Status Init() {
    ucp_config_t* raw_config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw_config);
    if (st != UCS_OK) return ucx::UcsError(st, "ucp_config_read");
    ucx::Config config(raw_config);
    if (!options_.ucx_tls.empty()) {
      st = ucp_config_modify(config.get(), "TLS", options_.ucx_tls.c_str());
      if (st != UCS_OK) return ucx::UcsError(st, pd::StrCat("UCX_TLS=", options_.ucx_tls));
    }
    if (!options_.ucx_keepalive_interval.empty()) {
      st = ucp_config_modify(config.get(), "KEEPALIVE_INTERVAL",
                             options_.ucx_keepalive_interval.c_str());
      if (st != UCS_OK) return ucx::UcsError(st, "UCX_KEEPALIVE_INTERVAL");
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    ucp_context_h ctx = nullptr;
    st = ucp_init(&params, config.get(), &ctx);
    if (st != UCS_OK) {
      return absl::UnavailableError(
          pd::StrCat("UCX cannot create a context: ", ucs_status_string(st)));
    }
    context_ = ucx::Context(ctx);

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // only the loop thread drives it
    ucp_worker_h w = nullptr;
    st = ucp_worker_create(context_.get(), &wp, &w);
    if (st != UCS_OK) {
      return absl::UnavailableError(
          pd::StrCat("UCX cannot create a worker: ", ucs_status_string(st)));
    }
    worker_ = ucx::Worker(w);

    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = ucp_worker_get_address(worker_.get(), &addr, &addr_len);
    if (st != UCS_OK) return ucx::UcsError(st, "ucp_worker_get_address");
    std::string address(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_.get(), addr);

    int efd = -1;
    st = ucp_worker_get_efd(worker_.get(), &efd);
    if (st != UCS_OK) return ucx::UcsError(st, "ucp_worker_get_efd");
    wake_fd_ = ucx::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    epoll_fd_ = ucx::Fd(::epoll_create1(EPOLL_CLOEXEC));
    if (wake_fd_.get() < 0 || epoll_fd_.get() < 0) {
      return absl::InternalError(pd::StrCat("eventfd/epoll: ", std::strerror(errno)));
    }
    for (int fd : {efd, wake_fd_.get()}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        return absl::InternalError(pd::StrCat("epoll_ctl: ", std::strerror(errno)));
      }
    }
    Start(std::move(address));
    return absl::OkStatus();
  }

  std::string_view kind() const override { return "ucx"; }

 protected:
  absl::StatusOr<internal::Peer*> GetPeer(const std::string& address) override {
    auto it = peers_.find(address);
    if (it != peers_.end() && !it->second->failed) return it->second.get();
    if (worker_.get() == nullptr) return absl::UnavailableError("UCX worker is gone");
    auto peer = std::make_shared<UcxPeer>();
    peer->t = this;
    peer->address = address;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer->address.data());
    ep.err_mode =
        options_.ucx_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &UcxTransport::EpError;
    ep.err_handler.arg = peer.get();
    ucp_ep_h h = nullptr;
    const ucs_status_t st = ucp_ep_create(worker_.get(), &ep, &h);
    if (st != UCS_OK) return ucx::UcsError(st, "ucp_ep_create (connecting to the peer)");
    peer->ep = ucx::Endpoint(h);
    internal::Peer* p = peer.get();
    peers_[address] = std::move(peer);
    return p;
  }

  void SendMessage(internal::Peer* p, MsgKind kind, uint64_t transfer_id, uint32_t layer,
                   Buffer msg) override {
    auto* raw = static_cast<UcxPeer*>(p);
    std::shared_ptr<UcxPeer> peer = Find(raw);
    if (!peer || peer->failed) return;
    const void* data = msg.data();
    const size_t size = msg.size();
    Send(peer, MakeTag(kind, transfer_id, layer), data, size, std::move(msg));
  }

  // Sends `size` bytes at `data` with `tag`; `keep` (the buffer holding them, or empty for memory
  // the caller keeps valid) lives until the send completes.
  void Send(const std::shared_ptr<UcxPeer>& peer, uint64_t tag, const void* data, size_t size,
            Buffer keep) {
    auto* req = new SendReq{this, peer, std::move(keep)};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxTransport::SendDoneCb;
    param.user_data = req;
    void* r = ucp_tag_send_nbx(peer->ep.get(), data, size, tag, &param);
    if (r == nullptr) {
      delete req;  // completed in place
    } else if (UCS_PTR_IS_ERR(r)) {
      FailPeer(peer, ucx::UcsError(UCS_PTR_STATUS(r), "ucp_tag_send_nbx"));
      delete req;
    } else {
      ++inflight_sends_;
    }
  }

  void SendLayerRuns(internal::Peer* p, uint64_t transfer_id, uint32_t layer, Buffer header,
                     std::vector<ByteRun> runs) override {
    auto* raw = static_cast<UcxPeer*>(p);
    std::shared_ptr<UcxPeer> peer = Find(raw);
    if (!peer || peer->failed) return;
    Buffer head = pool().Get(sizeof(internal::MsgHeader) + 8);
    std::memcpy(head.data(), header.data(), sizeof(internal::MsgHeader));
    uint64_t n_parts = 0;
    for (const ByteRun& r : runs) n_parts += (r.bytes + kPartBytes - 1) / kPartBytes;
    std::memcpy(head.data() + sizeof(internal::MsgHeader), &n_parts, 8);
    const void* head_data = head.data();  // before `head` is moved into the request
    const size_t head_size = head.size();
    Send(peer, MakeTag(kTagLayerHead, transfer_id, layer), head_data, head_size,
         std::move(head));
    for (const ByteRun& r : runs) {
      for (size_t off = 0; off < r.bytes; off += kPartBytes) {
        if (peer->failed) return;
        Send(peer, MakeTag(kTagLayerPart, transfer_id, layer), r.data + off,
             std::min(kPartBytes, r.bytes - off), Buffer());
      }
    }
  }

  bool Progress() override {
    if (worker_.get() == nullptr) return false;
    bool did = false;
    while (ucp_worker_progress(worker_.get()) != 0) did = true;
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h m = ucp_tag_probe_nb(worker_.get(), 0, 0, /*remove=*/1, &info);
      if (m == nullptr) break;
      did = true;
      const uint8_t kind = TagKind(info.sender_tag);
      if (kind == kTagLayerHead) {
        ReceiveHead(m, info);
        continue;
      }
      if (kind == kTagLayerPart) {
        ReceivePart(m, info);
        continue;
      }
      auto* req = new RecvReq{this, info.sender_tag, pool().Get(info.length)};
      void* r = PostReceive(m, req->msg.data(), req->msg.size(), &UcxTransport::RecvDoneCb, req);
      if (r == nullptr) {
        ready_.push_back(std::move(req->msg));
        delete req;
      } else if (UCS_PTR_IS_ERR(r)) {
        recv_failed_.push_back({info.sender_tag, ucx::UcsError(UCS_PTR_STATUS(r), "receive")});
        delete req;
      }
    }
    // Protocol steps run here, outside UCX callbacks.
    while (!ready_.empty() || !recv_failed_.empty() || !failed_peers_.empty()) {
      did = true;
      std::vector<Buffer> ready;
      ready.swap(ready_);
      for (auto& b : ready) OnMessage(std::move(b));
      std::vector<std::pair<uint64_t, absl::Status>> rf;
      rf.swap(recv_failed_);
      for (auto& [tag, st] : rf) {
        OnReceiveFailed(static_cast<MsgKind>(TagKind(tag)), TagTransfer(tag), st);
      }
      std::vector<std::pair<std::shared_ptr<UcxPeer>, absl::Status>> fp;
      fp.swap(failed_peers_);
      for (auto& [peer, st] : fp) {
        OnPeerFailed(peer.get(), st);
        auto it = peers_.find(peer->address);
        if (it != peers_.end() && it->second == peer) peers_.erase(it);
        void* req = peer->ep.Close(/*graceful=*/false);
        if (req != nullptr) ucp_request_free(req);
      }
    }
    return did;
  }

  void WaitForEvents(absl::Duration timeout) override {
    if (worker_.get() != nullptr && ucp_worker_arm(worker_.get()) == UCS_ERR_BUSY) return;
    epoll_event ev[4];
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
    const int n = ::epoll_wait(epoll_fd_.get(), ev, 4, ms < 1 ? 1 : ms);
    for (int i = 0; i < n; ++i) {
      if (ev[i].data.fd == wake_fd_.get()) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &v, sizeof(v));
      }
    }
  }

  void Wake() override {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(wake_fd_.get(), &one, sizeof(one));
  }

  void CloseAll(bool graceful) override {
    if (worker_.get() == nullptr) return;
    std::vector<void*> reqs;
    if (graceful) {
      // Let in-flight sends (the ABORTs just queued) drain, then flush-close every endpoint.
      const absl::Time until = absl::Now() + absl::Seconds(2);
      while (inflight_sends_ > 0 && absl::Now() < until) ucp_worker_progress(worker_.get());
    }
    for (auto& [addr, peer] : peers_) {
      void* r = peer->ep.Close(graceful);
      if (r != nullptr) reqs.push_back(r);
    }
    const absl::Time until = absl::Now() + absl::Seconds(2);
    for (void* r : reqs) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < until) {
        ucp_worker_progress(worker_.get());
      }
      ucp_request_free(r);
    }
    peers_.clear();
    assemblies_.clear();
    if (!graceful) worker_.reset();  // as if the process died: no goodbyes
  }

 private:
  // Receives probed message `m` into `size` bytes at `dst`; `done(request, status, info,
  // user_data)` runs when it completes later. Returns ucp_tag_msg_recv_nbx's result (nullptr:
  // completed in place, `done` will not run).
  void* PostReceive(ucp_tag_message_h m, void* dst, size_t size, ucp_tag_recv_nbx_callback_t done,
                    void* user_data) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.recv = done;
    param.user_data = user_data;
    return ucp_tag_msg_recv_nbx(worker_.get(), dst, size, m, &param);
  }

  // Key of a layer in flight: (transfer, layer) as the tag carries them.
  static uint64_t AssemblyKey(uint64_t tag) { return tag & ((uint64_t{1} << 56) - 1); }

  // Receives a small message synchronously (it is eager: the data is here once probed).
  absl::StatusOr<Buffer> ReceiveSmall(ucp_tag_message_h m, const ucp_tag_recv_info_t& info) {
    Buffer b = pool().Get(info.length);
    ucp_request_param_t param{};
    void* r = ucp_tag_msg_recv_nbx(worker_.get(), b.data(), b.size(), m, &param);
    if (r == nullptr) return b;
    if (UCS_PTR_IS_ERR(r)) return ucx::UcsError(UCS_PTR_STATUS(r), "receive");
    ucs_status_t st;
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) ucp_worker_progress(worker_.get());
    ucp_request_free(r);
    if (st != UCS_OK) return ucx::UcsError(st, "receive");
    return b;
  }

  void ReceiveHead(ucp_tag_message_h m, const ucp_tag_recv_info_t& info) {
    const uint64_t tag = MakeTag(MsgKind::kLayer, TagTransfer(info.sender_tag),
                                 TagLayer(info.sender_tag));
    absl::StatusOr<Buffer> head = ReceiveSmall(m, info);
    if (!head.ok()) {
      recv_failed_.push_back({tag, head.status()});
      return;
    }
    internal::MsgHeader h;
    uint64_t n_parts = 0;
    if (head->size() != sizeof(h) + 8) {
      PD_LOG(kWarning, "KV transport: dropped a ", head->size(), "-byte layer head");
      return;
    }
    std::memcpy(&h, head->data(), sizeof(h));
    std::memcpy(&n_parts, head->data() + sizeof(h), 8);
    auto a = std::make_shared<Assembly>();
    a->tag = tag;
    // The body is bounded by the protocol (a layer payload is at most 4 GiB); a head that claims
    // more cannot be a layer of any transfer: its parts are received and dropped.
    if (h.body_bytes > (uint64_t{4} << 30) || n_parts > (uint64_t{1} << 20)) {
      a->failed = absl::DataLossError(pd::StrCat("layer head claims ", h.body_bytes, " bytes in ",
                                                 n_parts, " parts"));
    } else {
      a->msg = pool().Get(sizeof(h) + h.body_bytes);
      std::memcpy(a->msg.data(), &h, sizeof(h));
    }
    a->parts_left = n_parts;
    assemblies_[AssemblyKey(tag)] = a;  // a repeated head drops the unfinished one
    MaybeAssembled(a);
  }

  void ReceivePart(ucp_tag_message_h m, const ucp_tag_recv_info_t& info) {
    const uint64_t key = AssemblyKey(MakeTag(MsgKind::kLayer, TagTransfer(info.sender_tag),
                                             TagLayer(info.sender_tag)));
    auto it = assemblies_.find(key);
    std::shared_ptr<Assembly> a = it == assemblies_.end() ? nullptr : it->second;
    const size_t room = a && a->failed.ok() ? a->msg.size() - sizeof(internal::MsgHeader) - a->filled
                                            : 0;
    if (a == nullptr || a->parts_left == 0 || info.length > room) {
      // No head for it, or more bytes than the head announced: take it off the wire and drop it.
      if (a != nullptr && a->failed.ok() && a->parts_left > 0) {
        a->failed = absl::DataLossError(pd::StrCat(
            "a part of ", info.length, " bytes overflows the layer (", room, " bytes left)"));
      }
      if (a != nullptr && a->parts_left > 0) --a->parts_left;
      auto* req = new RecvReq{this, 0, pool().Get(info.length)};
      void* r = PostReceive(m, req->msg.data(), req->msg.size(), &UcxTransport::DiscardDoneCb, req);
      if (r == nullptr || UCS_PTR_IS_ERR(r)) delete req;
      if (a != nullptr) MaybeAssembled(a);
      return;
    }
    uint8_t* dst = a->msg.data() + sizeof(internal::MsgHeader) + a->filled;
    a->filled += info.length;
    --a->parts_left;
    auto* req = new PartReq{this, a};
    void* r = PostReceive(m, dst, info.length, &UcxTransport::PartDoneCb, req);
    if (r == nullptr) {
      delete req;
    } else if (UCS_PTR_IS_ERR(r)) {
      if (a->failed.ok()) a->failed = ucx::UcsError(UCS_PTR_STATUS(r), "receiving a layer part");
      delete req;
    } else {
      ++a->pending;
    }
    MaybeAssembled(a);
  }

  // Hands a fully received layer to the protocol (or reports why it failed) once every part
  // arrived.
  void MaybeAssembled(const std::shared_ptr<Assembly>& ap) {
    Assembly& a = *ap;
    if (a.parts_left > 0 || a.pending > 0) return;
    auto it = assemblies_.find(AssemblyKey(a.tag));
    if (it == assemblies_.end() || it->second != ap) return;  // replaced by a repeated head
    if (!a.failed.ok()) {
      recv_failed_.push_back({a.tag, a.failed});
    } else {
      // Fewer bytes than announced stay visible as a short body (the protocol checks the size).
      a.msg.set_size(sizeof(internal::MsgHeader) + a.filled);
      ready_.push_back(std::move(a.msg));
    }
    assemblies_.erase(it);
  }

  static void PartDoneCb(void* request, ucs_status_t status, const ucp_tag_recv_info_t*,
                         void* user_data) {
    auto* req = static_cast<PartReq*>(user_data);
    Assembly& a = *req->a;
    --a.pending;
    if (status != UCS_OK && a.failed.ok()) a.failed = ucx::UcsError(status, "receiving a layer part");
    req->t->MaybeAssembled(req->a);
    delete req;
    ucp_request_free(request);
  }
  static void DiscardDoneCb(void* request, ucs_status_t, const ucp_tag_recv_info_t*,
                            void* user_data) {
    delete static_cast<RecvReq*>(user_data);
    ucp_request_free(request);
  }

  static void EpError(void* arg, ucp_ep_h, ucs_status_t status) {
    // Runs inside ucp_worker_progress on the loop thread; handled after it returns.
    auto* raw = static_cast<UcxPeer*>(arg);
    std::shared_ptr<UcxPeer> p = raw->t->Find(raw);
    if (p) raw->t->FailPeer(p, ucx::UcsError(status, "UCX endpoint error"));
  }
  static void SendDoneCb(void* request, ucs_status_t status, void* user_data) {
    auto* req = static_cast<SendReq*>(user_data);
    --req->t->inflight_sends_;
    if (status != UCS_OK && status != UCS_ERR_CANCELED) {
      req->t->FailPeer(req->peer, ucx::UcsError(status, "send"));
    }
    delete req;
    ucp_request_free(request);
  }
  static void RecvDoneCb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user_data) {
    auto* req = static_cast<RecvReq*>(user_data);
    if (status == UCS_OK) {
      req->msg.set_size(info->length);
      req->t->ready_.push_back(std::move(req->msg));
    } else {
      req->t->recv_failed_.push_back({req->tag, ucx::UcsError(status, "receive")});
    }
    delete req;
    ucp_request_free(request);
  }

  std::shared_ptr<UcxPeer> Find(UcxPeer* raw) {
    for (auto& [addr, p] : peers_) {
      if (p.get() == raw) return p;
    }
    return nullptr;
  }
  void FailPeer(const std::shared_ptr<UcxPeer>& peer, absl::Status status) {
    if (peer->failed) return;
    peer->failed = true;
    failed_peers_.push_back({peer, std::move(status)});
  }

  ucx::Context context_;
  ucx::Worker worker_;
  ucx::Fd wake_fd_, epoll_fd_;
  // Loop thread only.
  std::map<std::string, std::shared_ptr<UcxPeer>> peers_;
  std::vector<Buffer> ready_;  // complete messages
  std::map<uint64_t, std::shared_ptr<Assembly>> assemblies_;
  std::vector<std::pair<uint64_t, absl::Status>> recv_failed_;
  std::vector<std::pair<std::shared_ptr<UcxPeer>, absl::Status>> failed_peers_;
  int inflight_sends_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxTransport(const TransportOptions& options) {
  auto t = std::make_unique<UcxTransport>(options);
  PD_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<KvTransport>(std::move(t));
}

}  // namespace pd::kvtransfer
