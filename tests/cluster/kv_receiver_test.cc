// KvReceiver (pd-decode's reservations) and the prefill side's export hook over a real
// in-process KvTransport: a prefill Scheduler pushes each layer as SubmitExport computes it, the
// decode Scheduler imports it, and the decode continues with the same tokens as a local run.
// Also the failure paths: attach without a first token, drop, expiry, unknown reservations.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "decode_node/kv_receiver.h"
#include "engine/sched/scheduler.h"
#include "kvtransfer/kv_transport.h"
#include "tests/testing/tiny_engine.h"

namespace pd::node {
namespace {

using engine::FinishReason;

using Env = engine::testing::TinyEngine;

std::unique_ptr<Env> MakeEnv() {
  engine::testing::TinyModelSpec spec;
  spec.n_layer = 3;
  return engine::testing::MakeTinyEngine(spec);
}

class Sink : public engine::GenerationSink {
 public:
  void OnTokens(const std::vector<int32_t>& t) override {
    absl::MutexLock l(&mu);
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  void OnFinish(const engine::FinishInfo& i) override {
    absl::MutexLock l(&mu);
    info = i;
  }
  // Waits (up to 10 s) for the finish.
  bool WaitFinish() {
    absl::MutexLock l(&mu);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return info.has_value(); };
    return mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
  }
  absl::Mutex mu;
  std::vector<int32_t> tokens ABSL_GUARDED_BY(mu);
  std::optional<engine::FinishInfo> info ABSL_GUARDED_BY(mu);
};

engine::GenerationRequest Req(const std::string& id, int max_tokens) {
  engine::GenerationRequest r;
  r.id = id;
  r.prompt = {5, 17, 42, 3, 88, 61, 9, 70, 33, 12, 1, 54, 27, 90, 8, 66, 45, 2, 77, 31, 4, 6};
  r.max_tokens = max_tokens;
  r.sampling = engine::SamplingParams::Greedy();
  return r;
}

std::unique_ptr<engine::Scheduler> MakeScheduler(Env& env) {
  engine::SchedulerOptions o;
  o.kv_blocks = 16;
  o.block_size = 16;
  o.max_running_seqs = 4;
  o.token_budget = 8;  // the prompt runs in chunks: the export hook fires in the last one
  o.prefill_chunk = 8;
  auto s = engine::Scheduler::Create(*env.model, o);
  PD_CHECK_OK(s.status());
  return std::move(*s);
}

std::unique_ptr<kvtransfer::KvTransport> Inproc() {
  kvtransfer::TransportOptions o;
  o.kind = "inproc";
  auto t = kvtransfer::KvTransport::Create(o);
  PD_CHECK_OK(t.status());
  return std::move(*t);
}

std::vector<int32_t> LocalRun(Env& env, int max_tokens) {
  auto s = MakeScheduler(env);
  auto sink = std::make_shared<Sink>();
  PD_CHECK_OK(s->Submit(Req("local", max_tokens), sink));
  EXPECT_TRUE(sink->WaitFinish());
  absl::MutexLock l(&sink->mu);
  return sink->tokens;
}

void ExpectAllFree(engine::Scheduler& s) {
  for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
    if (s.Load().kv_blocks_free == s.kv_blocks_total()) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(s.Load().kv_blocks_free, s.kv_blocks_total());
}

class KvReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = MakeEnv();
    want_ = LocalRun(*env_, 10);
    decode_ = MakeScheduler(*env_);
    rx_ = Inproc();
    tx_ = Inproc();
    receiver_ = std::make_unique<KvReceiver>(*decode_, *rx_, &metrics_, absl::Milliseconds(100));
  }
  // pdserve_kv_transfer_layers_total{path=...} as the node's /metrics renders it (0 if absent).
  double Layers(const std::string& path) {
    const std::string text = metrics_.Render();
    const std::string key = "pdserve_kv_transfer_layers_total{path=\"" + path + "\"} ";
    const size_t at = text.find(key);
    return at == std::string::npos ? 0 : std::stod(text.substr(at + key.size()));
  }
  void TearDown() override {
    receiver_->Shutdown();
    tx_.reset();
    rx_.reset();
    receiver_.reset();
  }

  // Runs the prompt on a prefill scheduler, pushing its KV to `descriptor`; returns the first
  // token once the transfer is acknowledged (or the transfer's error).
  absl::StatusOr<int32_t> PrefillAndPush(const std::string& descriptor, engine::KvDType src) {
    auto d = kvtransfer::TransferDescriptor::Parse(descriptor);
    if (!d.ok()) return d.status();
    auto prefill = MakeScheduler(*env_);
    std::shared_ptr<kvtransfer::KvSendStream> stream;
    {
      auto s = tx_->Connect(*d, src);
      if (!s.ok()) return s.status();
      stream = std::move(*s);
    }
    auto sink = std::make_shared<Sink>();
    PD_RETURN_IF_ERROR(prefill->SubmitExport(
        Req("p", 1), sink, [stream](const engine::KvCache& kv, int64_t seq, int layer) {
          auto spans = kv.ExportSpans(seq, layer);
          PD_CHECK_OK(spans.status());
          (void)stream->Push(layer, *spans);  // a failed push ends the stream: see Wait
        }));
    EXPECT_TRUE(sink->WaitFinish());
    PD_RETURN_IF_ERROR(stream->Complete());
    PD_RETURN_IF_ERROR(stream->Wait(absl::Seconds(5)));
    absl::MutexLock l(&sink->mu);
    return sink->tokens.at(0);
  }

  std::unique_ptr<Env> env_;
  std::vector<int32_t> want_;
  std::unique_ptr<engine::Scheduler> decode_;
  std::unique_ptr<kvtransfer::KvTransport> rx_, tx_;
  MetricsRegistry metrics_;
  std::unique_ptr<KvReceiver> receiver_;
};

TEST_F(KvReceiverTest, PushedKvThenAttachWithTheFirstTokenEqualsALocalRun) {
  for (engine::KvDType wire : {engine::KvDType::kF16, engine::KvDType::kI8}) {
    SCOPED_TRACE(engine::KvDTypeName(wire));
    auto sink = std::make_shared<Sink>();
    auto r = receiver_->Reserve(Req("d", 10), sink, wire, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->descriptor.empty());
    EXPECT_EQ(receiver_->live(), 1);
    absl::StatusOr<int32_t> first = PrefillAndPush(r->descriptor, engine::KvDType::kF16);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(*first, want_[0]);
    auto a = receiver_->Attach(r->reservation, *first);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->request_id, "d");
    ASSERT_TRUE(sink->WaitFinish());
    receiver_->Release(r->reservation);
    absl::MutexLock l(&sink->mu);
    EXPECT_TRUE(sink->info->timing.kv_imported);
    if (wire == engine::KvDType::kF16) {
      EXPECT_EQ(sink->tokens, want_);  // bit-identical KV: the same greedy tokens
    } else {
      EXPECT_EQ(sink->tokens.size(), want_.size());
      EXPECT_EQ(sink->tokens[0], want_[0]);
    }
  }
  EXPECT_EQ(receiver_->live(), 0);
  ExpectAllFree(*decode_);
  // A CPU cache: every layer of both transfers was landed in place by the transport.
  EXPECT_EQ(Layers("landed"), 2 * env_->model->config().n_layer);
  EXPECT_EQ(Layers("engine"), 0);
}

TEST_F(KvReceiverTest, AttachWithoutAFirstTokenPrefillsLocally) {
  auto sink = std::make_shared<Sink>();
  auto r = receiver_->Reserve(Req("d", 10), sink, engine::KvDType::kF16,
                              absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  auto a = receiver_->Attach(r->reservation, std::nullopt);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(sink->WaitFinish());
  receiver_->Release(r->reservation);
  {
    absl::MutexLock l(&sink->mu);
    EXPECT_EQ(sink->tokens, want_);
    EXPECT_FALSE(sink->info->timing.kv_imported);
  }
  // The prefill node's late push finds the transfer aborted.
  EXPECT_FALSE(PrefillAndPush(r->descriptor, engine::KvDType::kF16).ok());
  ExpectAllFree(*decode_);
}

TEST_F(KvReceiverTest, UnknownDoubleAndDroppedReservations) {
  EXPECT_EQ(receiver_->Attach(12345, 1).status().code(), absl::StatusCode::kNotFound);
  auto sink = std::make_shared<Sink>();
  auto r = receiver_->Reserve(Req("d", 4), sink, engine::KvDType::kF16,
                              absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(r.ok());
  receiver_->Drop(r->reservation);
  ASSERT_TRUE(sink->WaitFinish());
  {
    absl::MutexLock l(&sink->mu);
    EXPECT_EQ(sink->info->reason, FinishReason::kCancelled);
  }
  EXPECT_EQ(receiver_->Attach(r->reservation, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(receiver_->live(), 0);
  ExpectAllFree(*decode_);

  auto sink2 = std::make_shared<Sink>();
  auto r2 = receiver_->Reserve(Req("e", 4), sink2, engine::KvDType::kF16,
                               absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(receiver_->Attach(r2->reservation, std::nullopt).ok());
  EXPECT_EQ(receiver_->Attach(r2->reservation, std::nullopt).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(sink2->WaitFinish());
  receiver_->Release(r2->reservation);
}

// The KV landed but the router never attaches (it died): the reservation is cancelled at its
// deadline + the attach grace, and its blocks are freed.
TEST_F(KvReceiverTest, AReservationNobodyAttachesToExpiresAndFreesItsBlocks) {
  auto sink = std::make_shared<Sink>();
  auto r = receiver_->Reserve(Req("d", 4), sink, engine::KvDType::kF16,
                              absl::Now() + absl::Milliseconds(300));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(PrefillAndPush(r->descriptor, engine::KvDType::kF16).ok());
  ASSERT_TRUE(sink->WaitFinish());  // deadline 300 ms + grace 100 ms
  {
    absl::MutexLock l(&sink->mu);
    EXPECT_EQ(sink->info->reason, FinishReason::kCancelled);
    EXPECT_TRUE(sink->tokens.empty());
  }
  EXPECT_EQ(receiver_->live(), 0);
  ExpectAllFree(*decode_);
}

// A transfer that never comes ends at its deadline: the node prefills at once (the router may
// still attach and stream it); unattached, the reservation is forgotten after the grace. The
// grace here is 2 s, not the fixture's 100 ms: the local prefill and its 10 tokens must finish
// before the reaper cancels the unattached request, which a starved CI machine may not do in
// 100 ms.
TEST_F(KvReceiverTest, ATransferThatNeverComesEndsAtItsDeadlineWithALocalPrefill) {
  receiver_->Shutdown();
  receiver_ = std::make_unique<KvReceiver>(*decode_, *rx_, nullptr, absl::Seconds(2));
  auto sink = std::make_shared<Sink>();
  auto r = receiver_->Reserve(Req("d", 10), sink, engine::KvDType::kF16,
                              absl::Now() + absl::Milliseconds(200));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(sink->WaitFinish());
  {
    absl::MutexLock l(&sink->mu);
    EXPECT_EQ(sink->tokens, want_);
  }
  for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
    if (receiver_->live() == 0) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(receiver_->live(), 0);
  ExpectAllFree(*decode_);
}

TEST_F(KvReceiverTest, AcceptanceErrorsComeBackAndLeaveNothing) {
  engine::GenerationRequest bad = Req("d", 4);
  bad.prompt = {};
  EXPECT_EQ(receiver_->Reserve(bad, std::make_shared<Sink>(), engine::KvDType::kF16,
                               absl::Now() + absl::Seconds(5))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->live(), 0);
}

}  // namespace
}  // namespace pd::node
