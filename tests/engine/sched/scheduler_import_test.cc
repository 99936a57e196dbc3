// The Scheduler's imported-KV admission (SubmitImport / PostImport / CompleteImport): the decode
// side of KV transfer. The "prefill node" here is a second KvCache filled by Model::Forward in the
// test; the import copies its blocks with KvCache::Export / Import, as a transport would.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_matchers.h"
#include "engine/sched/scheduler.h"
#include "tests/testing/tiny_engine.h"

namespace pd::engine {
namespace {

using Env = testing::TinyEngine;

std::unique_ptr<Env> MakeEnv() { return testing::MakeTinyEngine(); }

class Sink : public GenerationSink {
 public:
  void OnTokens(const std::vector<int32_t>& t) override {
    absl::MutexLock l(&mu);
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  void OnFinish(const FinishInfo& i) override {
    absl::MutexLock l(&mu);
    info = i;
  }
  absl::Mutex mu;
  std::vector<int32_t> tokens;
  std::optional<FinishInfo> info;
};

GenerationRequest Req(const std::string& id, int max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = {5, 17, 42, 3, 88, 61, 9, 70, 33, 12, 1, 54, 27, 90, 8, 66, 45, 2, 77, 31};  // 20
  r.max_tokens = max_tokens;
  r.sampling = SamplingParams::Greedy();
  return r;
}

std::unique_ptr<Scheduler> MakeScheduler(Env& env) {
  SchedulerOptions o;
  o.kv_blocks = 16;
  o.block_size = 16;
  o.max_running_seqs = 4;
  o.token_budget = 64;
  o.run_thread = false;
  auto s = Scheduler::Create(*env.model, o);
  PD_CHECK_OK(s.status());
  return std::move(*s);
}

void RunUntilDone(Scheduler& s, Sink& sink) {
  for (int i = 0; i < 200; ++i) {
    {
      absl::MutexLock l(&sink.mu);
      if (sink.info.has_value()) return;
    }
    s.Step();
  }
}

// The prompt computed elsewhere: its K/V in `src` (sequence 0) and its greedy first token.
struct Prefilled {
  std::unique_ptr<KvCache> src;
  int32_t first_token = -1;
};

Prefilled PrefillElsewhere(Env& env, const std::vector<int32_t>& prompt) {
  Prefilled p;
  auto kv = KvCache::Create(env.model->KvOptions(16, KvDType::kF16, 16), *env.backend);
  PD_CHECK_OK(kv.status());
  p.src = std::move(*kv);
  PD_CHECK_OK(p.src->Reserve(0, static_cast<int>(prompt.size())));
  Batch batch;
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.Add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
  }
  std::vector<float> logits;
  PD_CHECK_OK(env.model->Forward(batch, *p.src, &logits));
  p.first_token = ArgMax(logits);
  return p;
}

// What a transport's on_layer does, for every layer at once.
Scheduler::ImportTask CopyFrom(KvCache& src) {
  return [&src](KvCache& dst, int64_t seq) -> absl::Status {
    const size_t span = src.BlockBytes().span();
    std::vector<uint8_t> buf(span);
    const int n_blocks = static_cast<int>(src.BlockTable(0).size());
    for (int layer = 0; layer < src.options().n_layer; ++layer) {
      for (int b = 0; b < n_blocks; ++b) {
        for (KvPart part : {KvPart::kK, KvPart::kV}) {
          PD_RETURN_IF_ERROR(src.Export(0, layer, b, part, buf.data(), span));
          PD_RETURN_IF_ERROR(dst.Import(seq, layer, b, part, buf.data(), span));
        }
      }
    }
    return absl::OkStatus();
  };
}

std::vector<int32_t> LocalRun(Env& env, int max_tokens) {
  auto s = MakeScheduler(env);
  auto sink = std::make_shared<Sink>();
  PD_CHECK_OK(s->Submit(Req("local", max_tokens), sink));
  RunUntilDone(*s, *sink);
  return sink->tokens;
}

TEST(SchedulerImportTest, ImportedPromptThenDecodeEqualsALocalRun) {
  auto env = MakeEnv();
  const std::vector<int32_t> want = LocalRun(*env, 12);
  ASSERT_EQ(want.size(), 12u);
  Prefilled p = PrefillElsewhere(*env, Req("x", 1).prompt);
  EXPECT_EQ(p.first_token, want[0]);

  auto s = MakeScheduler(*env);
  auto sink = std::make_shared<Sink>();
  std::optional<absl::StatusOr<Scheduler::ImportTarget>> reserved;
  ASSERT_TRUE(s->SubmitImport(Req("imp", 12), sink, [&](absl::StatusOr<Scheduler::ImportTarget> r) {
                 reserved = std::move(r);
               }).ok());
  StepStats st = s->Step();  // intake: blocks for the 20-token prompt reserved
  ASSERT_TRUE(reserved.has_value());
  ASSERT_TRUE(reserved->ok()) << reserved->status();
  EXPECT_TRUE(st.batch.empty());  // importing: not part of any step
  EXPECT_EQ(s->Load().kv_blocks_free, 16 - 2);
  s->Step();
  EXPECT_TRUE(sink->tokens.empty());

  s->PostImport("imp", CopyFrom(*p.src));
  s->CompleteImport("imp", p.first_token);
  RunUntilDone(*s, *sink);
  ASSERT_TRUE(sink->info.has_value());
  EXPECT_EQ(sink->info->reason, FinishReason::kLength);
  EXPECT_EQ(sink->info->completion_tokens, 12);
  EXPECT_EQ(sink->tokens, want);  // decoding continued from the imported K/V
  EXPECT_EQ(s->Load().kv_blocks_free, 16);
}

// A lossless import (publish) starts after the prompt blocks the node already holds: the
// reservation names them (first_block), only the rest is written, the result is a local run's,
// the cached tokens are reported, and the imported blocks serve the next prompt.
TEST(SchedulerImportTest, ALosslessImportReusesTheCachedPrefixAndFilesTheRest) {
  auto env = MakeEnv();
  std::vector<int32_t> prompt = Req("x", 1).prompt;                 // 20 tokens
  for (int i = 0; i < 30; ++i) prompt.push_back((7 * i + 3) % 96);  // 50: 3 blocks + 2
  GenerationRequest req = Req("imp", 10);
  req.prompt = prompt;
  auto s = MakeScheduler(*env);
  // Without publish nothing is taken from the cache; with it, blocks 0-1 come from the request
  // that ran here before with the same first 36 tokens.
  GenerationRequest earlier = req;
  earlier.id = "earlier";
  earlier.prompt.resize(36);
  earlier.max_tokens = 2;
  auto first = std::make_shared<Sink>();
  ASSERT_TRUE(s->Submit(earlier, first).ok());
  RunUntilDone(*s, *first);
  GenerationRequest local_req = req;
  local_req.id = "local";
  auto local = std::make_shared<Sink>();
  {
    auto fresh = MakeScheduler(*env);
    ASSERT_TRUE(fresh->Submit(local_req, local).ok());
    RunUntilDone(*fresh, *local);
  }
  Prefilled p = PrefillElsewhere(*env, prompt);
  auto sink = std::make_shared<Sink>();
  std::optional<absl::StatusOr<Scheduler::ImportTarget>> reserved;
  ASSERT_TRUE(s->SubmitImport(
                   req, sink,
                   [&](absl::StatusOr<Scheduler::ImportTarget> r) { reserved = std::move(r); },
                   /*publish=*/true)
                  .ok());
  s->Step();
  ASSERT_TRUE(reserved.has_value() && reserved->ok());
  const int first_block = (*reserved)->first_block;
  EXPECT_EQ(first_block, 2);
  s->PostImport("imp", [&](KvCache& dst, int64_t seq) -> absl::Status {
    const size_t span = p.src->BlockBytes().span();
    std::vector<uint8_t> buf(span);
    for (int layer = 0; layer < p.src->options().n_layer; ++layer) {
      for (int b = 0; b < 4; ++b) {
        for (KvPart part : {KvPart::kK, KvPart::kV}) {
          PD_RETURN_IF_ERROR(p.src->Export(0, layer, b, part, buf.data(), span));
          const absl::Status st = dst.Import(seq, layer, b, part, buf.data(), span);
          if (b < first_block) {  // shared with the cache: must not be written
            if (st.code() != absl::StatusCode::kFailedPrecondition) {
              return absl::InternalError("a cached block was writable");
            }
          } else {
            PD_RETURN_IF_ERROR(st);
          }
        }
      }
    }
    return absl::OkStatus();
  });
  s->CompleteImport("imp", p.first_token);
  RunUntilDone(*s, *sink);
  ASSERT_TRUE(sink->info.has_value());
  EXPECT_TRUE(sink->info->status.ok()) << sink->info->status;
  EXPECT_EQ(sink->tokens, local->tokens);
  EXPECT_EQ(sink->info->cached_tokens, 32);
  EXPECT_TRUE(sink->info->timing.kv_imported);
  PD_EXPECT_OK(s->AuditKv());
  // The imported third block (tokens 32..47, within the prompt's interior 48) is filed now.
  GenerationRequest later = req;
  later.id = "later";
  later.prompt.push_back(11);
  later.prompt.push_back(12);
  later.max_tokens = 1;
  auto next = std::make_shared<Sink>();
  ASSERT_TRUE(s->Submit(later, next).ok());
  RunUntilDone(*s, *next);
  ASSERT_TRUE(next->info.has_value());
  EXPECT_EQ(next->info->cached_tokens, 48);
  EXPECT_EQ(s->Load().kv_blocks_free, 16);
}

TEST(SchedulerImportTest, AFailedImportPrefillsLocally) {
  auto env = MakeEnv();
  const std::vector<int32_t> want = LocalRun(*env, 8);
  auto s = MakeScheduler(*env);
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(s->SubmitImport(Req("imp", 8), sink, [](absl::StatusOr<Scheduler::ImportTarget>) {}).ok());
  s->Step();
  s->CompleteImport("imp", absl::UnavailableError("the prefill node died"));
  RunUntilDone(*s, *sink);
  ASSERT_TRUE(sink->info.has_value());
  EXPECT_EQ(sink->info->reason, FinishReason::kLength);
  EXPECT_EQ(sink->tokens, want);
  EXPECT_EQ(s->Load().kv_blocks_free, 16);
}

TEST(SchedulerImportTest, AFailingImportTaskPrefillsLocally) {
  auto env = MakeEnv();
  const std::vector<int32_t> want = LocalRun(*env, 8);
  auto s = MakeScheduler(*env);
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(s->SubmitImport(Req("imp", 8), sink, [](absl::StatusOr<Scheduler::ImportTarget>) {}).ok());
  s->Step();
  s->PostImport("imp", [](KvCache&, int64_t) { return absl::DataLossError("checksum"); });
  s->CompleteImport("imp", 7);  // ignored: the import was already aborted
  RunUntilDone(*s, *sink);
  EXPECT_EQ(sink->tokens, want);
  EXPECT_EQ(s->Load().kv_blocks_free, 16);
}

TEST(SchedulerImportTest, CancellingAnImportFreesItsBlocks) {
  auto env = MakeEnv();
  auto s = MakeScheduler(*env);
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE(s->SubmitImport(Req("imp", 8), sink, [](absl::StatusOr<Scheduler::ImportTarget>) {}).ok());
  s->Step();
  EXPECT_EQ(s->Load().kv_blocks_free, 14);
  s->Cancel("imp");
  s->Step();
  ASSERT_TRUE(sink->info.has_value());
  EXPECT_EQ(sink->info->reason, FinishReason::kCancelled);
  EXPECT_EQ(s->Load().kv_blocks_free, 16);
}

// A host-memory cache hands out its reserved blocks: another thread writes the prompt's K/V
// through them (what a transport's delivery thread does) and decoding continues from them. The
// fence is open until the import completes, then closed.
TEST(SchedulerImportTest, TheTargetsBlocksWrittenFromAnotherThreadDecodeLikeALocalRun) {
  auto env = MakeEnv();
  const std::vector<int32_t> want = LocalRun(*env, 10);
  Prefilled p = PrefillElsewhere(*env, Req("x", 1).prompt);

  auto s = MakeScheduler(*env);
  auto sink = std::make_shared<Sink>();
  std::optional<absl::StatusOr<Scheduler::ImportTarget>> reserved;
  ASSERT_TRUE(s->SubmitImport(Req("imp", 10), sink, [&](absl::StatusOr<Scheduler::ImportTarget> r) {
                 reserved = std::move(r);
               }).ok());
  s->Step();
  ASSERT_TRUE(reserved.has_value() && reserved->ok());
  Scheduler::ImportTarget& t = **reserved;
  const int n_layer = env->model->config().n_layer;
  ASSERT_EQ(static_cast<int>(t.layers.size()), n_layer);
  ASSERT_NE(t.fence, nullptr);
  EXPECT_FALSE(t.fence->closed());
  std::thread writer([&] {
    for (int l = 0; l < n_layer; ++l) {
      auto src = p.src->ExportSpans(0, l);
      ASSERT_TRUE(src.ok());
      ASSERT_EQ(src->size(), t.layers[l].size());  // 2 blocks, K and V
      EXPECT_TRUE(t.fence->Write([&] {
        for (size_t i = 0; i < src->size(); ++i) {
          ASSERT_EQ((*src)[i].bytes, t.layers[l][i].bytes);
          std::memcpy(t.layers[l][i].data, (*src)[i].data, (*src)[i].bytes);
        }
      }));
    }
  });
  writer.join();
  s->CompleteImport("imp", p.first_token);
  s->Step();
  EXPECT_TRUE(t.fence->closed());  // it runs now: nothing may write its blocks any more
  EXPECT_FALSE(t.fence->Write([] { ADD_FAILURE() << "wrote through a closed fence"; }));
  RunUntilDone(*s, *sink);
  ASSERT_TRUE(sink->info.has_value());
  EXPECT_EQ(sink->tokens, want);
  EXPECT_EQ(s->Load().kv_blocks_free, 16);
}

// Every way an importing sequence gives its blocks back closes the fence first.
TEST(SchedulerImportTest, TheFenceClosesBeforeTheBlocksGoBack) {
  auto env = MakeEnv();
  for (const std::string how : {"cancel", "failed import", "failed task", "shutdown"}) {
    SCOPED_TRACE(how);
    auto s = MakeScheduler(*env);
    auto sink = std::make_shared<Sink>();
    std::shared_ptr<KvWriteFence> fence;
    ASSERT_TRUE(s->SubmitImport(Req("imp", 4), sink, [&](absl::StatusOr<Scheduler::ImportTarget> r) {
                   ASSERT_TRUE(r.ok());
                   fence = r->fence;
                 }).ok());
    s->Step();
    ASSERT_NE(fence, nullptr);
    EXPECT_FALSE(fence->closed());
    if (how == "cancel") {
      s->Cancel("imp");
    } else if (how == "failed import") {
      s->CompleteImport("imp", absl::DataLossError("checksum"));
    } else if (how == "failed task") {
      s->PostImport("imp", [](KvCache&, int64_t) { return absl::DataLossError("checksum"); });
    } else {
      s->Shutdown();
    }
    if (how != "shutdown") s->Step();
    EXPECT_TRUE(fence->closed());
    if (how != "cancel" && how != "shutdown") RunUntilDone(*s, *sink);  // prefilled locally
    ASSERT_TRUE(sink->info.has_value());
    EXPECT_EQ(s->Load().kv_blocks_free, 16);
  }
}

TEST(SchedulerImportTest, NoRoomForTheImportMeansLocalPrefill) {
  auto env = MakeEnv();
  auto s = MakeScheduler(*env);
  GenerationRequest big = Req("big", 8);
  big.prompt.resize(16 * 16 + 1 - 8, 5);  // more than the whole cache can hold at once: refused
  auto sink = std::make_shared<Sink>();
  std::optional<absl::StatusOr<Scheduler::ImportTarget>> reserved;
  absl::Status submitted =
      s->SubmitImport(big, sink, [&](absl::StatusOr<Scheduler::ImportTarget> r) { reserved = r; });
  EXPECT_FALSE(submitted.ok());  // prompt + max_tokens beyond the context: INVALID_ARGUMENT

  // A running request holds 15 of the 16 blocks; the import needs 2.
  auto hog = std::make_shared<Sink>();
  GenerationRequest h = Req("hog", 2);
  h.prompt.resize(15 * 16 - 1, 5);
  ASSERT_TRUE(s->Submit(h, hog).ok());
  for (int i = 0; i < 20 && hog->tokens.empty(); ++i) s->Step();  // its prompt, in chunks
  ASSERT_EQ(hog->tokens.size(), 1u);
  ASSERT_EQ(s->Load().kv_blocks_free, 1);
  ASSERT_TRUE(
      s->SubmitImport(Req("imp", 4), sink, [&](absl::StatusOr<Scheduler::ImportTarget> r) { reserved = r; }).ok());
  s->Step();
  ASSERT_TRUE(reserved.has_value());
  EXPECT_EQ(reserved->status().code(), absl::StatusCode::kResourceExhausted);
  RunUntilDone(*s, *sink);  // it was queued for local prefill instead
  ASSERT_TRUE(sink->info.has_value());
  EXPECT_EQ(sink->info->reason, FinishReason::kLength);
}

}  // namespace
}  // namespace pd::engine

namespace pd::engine {
namespace {

// The prefill side: SubmitExport's hook sees every layer once, in order, in the step of the
// prompt's last chunk, with the whole prompt's K/V already stored; copying what it sees into a
// decode scheduler's import gives the same tokens as a local run.
TEST(SchedulerExportTest, ExportedLayersImportedElsewhereEqualALocalRun) {
  auto env = MakeEnv();
  const std::vector<int32_t> want = LocalRun(*env, 10);

  SchedulerOptions po;
  po.kv_blocks = 16;
  po.block_size = 16;
  po.max_running_seqs = 4;
  po.token_budget = 8;  // the 20-token prompt runs in chunks of 8, 8, 4
  po.prefill_chunk = 8;
  po.run_thread = false;
  auto prefill = Scheduler::Create(*env->model, po);
  ASSERT_TRUE(prefill.ok()) << prefill.status();

  // The "wire": each exported layer's spans copied out as bytes, tagged with the step.
  const int n_layer = env->model->config().n_layer;
  std::vector<int> layers_seen;
  std::vector<std::vector<std::vector<uint8_t>>> wire(n_layer);
  int64_t step = 0;
  std::vector<int64_t> layer_step;
  auto psink = std::make_shared<Sink>();
  GenerationRequest pr = Req("p", 1);
  ASSERT_TRUE((*prefill)
                  ->SubmitExport(pr, psink,
                                 [&](const KvCache& kv, int64_t seq, int layer) {
                                   layers_seen.push_back(layer);
                                   layer_step.push_back(step);
                                   auto spans = kv.ExportSpans(seq, layer);
                                   ASSERT_TRUE(spans.ok());
                                   for (const KvSpan& s : *spans) {
                                     const auto* p = static_cast<const uint8_t*>(s.data);
                                     wire[layer].emplace_back(p, p + s.bytes);
                                   }
                                 })
                  .ok());
  for (step = 0; step < 10 && !psink->info.has_value(); ++step) (*prefill)->Step();
  ASSERT_TRUE(psink->info.has_value());
  ASSERT_EQ(psink->tokens.size(), 1u);
  EXPECT_EQ(psink->tokens[0], want[0]);
  std::vector<int> all(n_layer);
  for (int l = 0; l < n_layer; ++l) all[l] = l;
  EXPECT_EQ(layers_seen, all);  // once each, in order
  for (int64_t s : layer_step) EXPECT_EQ(s, 2);  // the third step: the last chunk
  EXPECT_EQ((*prefill)->Load().kv_blocks_free, 16);  // freed after the first token

  auto decode = MakeScheduler(*env);
  auto dsink = std::make_shared<Sink>();
  ASSERT_TRUE(decode->SubmitImport(Req("d", 10), dsink, [](absl::StatusOr<Scheduler::ImportTarget>) {}).ok());
  decode->Step();
  decode->PostImport("d", [&](KvCache& kv, int64_t seq) -> absl::Status {
    for (int l = 0; l < n_layer; ++l) {
      // ExportSpans order: block 0 K, block 0 V, block 1 K, ...
      for (size_t i = 0; i < wire[l].size(); ++i) {
        const int block = static_cast<int>(i / 2);
        const KvPart part = i % 2 == 0 ? KvPart::kK : KvPart::kV;
        PD_RETURN_IF_ERROR(kv.Import(seq, l, block, part, wire[l][i].data(), wire[l][i].size()));
      }
    }
    return absl::OkStatus();
  });
  decode->CompleteImport("d", psink->tokens[0]);
  RunUntilDone(*decode, *dsink);
  EXPECT_EQ(dsink->tokens, want);
}

// hold_kv: the finished export keeps its blocks, unchanged, until ReleaseExportedKv; an unknown
// or repeated release is ignored; Shutdown frees whatever is still held.
TEST(SchedulerExportTest, HeldExportKeepsItsBlocksUntilReleased) {
  auto env = MakeEnv();
  SchedulerOptions po;
  po.kv_blocks = 16;
  po.block_size = 16;
  po.run_thread = false;
  auto prefill = Scheduler::Create(*env->model, po);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ((*prefill)
                ->SubmitExport(Req("bad", 2), std::make_shared<Sink>(),
                               [](const KvCache&, int64_t, int) {}, /*hold_kv=*/true)
                .code(),
            absl::StatusCode::kInvalidArgument);  // must end with its prompt

  const KvCache* cache = nullptr;
  int64_t kv_seq = -1;
  std::vector<std::vector<uint8_t>> seen;  // layer 0's K/V as exported
  auto sink = std::make_shared<Sink>();
  ASSERT_TRUE((*prefill)
                  ->SubmitExport(Req("p", 1), sink,
                                 [&](const KvCache& kv, int64_t seq, int layer) {
                                   cache = &kv;
                                   kv_seq = seq;
                                   if (layer != 0) return;
                                   // A named StatusOr: ranging over *ExportSpans(...) would
                                   // read a destroyed temporary.
                                   const absl::StatusOr<std::vector<KvSpan>> spans =
                                       kv.ExportSpans(seq, 0);
                                   ASSERT_TRUE(spans.ok());
                                   for (const KvSpan& sp : *spans) {
                                     const auto* p = static_cast<const uint8_t*>(sp.data);
                                     seen.emplace_back(p, p + sp.bytes);
                                   }
                                 },
                                 /*hold_kv=*/true)
                  .ok());
  for (int i = 0; i < 10 && !sink->info.has_value(); ++i) (*prefill)->Step();
  ASSERT_TRUE(sink->info.has_value());
  ASSERT_GE(kv_seq, 0);
  EXPECT_EQ((*prefill)->Load().kv_blocks_free, 16 - 2);  // 20 tokens: 2 blocks still held
  EXPECT_EQ((*prefill)->held_exports(), 1);

  // Other requests run meanwhile and never get those blocks.
  auto other = std::make_shared<Sink>();
  ASSERT_TRUE((*prefill)->Submit(Req("o", 3), other).ok());
  for (int i = 0; i < 20 && !other->info.has_value(); ++i) (*prefill)->Step();
  ASSERT_TRUE(other->info.has_value());
  auto spans = cache->ExportSpans(kv_seq, 0);
  ASSERT_TRUE(spans.ok());
  ASSERT_EQ(spans->size(), seen.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>((*spans)[i].data);
    EXPECT_EQ(std::vector<uint8_t>(p, p + (*spans)[i].bytes), seen[i]) << "span " << i;
  }

  (*prefill)->ReleaseExportedKv(kv_seq + 1000);  // holds nothing: ignored
  (*prefill)->Step();
  EXPECT_EQ((*prefill)->Load().kv_blocks_free, 16 - 2);
  (*prefill)->ReleaseExportedKv(kv_seq);
  (*prefill)->ReleaseExportedKv(kv_seq);  // twice: the second is ignored
  (*prefill)->Step();
  EXPECT_EQ((*prefill)->Load().kv_blocks_free, 16);
  EXPECT_EQ((*prefill)->held_exports(), 0);

  // Held at shutdown: freed there.
  auto again = std::make_shared<Sink>();
  ASSERT_TRUE((*prefill)
                  ->SubmitExport(Req("p2", 1), again, [](const KvCache&, int64_t, int) {},
                                 /*hold_kv=*/true)
                  .ok());
  for (int i = 0; i < 10 && !again->info.has_value(); ++i) (*prefill)->Step();
  EXPECT_EQ((*prefill)->held_exports(), 1);
  (*prefill)->Shutdown();
  EXPECT_EQ((*prefill)->Load().kv_blocks_free, 16);
}

TEST(SchedulerExportTest, EmptyHookIsRejected) {
  auto env = MakeEnv();
  auto s = MakeScheduler(*env);
  EXPECT_EQ(s->SubmitExport(Req("x", 1), std::make_shared<Sink>(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::engine
