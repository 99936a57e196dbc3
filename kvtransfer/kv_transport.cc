#include "kvtransfer/kv_transport.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "common/host_alloc.h"
#include "common/status.h"
#include "common/strings.h"
#include "kvtransfer/buffer_pool.h"
#include "kvtransfer/inproc/inproc_transport.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace pd::kvtransfer {
namespace {

constexpr uint32_t kDescriptorMagic = 0x444b4450;  // "PDKD" little-endian
constexpr uint16_t kDescriptorVersion = 3;  // 2: geometry.first_block; 3: lease

bool ValidDType(uint8_t t) { return t <= static_cast<uint8_t>(KvDType::kI8); }

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
    out_.append(b, sizeof(T));
  }
  void PutBytes(std::string_view s) { out_.append(s.data(), s.size()); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetBytes(size_t n, std::string* s) {
    if (in_.size() < n) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  size_t left() const { return in_.size(); }

 private:
  std::string_view in_;
};

}  // namespace

size_t TransferGeometry::SpanBytes(KvDType t) const {
  const size_t token_heads = static_cast<size_t>(block_size) * static_cast<size_t>(n_kv_heads);
  return token_heads * static_cast<size_t>(head_dim) * engine::KvValueBytes(t) +
         token_heads * engine::KvScaleBytes(t);
}

absl::Status TransferGeometry::Validate() const {
  auto range = [](const char* name, int v, int hi) -> absl::Status {
    if (v <= 0 || v > hi) {
      return absl::InvalidArgumentError(
          pd::StrCat("transfer geometry: ", name, " = ", v, " (must be in [1, ", hi, "])"));
    }
    return absl::OkStatus();
  };
  PD_RETURN_IF_ERROR(range("n_layer", n_layer, 4096));
  PD_RETURN_IF_ERROR(range("n_kv_heads", n_kv_heads, 1 << 12));
  PD_RETURN_IF_ERROR(range("head_dim", head_dim, 1 << 14));
  PD_RETURN_IF_ERROR(range("block_size", block_size, 1 << 12));
  PD_RETURN_IF_ERROR(range("n_tokens", n_tokens, 1 << 24));
  if (first_block < 0 || first_block >= total_blocks()) {
    return absl::InvalidArgumentError(
        pd::StrCat("transfer geometry: first_block = ", first_block, " (must be in [0, ",
                   total_blocks(), "): at least the last block of ", n_tokens, " tokens travels)"));
  }
  if (!ValidDType(static_cast<uint8_t>(receiver_dtype)) ||
      !ValidDType(static_cast<uint8_t>(wire_dtype))) {
    return absl::InvalidArgumentError("transfer geometry: unknown receiver or wire dtype");
  }
  if (LayerBytes() > (size_t{1} << 32)) {
    return absl::InvalidArgumentError(
        pd::StrCat("transfer geometry: one layer is ", LayerBytes(), " bytes (limit 4 GiB)"));
  }
  return absl::OkStatus();
}

TransferGeometry TransferGeometry::ForCache(const engine::KvCacheOptions& o, int n_tokens,
                                            KvDType wire) {
  TransferGeometry g;
  g.n_layer = o.n_layer;
  g.n_kv_heads = o.n_kv_heads;
  g.head_dim = o.head_dim;
  g.block_size = o.block_size;
  g.n_tokens = n_tokens;
  g.receiver_dtype = o.dtype;
  g.wire_dtype = wire;
  return g;
}

absl::Status TransferGeometry::CheckCache(const engine::KvCacheOptions& o) const {
  auto same = [](const char* name, int mine, int theirs) -> absl::Status {
    if (mine == theirs) return absl::OkStatus();
    return absl::FailedPreconditionError(
        pd::StrCat("KV cache ", name, " is ", theirs, " but the transfer has ", mine));
  };
  PD_RETURN_IF_ERROR(same("n_layer", n_layer, o.n_layer));
  PD_RETURN_IF_ERROR(same("n_kv_heads", n_kv_heads, o.n_kv_heads));
  PD_RETURN_IF_ERROR(same("head_dim", head_dim, o.head_dim));
  PD_RETURN_IF_ERROR(same("block_size", block_size, o.block_size));
  return absl::OkStatus();
}

std::string TransferDescriptor::Serialize() const {
  Writer w;
  w.Put(kDescriptorMagic);
  w.Put(kDescriptorVersion);
  w.Put(static_cast<uint16_t>(transport.size()));
  w.PutBytes(transport);
  w.Put(static_cast<uint32_t>(address.size()));
  w.PutBytes(address);
  w.Put(transfer_id);
  w.Put(lease);
  w.Put(static_cast<int32_t>(geometry.n_layer));
  w.Put(static_cast<int32_t>(geometry.n_kv_heads));
  w.Put(static_cast<int32_t>(geometry.head_dim));
  w.Put(static_cast<int32_t>(geometry.block_size));
  w.Put(static_cast<int32_t>(geometry.n_tokens));
  w.Put(static_cast<uint8_t>(geometry.receiver_dtype));
  w.Put(static_cast<uint8_t>(geometry.wire_dtype));
  w.Put(static_cast<int32_t>(geometry.first_block));
  const int64_t deadline_us = deadline == absl::InfiniteFuture()
                                  ? std::numeric_limits<int64_t>::max()
                                  : absl::ToUnixMicros(deadline);
  w.Put(deadline_us);
  return w.Take();
}

absl::StatusOr<TransferDescriptor> TransferDescriptor::Parse(std::string_view bytes) {
  auto bad = [](std::string_view why) {
    return absl::InvalidArgumentError(pd::StrCat("transfer descriptor: ", why));
  };
  Reader r(bytes);
  uint32_t magic = 0;
  uint16_t version = 0, transport_len = 0;
  if (!r.Get(&magic) || magic != kDescriptorMagic) return bad("bad magic (not a descriptor)");
  if (!r.Get(&version) || version != kDescriptorVersion) {
    return bad(pd::StrCat("unsupported version ", version));
  }
  TransferDescriptor d;
  uint32_t address_len = 0;
  if (!r.Get(&transport_len) || !r.GetBytes(transport_len, &d.transport)) return bad("truncated");
  if (!r.Get(&address_len) || address_len > (1u << 20) || !r.GetBytes(address_len, &d.address)) {
    return bad("truncated or oversized address");
  }
  int32_t v[5], first_block = 0;
  uint8_t dt[2];
  int64_t deadline_us = 0;
  if (!r.Get(&d.transfer_id) || !r.Get(&d.lease)) return bad("truncated");
  for (int32_t& x : v) {
    if (!r.Get(&x)) return bad("truncated");
  }
  if (!r.Get(&dt[0]) || !r.Get(&dt[1]) || !r.Get(&first_block) || !r.Get(&deadline_us)) {
    return bad("truncated");
  }
  if (r.left() != 0) return bad(pd::StrCat(r.left(), " trailing bytes"));
  if (!ValidDType(dt[0]) || !ValidDType(dt[1])) return bad("unknown dtype");
  d.geometry = {
      v[0],       v[1], v[2], v[3], v[4], static_cast<KvDType>(dt[0]), static_cast<KvDType>(dt[1]),
      first_block};
  PD_RETURN_IF_ERROR(d.geometry.Validate());
  d.deadline = deadline_us == std::numeric_limits<int64_t>::max()
                   ? absl::InfiniteFuture()
                   : absl::FromUnixMicros(deadline_us);
  return d;
}

// ---- Buffer / BufferPool ----------------------------------------------------------------------

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_), size_(o.size_), capacity_(o.capacity_), pool_(std::move(o.pool_)) {
  o.data_ = nullptr;
  o.size_ = o.capacity_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    new (this) Buffer(std::move(o));
  }
  return *this;
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (pool_) {
    pool_->Return(data_, capacity_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

void Buffer::set_size(size_t n) {
  PD_CHECK(n <= capacity_);
  size_ = n;
}

std::shared_ptr<BufferPool> BufferPool::Create(size_t max_idle_bytes) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_idle_bytes));
}

BufferPool::~BufferPool() {
  for (auto& [cap, p] : idle_) std::free(p);
}

Buffer BufferPool::Get(size_t n) {
  Buffer b;
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.lower_bound(n);
    if (it != idle_.end() && it->first <= n + n / 8) {
      b.data_ = it->second;
      b.capacity_ = it->first;
      idle_bytes_ -= it->first;
      idle_.erase(it);
    }
  }
  if (b.data_ == nullptr) {
    b.capacity_ = n == 0 ? 1 : n;
    // 64-byte aligned so that payloads and headers keep SIMD-friendly alignment.
    b.data_ = static_cast<uint8_t*>(AllocHost(b.capacity_, 64));  // huge pages from 2 MiB
    PD_CHECK_MSG(b.data_ != nullptr, "out of memory for a KV transfer buffer");
  }
  b.size_ = n;
  b.pool_ = shared_from_this();
  return b;
}

void BufferPool::Return(uint8_t* data, size_t capacity) {
  {
    absl::MutexLock lock(&mu_);
    if (idle_bytes_ + capacity <= max_idle_bytes_) {
      idle_.emplace(capacity, data);
      idle_bytes_ += capacity;
      return;
    }
  }
  std::free(data);
}

size_t BufferPool::idle_bytes() const {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

// ---- factory ----------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<KvTransport>> KvTransport::Create(const TransportOptions& options) {
  if (options.kind == "inproc") return CreateInprocTransport(options);
  if (options.kind == "ucx") return CreateUcxTransport(options);
  return absl::InvalidArgumentError(
      pd::StrCat("unknown KV transport kind '", options.kind, "' (ucx, inproc)"));
}

}  // namespace pd::kvtransfer
