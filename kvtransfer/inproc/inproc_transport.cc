#include "kvtransfer/inproc/inproc_transport.h"

#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "kvtransfer/transport_base.h"

namespace pd::kvtransfer {
namespace {

class InprocTransport;

// Name -> live transport. A transport enqueues into a peer only under this lock, and unregisters
// under it before it goes away, so a registered pointer is always alive.
struct Registry {
  absl::Mutex mu;
  std::map<std::string, InprocTransport*> by_name ABSL_GUARDED_BY(mu);
};
Registry& GetRegistry() {
  static Registry* r = new Registry;
  return *r;
}
std::atomic<uint64_t> next_name{1};

struct InprocPeer final : internal::Peer {
  explicit InprocPeer(std::string n) : name(std::move(n)) {}
  std::string name;
};

class InprocTransport final : public internal::TransportBase {
 public:
  explicit InprocTransport(const TransportOptions& options) : TransportBase(options) {}
  ~InprocTransport() override { Stop(/*graceful=*/true); }

  // Registers under `name` and starts the threads.
  absl::Status Init(std::string name) {
    {
      Registry& reg = GetRegistry();
      absl::MutexLock lock(&reg.mu);
      if (reg.by_name.count(name) != 0) {
        return absl::AlreadyExistsError(
            pd::StrCat("an in-process KV transport named '", name, "' exists"));
      }
      reg.by_name[name] = this;
    }
    name_ = name;
    Start(name);
    return absl::OkStatus();
  }

  std::string_view kind() const override { return "inproc"; }

  // Registry holders only: queue an event for the loop thread.
  void Enqueue(Buffer msg, std::string gone) {
    absl::MutexLock lock(&inbox_mu_);
    inbox_.push_back({std::move(msg), std::move(gone)});
  }

 protected:
  absl::StatusOr<internal::Peer*> GetPeer(const std::string& address) override {
    auto it = peers_.find(address);
    if (it != peers_.end()) return it->second.get();
    {
      Registry& reg = GetRegistry();
      absl::MutexLock lock(&reg.mu);
      if (reg.by_name.count(address) == 0) {
        return absl::UnavailableError(
            pd::StrCat("no in-process KV transport named '", address, "'"));
      }
    }
    auto peer = std::make_unique<InprocPeer>(address);
    internal::Peer* p = peer.get();
    peers_[address] = std::move(peer);
    return p;
  }

  void SendMessage(internal::Peer* peer, internal::MsgKind, uint64_t, uint32_t,
                   Buffer msg) override {
    const std::string& name = static_cast<InprocPeer*>(peer)->name;
    Registry& reg = GetRegistry();
    absl::MutexLock lock(&reg.mu);
    auto it = reg.by_name.find(name);
    if (it == reg.by_name.end()) {
      failed_.push_back(name);  // reported from Progress, not from inside a protocol step
      return;
    }
    it->second->Enqueue(std::move(msg), {});
    it->second->Wake();
  }

  bool Progress() override {
    std::deque<Event> events;
    {
      absl::MutexLock lock(&inbox_mu_);
      events.swap(inbox_);
    }
    std::vector<std::string> failed;
    failed.swap(failed_);
    for (Event& e : events) {
      if (e.gone.empty()) {
        OnMessage(std::move(e.msg));
      } else {
        failed.push_back(e.gone);
      }
    }
    for (const std::string& name : failed) {
      auto it = peers_.find(name);
      if (it == peers_.end()) continue;
      std::unique_ptr<internal::Peer> peer = std::move(it->second);
      peers_.erase(it);
      OnPeerFailed(peer.get(),
                   absl::UnavailableError(pd::StrCat("in-process transport '", name, "' is gone")));
    }
    return !events.empty() || !failed.empty();
  }

  void WaitForEvents(absl::Duration timeout) override {
    absl::MutexLock lock(&inbox_mu_);
    auto ready = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox_mu_) { return !inbox_.empty() || woken_; };
    inbox_mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    woken_ = false;
  }

  void Wake() override {
    absl::MutexLock lock(&inbox_mu_);
    woken_ = true;
  }

  void CloseAll(bool graceful) override {
    // Unregister, then tell every other transport (as a dead process's sockets would).
    Registry& reg = GetRegistry();
    absl::MutexLock lock(&reg.mu);
    reg.by_name.erase(name_);
    for (auto& [name, t] : reg.by_name) {
      t->Enqueue(Buffer(), name_);
      t->Wake();
    }
    peers_.clear();
  }

 private:
  struct Event {
    Buffer msg;
    std::string gone;  // non-empty: the transport of this name went away
  };
  std::string name_;
  absl::Mutex inbox_mu_;
  std::deque<Event> inbox_ ABSL_GUARDED_BY(inbox_mu_);
  bool woken_ ABSL_GUARDED_BY(inbox_mu_) = false;
  // Loop thread only.
  std::map<std::string, std::unique_ptr<internal::Peer>> peers_;
  std::vector<std::string> failed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> CreateInprocTransport(
    const TransportOptions& options) {
  std::string name = options.inproc_name;
  if (name.empty()) name = pd::StrCat("inproc-", next_name.fetch_add(1));
  auto t = std::make_unique<InprocTransport>(options);
  absl::Status s = t->Init(name);
  if (!s.ok()) return s;
  return std::unique_ptr<KvTransport>(std::move(t));
}

}  // namespace pd::kvtransfer
