// KvReceiver (a node's reservations) and RunAndPush (the sending side, kv_push.h) over a real
// in-process KvTransport: a prefill Scheduler pushes each layer as SubmitExport computes it, the
// decode Scheduler imports it, and the decode continues with the same tokens as a local run; and
// the prefix pull, where a decode node's cached prefix goes the other way. Also the failure
// paths: attach without a first token, drop, expiry, unknown reservations.
#include "node/kv_receiver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/sched/scheduler.h"
#include "kvtransfer/kv_transport.h"
#include "node/kv_push.h"
#include "tests/testing/counting_backend.h"
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
    absl::StatusOr<std::unique_ptr<kvtransfer::KvSendStream>> stream = tx_->Connect(*d, src);
    if (!stream.ok()) return stream.status();
    absl::StatusOr<PushedPrompt> pushed =
        RunAndPush(*prefill, Req("p", 1), *std::move(stream), d->deadline, nullptr);
    if (!pushed.ok()) return pushed.status();
    return pushed->first_token;
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

// A prefill node whose KV cache is in device memory (a GPU layer, docs/offload.md): the
// transport must not read the device pointers; RunAndPush copies each layer's blocks to host
// memory through the backend first. The device here is a CPU backend that says its memory is
// not the host's and counts the copies.
TEST_F(KvReceiverTest, AKvCacheInDeviceMemoryIsStagedOnTheHostBeforeThePush) {
  engine::testing::CountingBackend device("cpu:device", /*host_memory=*/false);
  auto file = engine::GgufFile::Parse(
      MappedFile::Borrow(env_->bytes.data(), env_->bytes.size()));
  ASSERT_TRUE(file.ok()) << file.status();
  auto model = engine::Model::Load(std::shared_ptr<const engine::GgufFile>(std::move(*file)),
                                   device);
  ASSERT_TRUE(model.ok()) << model.status();
  engine::SchedulerOptions o;
  o.kv_blocks = 16;
  o.block_size = 16;
  o.max_running_seqs = 4;
  o.token_budget = 8;
  o.prefill_chunk = 8;
  auto prefill = engine::Scheduler::Create(**model, o);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  for (engine::KvDType wire : {engine::KvDType::kF16, engine::KvDType::kI8}) {
    SCOPED_TRACE(engine::KvDTypeName(wire));
    auto sink = std::make_shared<Sink>();
    auto r = receiver_->Reserve(Req("d", 10), sink, wire, absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(r.ok()) << r.status();
    auto d = kvtransfer::TransferDescriptor::Parse(r->descriptor);
    ASSERT_TRUE(d.ok()) << d.status();
    auto stream = tx_->Connect(*d, engine::KvDType::kF16);
    ASSERT_TRUE(stream.ok()) << stream.status();
    const int before = device.downloads;
    absl::StatusOr<PushedPrompt> pushed =
        RunAndPush(**prefill, Req("p", 1), *std::move(stream), d->deadline, nullptr);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_EQ(pushed->first_token, want_[0]);
    // Every block of every layer, K and V, went through Download: the 22-token prompt fills two
    // blocks of 16.
    EXPECT_GE(device.downloads - before, 2 * 2 * env_->model->config().n_layer);
    ASSERT_TRUE(receiver_->Attach(r->reservation, pushed->first_token).ok());
    ASSERT_TRUE(sink->WaitFinish());
    receiver_->Release(r->reservation);
    absl::MutexLock l(&sink->mu);
    EXPECT_TRUE(sink->info->timing.kv_imported);
    if (wire == engine::KvDType::kF16) {
      EXPECT_EQ(sink->tokens, want_);
    }
  }
  ExpectAllFree(**prefill);
  ExpectAllFree(*decode_);
  (*prefill)->Shutdown();
}

TEST_F(KvReceiverTest, AttachWithoutAFirstTokenPrefillsLocally) {
  auto sink = std::make_shared<Sink>();
  auto r =
      receiver_->Reserve(Req("d", 10), sink, engine::KvDType::kF16, absl::Now() + absl::Seconds(5));
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
  auto r =
      receiver_->Reserve(Req("d", 4), sink, engine::KvDType::kF16, absl::Now() + absl::Seconds(5));
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
  auto r2 =
      receiver_->Reserve(Req("e", 4), sink2, engine::KvDType::kF16, absl::Now() + absl::Seconds(5));
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

// A caller that goes away while RunAndPush waits for the receiver's acknowledgement (the last
// layer is held back by the sender: stall_after_layers) ends the wait at once: CANCELLED within
// a few 20 ms polls, not at the transfer's 30 s deadline, with the prefill node's held blocks
// freed.
TEST_F(KvReceiverTest, ACallerThatGoesAwayEndsTheWaitForTheAcknowledgement) {
  kvtransfer::TransportOptions o;
  o.kind = "inproc";
  o.faults.stall_after_layers = 1;
  auto stalled = kvtransfer::KvTransport::Create(o);
  ASSERT_TRUE(stalled.ok());
  auto sink = std::make_shared<Sink>();
  auto r = receiver_->Reserve(Req("d", 10), sink, engine::KvDType::kF16,
                              absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  auto d = kvtransfer::TransferDescriptor::Parse(r->descriptor);
  ASSERT_TRUE(d.ok());
  auto prefill = MakeScheduler(*env_);
  auto stream = (*stalled)->Connect(*d, engine::KvDType::kF16);
  ASSERT_TRUE(stream.ok());
  std::atomic<int64_t> gone_ns{0};  // when the caller went away (0: not yet)
  std::thread caller([&] {
    // The prompt is computed long before this: the wait for the acknowledgement is what runs.
    absl::SleepFor(absl::Milliseconds(300));
    gone_ns = absl::ToUnixNanos(absl::Now());
  });
  absl::StatusOr<PushedPrompt> pushed = RunAndPush(
      *prefill, Req("p", 1), *std::move(stream), d->deadline, [&] { return gone_ns.load() != 0; });
  const absl::Duration after = absl::Now() - absl::FromUnixNanos(gone_ns.load());
  caller.join();
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kCancelled) << pushed.status();
  EXPECT_LT(after, absl::Seconds(2));  // 20 ms polls; generous for a starved machine
  ExpectAllFree(*prefill);
  receiver_->Drop(r->reservation);
  ExpectAllFree(*decode_);
}

// Decode.Release by request id (a router that gave up on Decode.Reserve before it answered):
// the request's reservation is dropped with its blocks, and a Reserve of that id arriving later
// is refused, so no reservation outlives a caller that is gone.
TEST_F(KvReceiverTest, DropRequestEndsTheRequestsReservationsNowAndLater) {
  auto sink = std::make_shared<Sink>();
  auto r = receiver_->Reserve(Req("gone", 10), sink, engine::KvDType::kF16,
                              absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(receiver_->live(), 1);
  receiver_->DropRequest("other");  // another request's id: nothing happens
  EXPECT_EQ(receiver_->live(), 1);
  receiver_->DropRequest("gone");
  EXPECT_EQ(receiver_->live(), 0);
  ASSERT_TRUE(sink->WaitFinish());
  {
    absl::MutexLock l(&sink->mu);
    EXPECT_EQ(sink->info->reason, FinishReason::kCancelled);
  }
  ExpectAllFree(*decode_);
  // The Reserve that raced the release (it reached the node after it): refused, nothing kept.
  auto late = receiver_->Reserve(Req("gone", 10), std::make_shared<Sink>(), engine::KvDType::kF16,
                                 absl::Now() + absl::Seconds(30));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kCancelled) << late.status();
  EXPECT_EQ(receiver_->live(), 0);
  ExpectAllFree(*decode_);
}

TEST_F(KvReceiverTest, AcceptanceErrorsComeBackAndLeaveNothing) {
  engine::GenerationRequest bad = Req("d", 4);
  bad.prompt = {};
  EXPECT_EQ(receiver_
                ->Reserve(bad, std::make_shared<Sink>(), engine::KvDType::kF16,
                          absl::Now() + absl::Seconds(5))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->live(), 0);
}

// The prefix pull (docs/cluster.md): a decode reservation took a prompt's first blocks from the
// decode node's prefix cache (KvReceiver::Prefix says how many); a prefill node that lacks them
// reserves that prefix with its own KvReceiver, the decode node pushes it (RunAndPush of the prefix
// plus one token, the cached rows reused), and the prefill node's next run of the whole prompt
// starts after it, with a local run's tokens.
TEST_F(KvReceiverTest, APrefixCachedOnTheDecodeNodeIsPulledAndReusedByThePrefillNode) {
  engine::GenerationRequest full = Req("full", 10);
  for (int i = 0; i < 20; ++i) full.prompt.push_back(3 + (i * 7) % 90);  // 42 tokens, 2 blocks
  const int n_cached = 32;
  std::vector<int32_t> want;
  {
    auto local = MakeScheduler(*env_);
    auto sink = std::make_shared<Sink>();
    ASSERT_TRUE(local->Submit(full, sink).ok());
    ASSERT_TRUE(sink->WaitFinish());
    absl::MutexLock l(&sink->mu);
    want = sink->tokens;
  }
  // The decode node ran the prompt once: its first two blocks are in its cache.
  {
    auto sink = std::make_shared<Sink>();
    engine::GenerationRequest warm = full;
    warm.id = "warm";
    warm.max_tokens = 1;
    ASSERT_TRUE(decode_->Submit(warm, sink).ok());
    ASSERT_TRUE(sink->WaitFinish());
  }
  auto dsink = std::make_shared<Sink>();
  auto d = receiver_->Reserve(full, dsink, engine::KvDType::kF16, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<KvReceiver::Held> held = receiver_->Prefix(d->reservation);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->cached_tokens, n_cached);
  EXPECT_EQ(held->prompt, full.prompt);
  EXPECT_EQ(receiver_->Prefix(777).status().code(), absl::StatusCode::kNotFound);

  // The prefill node reserves the prefix; the decode node pushes it from its cache.
  auto prefill = MakeScheduler(*env_);
  KvReceiver pull(*prefill, *tx_, nullptr);
  engine::GenerationRequest prefix = full;
  prefix.id = "full/pull-prefix";
  prefix.prompt.resize(n_cached);
  prefix.max_tokens = 1;
  auto psink = std::make_shared<Sink>();
  auto p = pull.Reserve(prefix, psink, engine::KvDType::kF16, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<kvtransfer::TransferDescriptor> pd =
      kvtransfer::TransferDescriptor::Parse(p->descriptor);
  ASSERT_TRUE(pd.ok()) << pd.status();
  EXPECT_EQ(pd->geometry.first_block, 0);  // the prefill node holds nothing yet
  auto stream = rx_->Connect(*pd, engine::KvDType::kF16);
  ASSERT_TRUE(stream.ok()) << stream.status();
  engine::GenerationRequest send = full;
  send.id = "full/send-prefix";
  send.prompt.resize(n_cached + 1);
  send.max_tokens = 1;
  absl::StatusOr<PushedPrompt> sent =
      RunAndPush(*decode_, send, *std::move(stream), pd->deadline, nullptr);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->finish.cached_tokens, n_cached);  // the decode node computed one row
  ASSERT_TRUE(pull.Attach(p->reservation, full.prompt[n_cached]).ok());
  ASSERT_TRUE(psink->WaitFinish());
  pull.Release(p->reservation);
  {
    absl::MutexLock l(&psink->mu);
    EXPECT_TRUE(psink->info->timing.kv_imported);
  }
  // The whole prompt on the prefill node starts after the pulled prefix, with the same tokens.
  auto fsink = std::make_shared<Sink>();
  ASSERT_TRUE(prefill->Submit(full, fsink).ok());
  ASSERT_TRUE(fsink->WaitFinish());
  {
    absl::MutexLock l(&fsink->mu);
    EXPECT_EQ(fsink->info->cached_tokens, n_cached);
    EXPECT_EQ(fsink->tokens, want);
  }
  receiver_->Drop(d->reservation);
  ASSERT_TRUE(dsink->WaitFinish());
  pull.Shutdown();
  ExpectAllFree(*prefill);
  ExpectAllFree(*decode_);
}

}  // namespace
}  // namespace pd::node
