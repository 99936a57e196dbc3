// KV transfer between a prefill node (sender) and a decode node (receiver): the KvTransport
// interface, the descriptor the router carries between them, and the factory.
//
// A transfer moves one sequence's KV blocks, layer by layer, from the sender's KvCache to blocks
// the receiver has reserved in its own KvCache. Each layer arrives in a staging buffer; then
// either the transport's delivery thread lands it in the reserved blocks itself (a ReceiveTarget:
// the blocks' host addresses and the fence through which the owner takes them back;
// kv_codec.h's LandLayer copies and hashes in one pass), or, without a target, the verified layer
// is handed to the owner as a LayerPayload, which the owner imports with ImportLayer on its own
// (engine) thread.
//
//   decode node (receiver)                       prefill node (sender)
//   kv.Reserve(seq, n_tokens)   (engine thread; target = its spans + a KvWriteFence)
//   d = transport.Reserve(geometry, deadline, callbacks, target)
//   d.Serialize() --- router ------------------> TransferDescriptor::Parse(bytes)
//                                                s = transport.Connect(d, kv.options().dtype, done)
//                                                per layer, once computed: s->Push(l, spans)
//   delivery thread: LandLayer into target <---- (async; one message per layer)
//   callbacks.on_layer(payload, landed) x n_layer
//   (no target: engine thread ImportLayer(payload, kv, seq))
//                                                s->Complete()
//   callbacks.on_done(OK)                  ----> done(OK)   (the receiver acknowledges)
//
// Every transfer ends exactly once on each side: on_done / done fire once, with OK or the reason
// (ABORTED: the peer aborted; DATA_LOSS: checksum mismatch or short transfer; UNAVAILABLE: the
// peer died or disconnected; DEADLINE_EXCEEDED: the descriptor's deadline passed; INVALID_ARGUMENT:
// the sender's data does not fit the descriptor). On any failure the receiver's owner releases the
// reserved blocks and prefills locally (docs/architecture.md, request path step 6).
// docs/kv_transfer.md describes the protocol, the threads and the failure semantics.
//
// Thread safety: every KvTransport and KvSendStream method may be called from any thread. Each
// transport runs its own progress thread (UCX worker progress, deadlines) and a delivery thread
// that verifies checksums and runs the callbacks; callbacks must not block for long and must not
// call back into the transport synchronously except for Abort* (which only posts a command).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/backend/kv_layout.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_write_fence.h"  // ReceiveTarget

namespace pd::kvtransfer {

using engine::KvDType;

// Shape of one transfer. The receiver fills it from its KvCacheOptions and the sequence length;
// the sender checks its own cache against it (Connect) and packs its blocks to `wire_dtype`.
struct TransferGeometry {
  int n_layer = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int n_tokens = 0;                        // positions to move (the prompt)
  KvDType receiver_dtype = KvDType::kF16;  // the receiver's KvCache dtype (import converts)
  KvDType wire_dtype = KvDType::kF16;      // what travels: kI8 compresses f16/f32 KV
  // The sequence's blocks before this one are not sent: the receiver already holds them (a
  // prompt prefix from its prefix cache, docs/cluster.md). In [0, total_blocks()).
  int first_block = 0;

  // The sequence's blocks per layer: ceil(n_tokens / block_size).
  int total_blocks() const { return block_size > 0 ? (n_tokens + block_size - 1) / block_size : 0; }
  // Blocks per layer on the wire: blocks first_block .. total_blocks() - 1.
  int n_blocks() const { return total_blocks() - first_block; }
  // Bytes of one block's K (or V) in dtype `t` (scales included for kI8).
  size_t SpanBytes(KvDType t) const;
  // Payload bytes of one layer on the wire: n_blocks * 2 * SpanBytes(wire_dtype): the K spans of
  // blocks first_block..total-1, then their V spans (kv_codec.h).
  size_t LayerBytes() const { return static_cast<size_t>(n_blocks()) * 2 * SpanBytes(wire_dtype); }
  size_t TotalBytes() const { return LayerBytes() * static_cast<size_t>(n_layer); }
  // INVALID_ARGUMENT naming the field when a count is out of range (<= 0, > 1 << 20, layers
  // > 4096, a layer payload over 4 GiB).
  absl::Status Validate() const;
  // The geometry of a cache with `options` holding `n_tokens` positions, sent as `wire`.
  static TransferGeometry ForCache(const engine::KvCacheOptions& options, int n_tokens,
                                   KvDType wire);
  // OK when `options` (a sender's or receiver's cache) has this head/block shape; otherwise
  // FAILED_PRECONDITION naming the field and both values.
  absl::Status CheckCache(const engine::KvCacheOptions& options) const;
  bool operator==(const TransferGeometry&) const = default;
};

// What the router carries from the receiver to the sender: where to send, which transfer, the
// shape and wire format, and until when. Serialize() gives a compact little-endian byte string
// (docs/kv_transfer.md: "Descriptor"); Parse() validates every field.
struct TransferDescriptor {
  std::string transport;  // "ucx" or "inproc": the sender's transport must be the same kind
  std::string address;    // the receiver's transport address (UCX: ucp worker address bytes)
  uint64_t transfer_id = 0;  // unique on the receiver (sequential: not a secret)
  // The transfer's secret: every message of the transfer carries it, and the receiver drops any
  // that does not. Only the receiver and the sender the router hands the descriptor to (over the
  // cluster's mutually authenticated gRPC) know it: a peer that merely reaches the KV port can
  // neither write into a reservation nor end it (docs/security.md, "KV transfers").
  uint64_t lease = 0;
  TransferGeometry geometry;
  absl::Time deadline = absl::InfiniteFuture();  // absolute wall-clock time, both sides enforce

  std::string Serialize() const;
  // INVALID_ARGUMENT for a truncated/foreign/invalid byte string (bad magic, version, geometry).
  static absl::StatusOr<TransferDescriptor> Parse(std::string_view bytes);
};

// A pooled, uninitialised byte buffer; move-only. Returned to its pool on destruction.
class BufferPool;
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Shrinks the visible size (capacity is kept for the pool).
  void set_size(size_t n);

 private:
  friend class BufferPool;
  uint8_t* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
  std::shared_ptr<BufferPool> pool_;  // null: plain heap buffer
};

// One verified layer of a transfer. With a ReceiveTarget it is already in the reserved blocks
// (`landed`, no storage). Otherwise it is in the wire format (TransferGeometry::LayerBytes()
// bytes): the owner imports it with ImportLayer (kv_codec.h) on its engine thread and drops it.
struct LayerPayload {
  uint64_t transfer_id = 0;
  int layer = 0;
  TransferGeometry geometry;
  bool landed = false;  // written into the ReceiveTarget's blocks by the transport
  Buffer storage;       // not landed: the received message; the payload starts at `offset`
  size_t offset = 0;
  absl::Span<const uint8_t> data() const {
    return {storage.data() + offset, storage.size() - offset};
  }
};

// Where a receiver's transport writes each verified layer itself: the reserved sequence's blocks,
// for every layer its KvCache::ExportSpans (host memory: a CPU-backend cache of the geometry's
// receiver_dtype; at least n_blocks blocks, extra ones are ignored), and the fence the owner
// closes before it frees or reuses those blocks (engine/kv/kv_write_fence.h; the scheduler's
// ImportTarget is one). Each layer is copied (or converted from the wire dtype) and hashed in one
// pass on the delivery thread, under the fence; a layer whose checksum turns out wrong has then
// written reserved blocks that the failed transfer leaves unused. A fence found closed ends the
// transfer (CANCELLED) without writing.
using ReceiveTarget = engine::KvWriteTarget;

// The receiver owner's callbacks for one transfer. Both run on the transport's delivery thread
// (never the progress thread), in order: on_layer once per layer (layers in arrival order, each
// at most once), then on_done exactly once. After a failure no on_layer follows.
struct ReceiveCallbacks {
  std::function<void(LayerPayload)> on_layer;
  // OK: every layer was delivered and the sender completed. Otherwise the reason; the owner must
  // release the reserved blocks (layers already delivered are then of no use).
  std::function<void(uint64_t transfer_id, absl::Status status)> on_done;
};

// Test-only faults applied by a sender transport to what it puts on the wire.
struct FaultOptions {
  int corrupt_layer = -1;       // flip one payload byte of this layer after its checksum is taken
                                // (sent in place, zero_copy_send: one bit of the checksum)
  int truncate_layer = -1;      // send this layer 1 block-span short
  int stall_after_layers = -1;  // >= 0: Push of later layers is accepted but never sent
  int overrun_layer = -1;       // send this layer 1 block-span long (extra bytes after it)
  bool wrong_lease = false;     // every message carries another lease than the descriptor's
};

struct TransportOptions {
  std::string kind = "ucx";  // "ucx" or "inproc"
  // inproc: the name this transport registers under (empty: a unique generated one).
  std::string inproc_name;
  // UCX: UCX_TLS for this context ("" = UCX's default, or the UCX_TLS environment variable).
  std::string ucx_tls;
  // UCX: ask for peer failure detection (UCP_ERR_HANDLING_MODE_PEER). A dead or disconnected peer
  // then ends its transfers at once (UNAVAILABLE), but UCX 1.13 only uses transports that support
  // it (TCP, InfiniBand RC/DC/UD), not shared memory. false allows shared memory (same host) and
  // CMA, the fastest path between processes on one machine; a dead sender is then noticed at the
  // transfer's deadline (DEADLINE_EXCEEDED). Both ends of a transfer should use the same setting.
  bool ucx_peer_failure = true;
  // UCX: how often UCX checks that peers are alive (UCX_KEEPALIVE_INTERVAL); sender death over
  // shared memory is noticed after about this long. "" keeps UCX's default.
  std::string ucx_keepalive_interval = "1s";
  // Send same-dtype layers in place (sender): Push hashes the layer's blocks where they lie and
  // hands them to the network without a staging copy (UCX: one zero-copy message per contiguous
  // run of blocks). The caller must then leave the pushed blocks unchanged until the stream has
  // ended (`done` fired / Wait returned); the prefill node holds the prompt's blocks until then.
  // Layers that need conversion (INT8 wire) and the test faults always take the staging copy.
  bool zero_copy_send = false;
  // Bytes of idle staging buffers each transport keeps for reuse.
  size_t pool_bytes = size_t{1} << 30;
  FaultOptions faults;  // tests only
};

// The sending half of one transfer (prefill node). Created by KvTransport::Connect; destroying an
// unfinished stream aborts it (ABORTED "sender stream destroyed"). All methods are thread-safe.
class KvSendStream {
 public:
  virtual ~KvSendStream() = default;

  // Packs layer `layer` of the sequence into wire format (copy, or INT8 compression), takes its
  // checksum, and queues it; returns without waiting for the network. `spans` are the layer's
  // KvCache::ExportSpans (host memory, i.e. the CPU backend; block 0 K, block 0 V, ...; at least
  // the descriptor's n_blocks blocks, extra ones are ignored). The span list itself may go away
  // when Push returns; the blocks it points to are read before Push returns, except with
  // TransportOptions::zero_copy_send, where a same-dtype layer is read in place by the network
  // until the stream ends (see there).
  // INVALID_ARGUMENT: layer out of range or pushed twice, spans of the wrong count/size/order.
  // If the transfer already ended: its final status (never OK).
  virtual absl::Status Push(int layer, absl::Span<const engine::KvSpan> spans) = 0;
  // Declares the transfer finished (after every layer was pushed); the receiver checks it got all
  // layers and acknowledges; `done` fires with OK after that acknowledgement. FAILED_PRECONDITION
  // if called twice; the final status if the transfer already ended.
  virtual absl::Status Complete() = 0;
  // Ends the transfer with `reason` (non-OK, sent to the receiver). No-op once it has ended.
  virtual void Abort(absl::Status reason) = 0;
  // Blocks until the transfer ended or `timeout` elapsed; returns the final status
  // (DEADLINE_EXCEEDED "still running" on timeout).
  virtual absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) = 0;
  // True once the transfer ended (Wait then returns its final status at once).
  virtual bool Ended() = 0;
  // The receiver-side transfer id.
  virtual uint64_t transfer_id() const = 0;
};

// Fires once per stream on the transport's delivery thread, with the final status.
using SendDone = std::function<void(absl::Status)>;

// One per node: a receiver (decode node), a sender (prefill node), or both. Owns its progress
// thread, delivery thread and (UCX) context/worker. Must outlive its streams. Destroying it
// aborts every open transfer (UNAVAILABLE "transport shut down"), telling the peers.
class KvTransport {
 public:
  // The factory: options.kind "ucx" (kvtransfer/ucx/) or "inproc" (kvtransfer/inproc/).
  // INVALID_ARGUMENT for an unknown kind; UNAVAILABLE when UCX cannot create a context/worker.
  static absl::StatusOr<std::unique_ptr<KvTransport>> Create(const TransportOptions& options);

  virtual ~KvTransport() = default;

  // ---- receiver ----
  // Opens a transfer of `geometry` (already reserved in the caller's KvCache) that must end by
  // `deadline`; returns the descriptor to hand to the sender. With a non-empty `target` the
  // transport lands every layer in those blocks (on_layer then sees `landed` payloads).
  // INVALID_ARGUMENT for a bad geometry, missing callbacks, or a target whose layer count, spans
  // or fence do not fit the geometry; FAILED_PRECONDITION if the transport is shutting down.
  virtual absl::StatusOr<TransferDescriptor> Reserve(const TransferGeometry& geometry,
                                                     absl::Time deadline,
                                                     ReceiveCallbacks callbacks,
                                                     ReceiveTarget target = {}) = 0;
  // Aborts receive transfer `transfer_id` with `reason` (non-OK), telling the sender; on_done
  // fires with `reason` unless the transfer already ended. No-op for unknown or ended ids.
  virtual void AbortReceive(uint64_t transfer_id, absl::Status reason) = 0;

  // ---- sender ----
  // Starts sending to the transfer `descriptor` names from a cache of dtype `source_dtype` (the
  // sender's KvCacheOptions::dtype). The caller checks its cache against the descriptor first
  // (descriptor.geometry.CheckCache(kv.options())): Push can only check span sizes. Returns at
  // once; connection errors surface through `done` and later calls. INVALID_ARGUMENT: a descriptor
  // of another transport kind or a bad geometry; DEADLINE_EXCEEDED: its deadline already passed.
  virtual absl::StatusOr<std::unique_ptr<KvSendStream>> Connect(
      const TransferDescriptor& descriptor, KvDType source_dtype, SendDone done = nullptr) = 0;

  // "ucx" or "inproc".
  virtual std::string_view kind() const = 0;
  // The address a descriptor carries (UCX worker address bytes; inproc name).
  virtual const std::string& address() const = 0;
  // Open (not yet ended) transfers, both directions.
  virtual int active_transfers() const = 0;
  // Messages dropped unread since start: they named no open transfer (or stream), or carried
  // another lease than their transfer's (forged, or replayed after the transfer ended).
  virtual int64_t refused_messages() const = 0;

  // Test hook: stops the threads and drops every connection WITHOUT telling peers, as if the
  // process had died (UCX: destroys the worker). Everything after it fails with UNAVAILABLE.
  virtual void CrashForTest() = 0;
};

}  // namespace pd::kvtransfer
