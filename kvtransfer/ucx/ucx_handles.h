// Move-only RAII owners of the UCX handles the UCX transport uses, and UCX status -> absl::Status.
// Nothing outside kvtransfer/ucx/ sees a UCX type.
#pragma once

#include <ucp/api/ucp.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "common/strings.h"

namespace pd::kvtransfer::ucx {

// A UCX error as a Status with context; UNAVAILABLE for unreachable/failed peers and
// resources, INTERNAL for the rest.
inline absl::Status UcsError(ucs_status_t s, std::string_view what) {
  const std::string msg = pd::StrCat(what, ": ", ucs_status_string(s));
  switch (s) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
      return absl::UnavailableError(msg);
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::DataLossError(msg);
    case UCS_ERR_INVALID_PARAM:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Generic move-only owner: `Release(h)` frees a non-null handle.
template <typename H, void (*Release)(H)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  H get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }
  void reset() {
    if (h_ != nullptr) Release(std::exchange(h_, nullptr));
  }

 private:
  H h_ = nullptr;
};

inline void ReleaseConfig(ucp_config_t* c) { ucp_config_release(c); }
inline void ReleaseContext(ucp_context_h c) { ucp_cleanup(c); }
inline void ReleaseWorker(ucp_worker_h w) { ucp_worker_destroy(w); }

using Config = Handle<ucp_config_t*, ReleaseConfig>;
using Context = Handle<ucp_context_h, ReleaseContext>;
using Worker = Handle<ucp_worker_h, ReleaseWorker>;

// A file descriptor (eventfd, epoll); move-only, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

// An endpoint to a peer worker. Closing needs the worker to progress, so it is explicit:
// Close() starts a flush (graceful) or forced close and returns the request to progress (or
// nullptr when done). The destructor force-closes without waiting (the worker must still exist).
class Endpoint {
 public:
  Endpoint() = default;
  explicit Endpoint(ucp_ep_h ep) : ep_(ep) {}
  Endpoint(Endpoint&& o) noexcept : ep_(std::exchange(o.ep_, nullptr)) {}
  Endpoint& operator=(Endpoint&& o) noexcept {
    if (this != &o) {
      Close(false);
      ep_ = std::exchange(o.ep_, nullptr);
    }
    return *this;
  }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint() {
    void* req = Close(false);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) ucp_request_free(req);
  }
  ucp_ep_h get() const { return ep_; }
  // Starts closing; returns a request pointer the caller must progress and free, or nullptr.
  void* Close(bool graceful) {
    if (ep_ == nullptr) return nullptr;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = graceful ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(std::exchange(ep_, nullptr), &p);
    return UCS_PTR_IS_ERR(req) ? nullptr : req;
  }

 private:
  ucp_ep_h ep_ = nullptr;
};

}  // namespace pd::kvtransfer::ucx
