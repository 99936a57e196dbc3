// Both transports (in-process and UCX over loopback) on real KvCache blocks: byte-exact multi-layer
// transfers into other block ids, INT8 on the wire, and every failure path (checksum mismatch,
// short transfer, deadline, aborts from either side, a dying sender or receiver), each of which
// must end the transfer on both sides with a clear status and fire the callbacks exactly once.
#include "kvtransfer/kv_transport.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "common/status_matchers.h"
#include "engine/backend/kv_rotation.h"
#include "engine/quant/fp16.h"
#include "tests/kvtransfer/kv_test_util.h"

namespace pd::kvtransfer {
namespace {

using engine::KvPart;
using ::pd::testing::StatusIs;
using testing::BlockBytes;
using testing::CacheOptions;
using testing::FillRandom;
using testing::Owner;

constexpr absl::Duration kLong = absl::Seconds(20);

struct Outcome {
  absl::Status recv, send, send_done;
  int recv_done_calls = 0, send_done_calls = 0;
  std::vector<int> layers;
  int landed = 0;  // layers the transport wrote into the receive target
};

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = engine::CreateCpuBackend({1});
    // UCX (Debian's libucx) needs no special hardware: self, shared memory and TCP on loopback.
    auto probe = Make();
    PD_ASSERT_OK(probe);
    rx_ = std::move(*probe);
  }

  // "ucx_shm": UCX without peer-failure detection, so that it may use shared memory + CMA.
  // "_zc": same-dtype layers are sent in place (TransportOptions::zero_copy_send).
  TransportOptions Options() const {
    const std::string& p = GetParam();
    TransportOptions o;
    o.kind = p.starts_with("inproc") ? "inproc" : "ucx";
    o.ucx_peer_failure = !p.starts_with("ucx_shm");
    o.zero_copy_send = p.ends_with("_zc");
    return o;
  }
  absl::StatusOr<std::unique_ptr<KvTransport>> Make(FaultOptions faults = {}) {
    TransportOptions o = Options();
    o.faults = faults;
    return KvTransport::Create(o);
  }
  bool IsUcx() const { return !GetParam().starts_with("inproc"); }

  std::unique_ptr<engine::KvCache> Cache(KvDType dtype, int n_layer = 4) {
    return *engine::KvCache::Create(CacheOptions(dtype, n_layer), *backend_);
  }

  // Runs one transfer: a sender thread connects, runs `script` (default: push every layer, then
  // Complete) and waits; this thread plays the receiver's engine loop, importing into dst.
  Outcome Transfer(KvTransport& tx, engine::KvCache& src, int64_t src_seq, engine::KvCache* dst,
                   int64_t dst_seq, int n_tokens, KvDType wire, absl::Duration deadline = kLong,
                   std::function<void(KvSendStream&, const TransferDescriptor&)> script = nullptr) {
    Outcome out;
    Owner owner;
    const TransferGeometry g =
        TransferGeometry::ForCache(dst ? dst->options() : src.options(), n_tokens, wire);
    ReceiveTarget target;  // land_: the transport writes dst's blocks itself
    if (land_ && dst != nullptr) {
      for (int l = 0; l < g.n_layer; ++l) target.layers.push_back(*dst->ExportSpans(dst_seq, l));
      target.fence = fence_ = std::make_shared<engine::KvWriteFence>();
    }
    auto d = rx_->Reserve(g, absl::Now() + deadline, owner.Callbacks(), std::move(target));
    PD_CHECK_OK(d.status());
    // The descriptor travels as bytes (the router's job).
    auto parsed = TransferDescriptor::Parse(d->Serialize());
    PD_CHECK_OK(parsed.status());
    // The done callback may run on the sender's delivery thread after Wait returned: shared state.
    struct Done {
      absl::Mutex mu;
      absl::Status status;
      int calls = 0;
    };
    auto done = std::make_shared<Done>();
    std::thread sender([&] {
      auto s = tx.Connect(*parsed, src.options().dtype, [done](absl::Status st) {
        absl::MutexLock lock(&done->mu);
        done->status = st;
        ++done->calls;
      });
      if (!s.ok()) {
        out.send = s.status();
        return;
      }
      if (script) {
        script(**s, *parsed);
      } else {
        for (int l = 0; l < g.n_layer; ++l) {
          auto spans = src.ExportSpans(src_seq, l);
          PD_CHECK_OK(spans.status());
          absl::Status st = (*s)->Push(l, *spans);
          if (!st.ok()) break;
        }
        (void)(*s)->Complete();
      }
      out.send = (*s)->Wait(kLong);
    });
    out.recv = owner.Run(dst, dst_seq, kLong);
    sender.join();
    absl::SleepFor(absl::Milliseconds(50));  // a second (wrong) callback would land by now
    out.recv_done_calls = owner.done_calls();
    out.layers = owner.layers_seen();
    out.landed = owner.landed();
    absl::MutexLock lock(&done->mu);
    out.send_done = done->status;
    out.send_done_calls = done->calls;
    return out;
  }

  void ExpectBytesEqual(engine::KvCache& a, int64_t sa, engine::KvCache& b, int64_t sb,
                        int n_blocks) {
    for (int l = 0; l < a.options().n_layer; ++l) {
      for (int blk = 0; blk < n_blocks; ++blk) {
        for (auto part : {KvPart::kK, KvPart::kV}) {
          ASSERT_EQ(BlockBytes(a, sa, l, blk, part), BlockBytes(b, sb, l, blk, part))
              << "layer " << l << " block " << blk;
        }
      }
    }
  }

  std::unique_ptr<engine::Backend> backend_;
  std::unique_ptr<KvTransport> rx_;
  bool land_ = false;  // Transfer gives the receiver dst's blocks as its ReceiveTarget
  std::shared_ptr<engine::KvWriteFence> fence_;  // the last such target's fence
};

TEST_P(TransportTest, MultiLayerF16TransferIsByteExactIntoOtherBlocks) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 200, 11));  // 13 blocks, the last one partial
  PD_ASSERT_OK(dst->Reserve(77, 100));         // so that seq 2 gets other block ids
  PD_ASSERT_OK(dst->Reserve(2, 200));
  ASSERT_NE(src->BlockTable(1), dst->BlockTable(2));
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 200, KvDType::kF16);
  PD_EXPECT_OK(o.recv);
  PD_EXPECT_OK(o.send);
  PD_EXPECT_OK(o.send_done);
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
  EXPECT_EQ(o.layers.size(), 4u);
  ExpectBytesEqual(*src, 1, *dst, 2, 13);
  EXPECT_EQ(rx_->active_transfers(), 0);
  EXPECT_EQ(tx->active_transfers(), 0);
}

TEST_P(TransportTest, FragmentedSenderBlocksArriveInOrder) {
  // Sequence 1's first block is apart from the others (sequence 9 sits between them), so each of
  // its layers is four runs of memory (K: block 0, blocks 1..; V likewise) when sent in place.
  auto tx = *Make();
  auto src = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(src->Reserve(1, 16));
  PD_ASSERT_OK(src->Reserve(9, 16));
  PD_ASSERT_OK(FillRandom(*src, 1, 200, 12));
  ASSERT_NE(src->BlockTable(1)[1], src->BlockTable(1)[0] + 1);
  PD_ASSERT_OK(dst->Reserve(2, 200));
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 200, KvDType::kF16);
  PD_EXPECT_OK(o.recv);
  PD_EXPECT_OK(o.send);
  EXPECT_EQ(o.layers.size(), 4u);
  ExpectBytesEqual(*src, 1, *dst, 2, 13);
  EXPECT_EQ(rx_->active_transfers(), 0);
  EXPECT_EQ(tx->active_transfers(), 0);
}

TEST_P(TransportTest, Int8WireIntoF16ReceiverIsWithinTheQuantizationBound) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 12));
  PD_ASSERT_OK(dst->Reserve(2, 64));
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 64, KvDType::kI8);
  PD_ASSERT_OK(o.recv);
  PD_EXPECT_OK(o.send);
  const auto& opt = src->options();
  const int hd = opt.head_dim;
  double max_err_over_scale = 0;
  for (int l = 0; l < opt.n_layer; ++l) {
    for (int b = 0; b < 4; ++b) {
      for (auto part : {KvPart::kK, KvPart::kV}) {
        auto a = BlockBytes(*src, 1, l, b, part), r = BlockBytes(*dst, 2, l, b, part);
        ASSERT_NE(a, r);  // it did go through INT8
        const uint16_t* x = reinterpret_cast<const uint16_t*>(a.data());
        const uint16_t* y = reinterpret_cast<const uint16_t*>(r.data());
        // INT8 rounds the rows in the rotated basis (engine/backend/kv_rotation.h): there every
        // value is within half a step of the sent one, plus the receiver's f16 rounding (at most
        // max|v| 2^-11 per value, which H / b does not enlarge).
        std::vector<float> u(hd), v(hd);
        for (int row = 0; row < opt.block_size * opt.n_kv_heads; ++row) {
          float vmax = 0;
          for (int i = 0; i < hd; ++i) {
            u[i] = engine::F16ToF32(x[row * hd + i]);
            v[i] = engine::F16ToF32(y[row * hd + i]);
            vmax = std::max(vmax, std::fabs(v[i]));
          }
          engine::RotateKvRowIn(u.data(), hd);
          engine::RotateKvRowIn(v.data(), hd);
          float amax = 0;
          for (int i = 0; i < hd; ++i) amax = std::max(amax, std::fabs(u[i]));
          const float scale = amax / 127.f;
          for (int i = 0; i < hd; ++i) {
            ASSERT_LE(std::fabs(u[i] - v[i]), scale / 2 * 1.001f + vmax * 0x1p-11f);
            if (scale > 0) {
              max_err_over_scale =
                  std::max<double>(max_err_over_scale, std::fabs(u[i] - v[i]) / scale);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(max_err_over_scale, 0.3);  // the bound is tight, not vacuous
}

TEST_P(TransportTest, Int8WireIntoInt8ReceiverIsBitExactWithCompressingAtTheSender) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16), dst = Cache(KvDType::kI8);
  PD_ASSERT_OK(FillRandom(*src, 1, 48, 13));
  PD_ASSERT_OK(dst->Reserve(9, 16));
  PD_ASSERT_OK(dst->Reserve(2, 48));
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 48, KvDType::kI8);
  PD_ASSERT_OK(o.recv);
  const auto& opt = src->options();
  std::vector<uint8_t> expect(dst->BlockBytes().span());
  for (int l = 0; l < opt.n_layer; ++l) {
    for (int b = 0; b < 3; ++b) {
      for (auto part : {KvPart::kK, KvPart::kV}) {
        auto a = BlockBytes(*src, 1, l, b, part);
        CompressBlockF16ToI8(a.data(), expect.data(), opt.block_size, opt.n_kv_heads, opt.head_dim);
        ASSERT_EQ(BlockBytes(*dst, 2, l, b, part), expect) << "layer " << l << " block " << b;
      }
    }
  }
}

TEST_P(TransportTest, Int8CacheToInt8CacheIsACopy) {
  auto tx = *Make();
  auto src = Cache(KvDType::kI8), dst = Cache(KvDType::kI8);
  PD_ASSERT_OK(FillRandom(*src, 1, 33, 14));
  PD_ASSERT_OK(dst->Reserve(2, 33));
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 33, KvDType::kI8);
  PD_ASSERT_OK(o.recv);
  ExpectBytesEqual(*src, 1, *dst, 2, 3);
}

TEST_P(TransportTest, ChecksumMismatchAbortsBothSides) {
  FaultOptions f;
  f.corrupt_layer = 2;
  auto tx = *Make(f);
  auto src = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 15));
  PD_ASSERT_OK(dst->Reserve(2, 64));
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 64, KvDType::kF16);
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kDataLoss, "checksum mismatch in layer 2"));
  EXPECT_THAT(o.send, StatusIs(absl::StatusCode::kDataLoss, "checksum mismatch in layer 2"));
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
  for (int l : o.layers) EXPECT_NE(l, 2);  // the corrupt layer never reaches the owner
  EXPECT_EQ(rx_->active_transfers(), 0);
}

TEST_P(TransportTest, TruncatedLayerIsAShortTransfer) {
  FaultOptions f;
  f.truncate_layer = 1;
  auto tx = *Make(f);
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 16));
  Outcome o = Transfer(*tx, *src, 1, nullptr, 0, 64, KvDType::kF16);
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kDataLoss, "short transfer: layer 1"));
  EXPECT_THAT(o.send, StatusIs(absl::StatusCode::kDataLoss, "short transfer"));
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
}

TEST_P(TransportTest, CompletingWithMissingLayersIsAShortTransfer) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 17));
  Outcome o = Transfer(*tx, *src, 1, nullptr, 0, 64, KvDType::kF16, kLong,
                       [&](KvSendStream& s, const TransferDescriptor&) {
                         for (int l = 0; l < 2; ++l)
                           PD_CHECK_OK(s.Push(l, *src->ExportSpans(1, l)));
                         PD_CHECK_OK(s.Complete());
                       });
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kDataLoss, "after 2 of 4 layers"));
  EXPECT_THAT(o.send, StatusIs(absl::StatusCode::kDataLoss, "after 2 of 4 layers"));
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
}

TEST_P(TransportTest, DeadlineOverrunAbortsBothSides) {
  FaultOptions f;
  f.stall_after_layers = 2;  // layers 2 and 3 are accepted but never sent
  auto tx = *Make(f);
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 18));
  const absl::Time t0 = absl::Now();
  Outcome o = Transfer(*tx, *src, 1, nullptr, 0, 64, KvDType::kF16, absl::Milliseconds(400));
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kDeadlineExceeded, "2 of 4 layers delivered"));
  EXPECT_THAT(o.send, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
}

TEST_P(TransportTest, SenderAbortReachesTheReceiver) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 19));
  Outcome o = Transfer(*tx, *src, 1, nullptr, 0, 64, KvDType::kF16, kLong,
                       [&](KvSendStream& s, const TransferDescriptor&) {
                         PD_CHECK_OK(s.Push(0, *src->ExportSpans(1, 0)));
                         s.Abort(absl::CancelledError("prefill cancelled by the client"));
                         // Pushing after the end reports the end.
                         PD_CHECK(!s.Wait(kLong).ok());
                         PD_CHECK(!s.Push(1, *src->ExportSpans(1, 1)).ok());
                       });
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kCancelled, "prefill cancelled by the client"));
  EXPECT_THAT(o.send, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
}

TEST_P(TransportTest, ReceiverAbortReachesTheSender) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 20));
  Owner owner;
  const TransferGeometry g = TransferGeometry::ForCache(src->options(), 64, KvDType::kF16);
  auto d = *rx_->Reserve(g, absl::Now() + kLong, owner.Callbacks());
  std::atomic<int> done_calls{0};
  auto s = *tx->Connect(d, KvDType::kF16, [&](absl::Status) { ++done_calls; });
  PD_ASSERT_OK(s->Push(0, *src->ExportSpans(1, 0)));
  // The decode node gives up (say its client went away): it releases the blocks, tells the sender.
  rx_->AbortReceive(d.transfer_id, absl::AbortedError("decode node cancelled the request"));
  EXPECT_THAT(owner.Run(nullptr, 0), StatusIs(absl::StatusCode::kAborted, "decode node cancelled"));
  EXPECT_THAT(s->Wait(kLong), StatusIs(absl::StatusCode::kAborted, "decode node cancelled"));
  EXPECT_THAT(s->Push(1, *src->ExportSpans(1, 1)), StatusIs(absl::StatusCode::kAborted));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(owner.done_calls(), 1);
  EXPECT_EQ(done_calls.load(), 1);
  rx_->AbortReceive(d.transfer_id, absl::AbortedError("again"));  // no-op once ended
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(owner.done_calls(), 1);
}

TEST_P(TransportTest, SenderDeathMidTransferIsUnavailableOnTheReceiver) {
  TransportOptions o = Options();
  // Without peer-failure detection (shared memory) a dead sender is only noticed at the deadline.
  const bool detects = !GetParam().starts_with("ucx_shm");
  const bool tcp = IsUcx() && detects;
  if (tcp) o.ucx_tls = "tcp";  // a dead in-process worker is visible over TCP
  auto tx = *KvTransport::Create(o);
  if (tcp) rx_ = *KvTransport::Create(o);
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 21));
  Owner owner;
  const TransferGeometry g = TransferGeometry::ForCache(src->options(), 64, KvDType::kF16);
  auto d = *rx_->Reserve(g, absl::Now() + (detects ? absl::Seconds(10) : absl::Seconds(2)),
                         owner.Callbacks());
  std::atomic<int> done_calls{0};
  absl::Status send_final;
  auto s = *tx->Connect(d, KvDType::kF16, [&](absl::Status st) {
    send_final = st;
    ++done_calls;
  });
  PD_ASSERT_OK(s->Push(0, *src->ExportSpans(1, 0)));
  PD_ASSERT_OK(s->Push(1, *src->ExportSpans(1, 1)));
  ASSERT_TRUE(owner.WaitForLayers(2, absl::Seconds(10)));  // the first layers land
  tx->CrashForTest();                                      // the prefill node dies: no goodbye
  const absl::Time t0 = absl::Now();
  if (detects) {
    EXPECT_THAT(owner.Run(nullptr, 0), StatusIs(absl::StatusCode::kUnavailable, "sender"));
  } else {
    EXPECT_THAT(owner.Run(nullptr, 0),
                StatusIs(absl::StatusCode::kDeadlineExceeded, "2 of 4 layers delivered"));
  }
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(owner.layers_seen().size(), 2u);
  // The dead side's own stream ended too, once, and refuses more work.
  EXPECT_THAT(s->Wait(kLong), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(s->Push(2, *src->ExportSpans(1, 2)), StatusIs(absl::StatusCode::kUnavailable));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(owner.done_calls(), 1);
  EXPECT_EQ(done_calls.load(), 1);
  EXPECT_EQ(rx_->active_transfers(), 0);
}

TEST_P(TransportTest, ReceiverShutdownIsUnavailableOnTheSender) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 22));
  Owner owner;
  const TransferGeometry g = TransferGeometry::ForCache(src->options(), 64, KvDType::kF16);
  auto d = *rx_->Reserve(g, absl::Now() + kLong, owner.Callbacks());
  auto s = *tx->Connect(d, KvDType::kF16);
  PD_ASSERT_OK(s->Push(0, *src->ExportSpans(1, 0)));
  ASSERT_TRUE(owner.WaitForLayers(1, absl::Seconds(10)));  // the sender is known
  rx_.reset();  // the decode node shuts down
  EXPECT_THAT(owner.Run(nullptr, 0), StatusIs(absl::StatusCode::kUnavailable, "shut down"));
  EXPECT_THAT(s->Wait(absl::Seconds(10)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(owner.done_calls(), 1);
}

// A hello for a transfer the receiver does not have gets no answer at all (answering would mean
// connecting to an address the unknown peer chose): the sender's stream ends at its deadline.
TEST_P(TransportTest, UnknownTransferIsDroppedAndExpiredDescriptorIsRefused) {
  auto tx = *Make();
  TransferDescriptor d;
  d.transport = IsUcx() ? "ucx" : "inproc";
  d.address = rx_->address();
  d.transfer_id = 424242;
  d.lease = 77;
  d.geometry = {4, 2, 64, 16, 64, KvDType::kF16, KvDType::kF16};
  d.deadline = absl::Now() + absl::Milliseconds(500);
  const int64_t refused = rx_->refused_messages();
  auto s = *tx->Connect(d, KvDType::kF16);
  EXPECT_THAT(s->Wait(absl::Seconds(10)), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_GE(rx_->refused_messages(), refused + 1);
  d.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_THAT(tx->Connect(d, KvDType::kF16), StatusIs(absl::StatusCode::kDeadlineExceeded));
  d.transport = IsUcx() ? "inproc" : "ucx";
  d.deadline = absl::InfiniteFuture();
  EXPECT_THAT(tx->Connect(d, KvDType::kF16), StatusIs(absl::StatusCode::kInvalidArgument));
}

// A peer that reaches the KV port and knows (or guesses) a transfer id but not its lease: every
// message it sends (hello, layers, complete, abort) is dropped unread, and the real sender's
// transfer lands byte-exact as if nothing happened.
TEST_P(TransportTest, AForgedLeaseIsDroppedAndTheRealTransferCompletes) {
  FaultOptions forge;
  forge.wrong_lease = true;
  auto forger = *Make(forge);
  auto tx = *Make();
  auto src = Cache(KvDType::kF16), junk = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 31));
  PD_ASSERT_OK(FillRandom(*junk, 1, 64, 32));
  PD_ASSERT_OK(dst->Reserve(2, 64));
  const int64_t refused = rx_->refused_messages();
  Outcome o = Transfer(
      *tx, *src, 1, dst.get(), 2, 64, KvDType::kF16, kLong,
      [&](KvSendStream& real, const TransferDescriptor& d) {
        {
          auto f = *forger->Connect(d, KvDType::kF16);
          for (int l = 0; l < d.geometry.n_layer; ++l) PD_CHECK_OK(f->Push(l, *junk->ExportSpans(1, l)));
          PD_CHECK_OK(f->Complete());
          absl::SleepFor(absl::Milliseconds(200));  // let them all arrive first
        }  // destroyed unfinished: its ABORT carries the wrong lease too
        for (int l = 0; l < d.geometry.n_layer; ++l) {
          PD_CHECK_OK(real.Push(l, *src->ExportSpans(1, l)));
        }
        PD_CHECK_OK(real.Complete());
      });
  PD_EXPECT_OK(o.recv);
  PD_EXPECT_OK(o.send);
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.layers.size(), 4u);
  ExpectBytesEqual(*src, 1, *dst, 2, 4);
  // hello + 4 layers + complete + abort
  EXPECT_GE(rx_->refused_messages(), refused + 7);
}

// The descriptor replayed after its transfer ended (its lease is right): nothing is written; the
// receiver's blocks keep what the real transfer put there.
TEST_P(TransportTest, AReplayedDescriptorCannotWriteAfterItsTransferEnded) {
  auto tx = *Make();
  auto replayer = *Make();
  auto src = Cache(KvDType::kF16), other = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 41));
  PD_ASSERT_OK(FillRandom(*other, 1, 64, 42));
  PD_ASSERT_OK(dst->Reserve(2, 64));
  TransferDescriptor captured;
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 64, KvDType::kF16, kLong,
                       [&](KvSendStream& real, const TransferDescriptor& d) {
                         captured = d;
                         for (int l = 0; l < d.geometry.n_layer; ++l) {
                           PD_CHECK_OK(real.Push(l, *src->ExportSpans(1, l)));
                         }
                         PD_CHECK_OK(real.Complete());
                       });
  PD_ASSERT_OK(o.recv);
  auto again = *replayer->Connect(captured, KvDType::kF16);
  for (int l = 0; l < captured.geometry.n_layer; ++l) {
    absl::Status st = again->Push(l, *other->ExportSpans(1, l));
    if (!st.ok()) break;  // the receiver already answered: the transfer is over
  }
  (void)again->Complete();
  (void)again->Wait(absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(100));
  ExpectBytesEqual(*src, 1, *dst, 2, 4);
  EXPECT_EQ(rx_->active_transfers(), 0);
}

// The lease holder itself sending more bytes than its layer has: the transfer ends DATA_LOSS
// before the payload is used.
TEST_P(TransportTest, AnOverrunLayerEndsTheTransferBeforeItIsUsed) {
  FaultOptions f;
  f.overrun_layer = 2;
  auto tx = *Make(f);
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 16));
  Outcome o = Transfer(*tx, *src, 1, nullptr, 0, 64, KvDType::kF16);
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kDataLoss, "layer 2 carried"));
  EXPECT_THAT(o.send, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_LE(o.layers.size(), 2u);
}

TEST_P(TransportTest, ConcurrentTransfersFromManySenders) {
  constexpr int kN = 6;
  std::vector<std::unique_ptr<KvTransport>> txs;
  std::vector<std::unique_ptr<engine::KvCache>> srcs;
  auto dst = *engine::KvCache::Create(CacheOptions(KvDType::kF16, 4, 2, 64, 16, 256), *backend_);
  std::vector<Owner> owners(kN);
  std::vector<TransferDescriptor> ds;
  for (int i = 0; i < kN; ++i) {
    txs.push_back(*Make());
    srcs.push_back(Cache(KvDType::kF16));
    PD_ASSERT_OK(FillRandom(*srcs[i], 1, 100 + 10 * i, 100 + i));
    PD_ASSERT_OK(dst->Reserve(10 + i, 100 + 10 * i));
    const TransferGeometry g =
        TransferGeometry::ForCache(dst->options(), 100 + 10 * i, KvDType::kF16);
    ds.push_back(*rx_->Reserve(g, absl::Now() + kLong, owners[i].Callbacks()));
  }
  std::vector<std::thread> senders;
  std::vector<absl::Status> send_status(kN);
  for (int i = 0; i < kN; ++i) {
    senders.emplace_back([&, i] {
      auto s = *txs[i % 2 == 0 ? i : 0]->Connect(ds[i], KvDType::kF16);  // some share a sender
      for (int l = 3; l >= 0; --l) PD_CHECK_OK(s->Push(l, *srcs[i]->ExportSpans(1, l)));
      PD_CHECK_OK(s->Complete());
      send_status[i] = s->Wait(kLong);
    });
  }
  // One engine loop imports for every transfer.
  for (int i = 0; i < kN; ++i) PD_EXPECT_OK(owners[i].Run(dst.get(), 10 + i));
  for (auto& t : senders) t.join();
  for (int i = 0; i < kN; ++i) {
    PD_EXPECT_OK(send_status[i]);
    ExpectBytesEqual(*srcs[i], 1, *dst, 10 + i, (100 + 10 * i + 15) / 16);
  }
}

// ---- landing in the receiver's blocks (ReceiveTarget) ----

// Every wire and cache dtype: what the transport writes into the target is what the owner's
// ImportLayer would have written, bit for bit (and for F16 -> F16, the sender's blocks).
TEST_P(TransportTest, LandedLayersEqualImportedOnes) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 200, 31));  // 13 blocks
  for (KvDType wire : {KvDType::kF16, KvDType::kI8}) {
    for (KvDType cache : {KvDType::kF16, KvDType::kI8}) {
      SCOPED_TRACE(std::string(engine::KvDTypeName(wire)) + " wire into a " +
                   std::string(engine::KvDTypeName(cache)) + " cache");
      auto imported = Cache(cache), landed = Cache(cache);
      PD_ASSERT_OK(imported->Reserve(2, 200));
      PD_ASSERT_OK(landed->Reserve(77, 50));  // other block ids than `imported`
      PD_ASSERT_OK(landed->Reserve(2, 200));
      land_ = false;
      Outcome a = Transfer(*tx, *src, 1, imported.get(), 2, 200, wire);
      land_ = true;
      Outcome b = Transfer(*tx, *src, 1, landed.get(), 2, 200, wire);
      for (const Outcome* o : {&a, &b}) {
        PD_EXPECT_OK(o->recv);
        PD_EXPECT_OK(o->send);
        EXPECT_EQ(o->recv_done_calls, 1);
        EXPECT_EQ(o->layers.size(), 4u);
      }
      EXPECT_EQ(a.landed, 0);
      EXPECT_EQ(b.landed, 4);
      ExpectBytesEqual(*imported, 2, *landed, 2, 13);
      if (wire == KvDType::kF16 && cache == KvDType::kF16) ExpectBytesEqual(*src, 1, *landed, 2, 13);
      EXPECT_FALSE(fence_->closed());  // the transport never closes it: its owner does
    }
  }
  EXPECT_EQ(rx_->active_transfers(), 0);
}

TEST_P(TransportTest, ChecksumMismatchWhileLandingAbortsBothSides) {
  FaultOptions f;
  f.corrupt_layer = 1;
  auto tx = *Make(f);
  auto src = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 32));
  PD_ASSERT_OK(dst->Reserve(2, 64));
  land_ = true;
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 64, KvDType::kF16);
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kDataLoss, "checksum mismatch in layer 1"));
  EXPECT_THAT(o.send, StatusIs(absl::StatusCode::kDataLoss, "checksum mismatch in layer 1"));
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
  for (int l : o.layers) EXPECT_NE(l, 1);
  EXPECT_EQ(rx_->active_transfers(), 0);
}

// The owner took its blocks back (closed the fence) before the layers came: nothing is written,
// the transfer ends CANCELLED on the receiver and the sender hears of it.
TEST_P(TransportTest, AClosedFenceEndsTheTransferWithoutWriting) {
  auto tx = *Make();
  auto src = Cache(KvDType::kF16), dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(FillRandom(*src, 1, 64, 33));
  PD_ASSERT_OK(FillRandom(*dst, 2, 64, 34));
  std::vector<std::vector<uint8_t>> before;
  for (int l = 0; l < 4; ++l) {
    for (int b = 0; b < 4; ++b) before.push_back(BlockBytes(*dst, 2, l, b, KvPart::kK));
  }
  land_ = true;
  Outcome o = Transfer(*tx, *src, 1, dst.get(), 2, 64, KvDType::kF16, kLong,
                       [&](KvSendStream& s, const TransferDescriptor&) {
                         fence_->Close();  // before any layer is on its way
                         for (int l = 0; l < 4; ++l) {
                           if (!s.Push(l, *src->ExportSpans(1, l)).ok()) break;
                         }
                         (void)s.Complete();
                       });
  EXPECT_THAT(o.recv, StatusIs(absl::StatusCode::kCancelled, "took its reserved blocks back"));
  EXPECT_FALSE(o.send.ok());
  EXPECT_EQ(o.recv_done_calls, 1);
  EXPECT_EQ(o.send_done_calls, 1);
  EXPECT_TRUE(o.layers.empty());
  size_t i = 0;
  for (int l = 0; l < 4; ++l) {
    for (int b = 0; b < 4; ++b) EXPECT_EQ(BlockBytes(*dst, 2, l, b, KvPart::kK), before[i++]);
  }
  EXPECT_EQ(rx_->active_transfers(), 0);
}

TEST_P(TransportTest, AReceiveTargetThatDoesNotFitIsRefused) {
  auto dst = Cache(KvDType::kF16);
  PD_ASSERT_OK(dst->Reserve(2, 64));
  const TransferGeometry g = TransferGeometry::ForCache(dst->options(), 64, KvDType::kF16);
  auto make = [&]() {
    ReceiveTarget t;
    for (int l = 0; l < 4; ++l) t.layers.push_back(*dst->ExportSpans(2, l));
    t.fence = std::make_shared<engine::KvWriteFence>();
    return t;
  };
  Owner owner;
  auto reserve = [&](ReceiveTarget t) {
    return rx_->Reserve(g, absl::Now() + kLong, owner.Callbacks(), std::move(t)).status();
  };
  auto control = rx_->Reserve(g, absl::Now() + kLong, owner.Callbacks(), make());
  PD_ASSERT_OK(control.status());  // it fits
  ReceiveTarget t = make();
  t.fence = nullptr;
  EXPECT_THAT(reserve(std::move(t)), StatusIs(absl::StatusCode::kInvalidArgument, "KvWriteFence"));
  t = make();
  t.layers.pop_back();
  EXPECT_THAT(reserve(std::move(t)),
              StatusIs(absl::StatusCode::kInvalidArgument, "target has 3 layers"));
  t = make();
  t.layers[2].resize(7);  // 4 blocks need 8 spans
  EXPECT_THAT(reserve(std::move(t)),
              StatusIs(absl::StatusCode::kInvalidArgument, "receive target: layer 2 has 7 spans"));
  // An INT8 receiver given the F16 cache's spans: the sizes do not fit.
  TransferGeometry gi = g;
  gi.receiver_dtype = KvDType::kI8;
  EXPECT_THAT(rx_->Reserve(gi, absl::Now() + kLong, owner.Callbacks(), make()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "receive target: span 0 has"));
  rx_->AbortReceive(control->transfer_id, absl::CancelledError("test over"));
  // on_done comes on the delivery thread: wait for it before `owner` goes away.
  EXPECT_THAT(owner.Run(nullptr, 0, kLong), StatusIs(absl::StatusCode::kCancelled, "test over"));
  EXPECT_EQ(owner.done_calls(), 1);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest,
                         ::testing::Values("inproc", "ucx", "ucx_shm", "inproc_zc", "ucx_zc",
                                           "ucx_shm_zc"),
                         [](const auto& info) { return info.param; });

// UCX between two processes: a forked child is the prefill node.
class UcxProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TransportOptions o;
    o.kind = "ucx";
    auto t = KvTransport::Create(o);
    PD_ASSERT_OK(t);
  }
};

// Child: reads a descriptor from `in`, fills a cache like the parent does, pushes `n_push` layers
// (then completes if it pushed all), waits; exits 0 on OK. With `hang`, it stops after pushing
// and waits to be killed.
[[noreturn]] void ChildSender(int in, int n_push, bool hang, bool peer_failure = true,
                              bool zero_copy = false) {
  std::string bytes;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(in, buf, sizeof(buf))) > 0) bytes.append(buf, static_cast<size_t>(n));
  auto d = TransferDescriptor::Parse(bytes);
  if (!d.ok()) _exit(2);
  auto backend = engine::CreateCpuBackend({1});
  auto src = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  if (!FillRandom(*src, 1, 200, 31).ok()) _exit(3);
  TransportOptions o;
  o.kind = "ucx";
  o.ucx_peer_failure = peer_failure;
  o.zero_copy_send = zero_copy;
  auto tx = KvTransport::Create(o);
  if (!tx.ok()) _exit(4);
  auto s = (*tx)->Connect(*d, KvDType::kF16);
  if (!s.ok()) _exit(5);
  for (int l = 0; l < n_push; ++l) {
    if (!(*s)->Push(l, *src->ExportSpans(1, l)).ok()) _exit(6);
  }
  if (hang) {
    for (;;) ::pause();
  }
  if (!(*s)->Complete().ok()) _exit(7);
  _exit((*s)->Wait(absl::Seconds(20)).ok() ? 0 : 8);
}

// (peer-failure detection, zero-copy send)
class UcxProcessModeTest : public UcxProcessTest,
                           public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(UcxProcessModeTest, TransferFromAForkedChildIsByteExact) {
  const auto [peer_failure, zero_copy] = GetParam();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[1]);
    ChildSender(fds[0], 4, false, peer_failure, zero_copy);
  }
  ::close(fds[0]);
  auto backend = engine::CreateCpuBackend({1});
  auto src = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  PD_ASSERT_OK(FillRandom(*src, 1, 200, 31));  // what the child sends
  auto dst = *engine::KvCache::Create(CacheOptions(KvDType::kF16), *backend);
  PD_ASSERT_OK(dst->Reserve(3, 50));
  PD_ASSERT_OK(dst->Reserve(4, 200));
  TransportOptions o;
  o.kind = "ucx";
  o.ucx_peer_failure = peer_failure;
  auto rx = *KvTransport::Create(o);
  Owner owner;
  auto d = *rx->Reserve(TransferGeometry::ForCache(dst->options(), 200, KvDType::kF16),
                        absl::Now() + kLong, owner.Callbacks());
  const std::string bytes = d.Serialize();
  ASSERT_EQ(::write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fds[1]);
  PD_EXPECT_OK(owner.Run(dst.get(), 4));
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
  for (int l = 0; l < 4; ++l) {
    for (int b = 0; b < 13; ++b) {
      for (auto part : {KvPart::kK, KvPart::kV}) {
        ASSERT_EQ(BlockBytes(*src, 1, l, b, part), BlockBytes(*dst, 4, l, b, part));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PeerFailure, UcxProcessModeTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Detected"
                                                                      : "SharedMemory") +
                                  (std::get<1>(info.param) ? "ZeroCopy" : "Staged");
                         });

TEST_F(UcxProcessTest, KilledSenderProcessIsUnavailableOnTheReceiver) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[1]);
    ChildSender(fds[0], 2, /*hang=*/true);
  }
  ::close(fds[0]);
  TransportOptions o;
  o.kind = "ucx";
  auto rx = *KvTransport::Create(o);
  Owner owner;
  auto d = *rx->Reserve({4, 2, 64, 16, 200, KvDType::kF16, KvDType::kF16},
                        absl::Now() + absl::Seconds(30), owner.Callbacks());
  const std::string bytes = d.Serialize();
  ASSERT_EQ(::write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fds[1]);
  // The two layers land; then the prefill node dies.
  ASSERT_TRUE(owner.WaitForLayers(2, absl::Seconds(10)));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  const absl::Time t0 = absl::Now();
  absl::Status st = owner.Run(nullptr, 0, absl::Seconds(25));
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kUnavailable, "sender"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));  // keepalive (1 s), not the 30 s deadline
  EXPECT_EQ(owner.layers_seen().size(), 2u);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(owner.done_calls(), 1);
}

}  // namespace
}  // namespace pd::kvtransfer
