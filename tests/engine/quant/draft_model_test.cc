// Draft models (engine/quant/quantize/draft_model.h) on tiny random models with a small synthetic
// SentencePiece vocabulary: Model's restricted head gives the full head's logits at its ids and
// -infinity elsewhere; the head's tokens are ranked as documented; `pdctl quantize --draft`'s job
// writes a file that loads, speaks the target's vocabulary and runs.
#include "engine/quant/quantize/draft_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "common/strings.h"
#include "engine/backend/top_k.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/vocab_match.h"
#include "engine/quant/quantize/quantize_model.h"
#include "engine/runtime/model.h"
#include "engine/sched/scheduler.h"
#include "engine/spec/draft_model.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine::quantize {
namespace {

using ::pd::testing::StatusIs;
namespace t = ::pd::engine::testing;

constexpr int kVocab = 320;
// Ids of the synthetic vocabulary (SyntheticSpm).
constexpr int32_t kUnk = 0, kBos = 1, kEos = 2, kUnused = 3, kEndOfTurn = 4, kFirstByte = 5;
constexpr int32_t kFirstPiece = kFirstByte + 256;

// A SentencePiece vocabulary of kVocab tokens: <unk>, <s>, </s>, an unused control token, an
// end-of-turn control token, 256 byte tokens, then "▁" and the letters and "▁x" pieces, scored
// so that lower ids are more likely.
void SyntheticSpm(t::GgufBuilder& b) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<unused0>", "<end_of_turn>"};
  std::vector<int32_t> types = {2, 3, 3, 3, 3};
  for (int i = 0; i < 256; ++i) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", i);
    tokens.push_back(hex);
    types.push_back(6);
  }
  const std::string space = "\xe2\x96\x81";
  tokens.push_back(space);
  types.push_back(1);
  for (char c = 'a'; c <= 'z'; ++c) {
    tokens.push_back(std::string(1, c));
    tokens.push_back(space + c);
    types.push_back(1);
    types.push_back(1);
  }
  for (int i = 0; static_cast<int>(tokens.size()) < kVocab; ++i) {
    tokens.push_back(pd::StrCat(space, "w", i));
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.f);
  for (size_t i = kFirstPiece; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i);
  b.Str("tokenizer.ggml.model", "llama");
  b.StrArray("tokenizer.ggml.tokens", tokens);
  b.Array("tokenizer.ggml.scores", GgufValueType::kFloat32, scores);
  b.Array("tokenizer.ggml.token_type", GgufValueType::kInt32, types);
  b.U32("tokenizer.ggml.bos_token_id", kBos);
  b.U32("tokenizer.ggml.eos_token_id", kEos);
  b.U32("tokenizer.ggml.unknown_token_id", kUnk);
}

class DraftModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/draft_model_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
           std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    progress_ = MakeQuietProgress();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A tiny model with the synthetic vocabulary, written to a file.
  std::string WriteModel(bool tied, int n_embd = 64) {
    t::TinyModelSpec s;
    s.n_vocab = kVocab;
    s.n_embd = n_embd;
    s.n_ff = 2 * n_embd;
    s.tied = tied;
    s.metadata = SyntheticSpm;
    const std::string p = pd::StrCat(dir_, "/target_", tied ? "tied" : "untied", ".gguf");
    std::ofstream(p, std::ios::binary) << t::TinyModel(s);
    return p;
  }

  std::string dir_;
  std::unique_ptr<Progress> progress_;
};

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Model> model;
};

Loaded Load(const std::string& path) {
  Loaded l;
  l.backend = CreateCpuBackend();
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  l.file = std::shared_ptr<const GgufFile>(std::move(*f));
  auto m = Model::Load(l.file, *l.backend);
  EXPECT_TRUE(m.ok()) << m.status();
  l.model = std::move(*m);
  return l;
}

// Logits of every position of `tokens` (one sequence, one batch).
std::vector<float> Logits(Model& model, const std::vector<int32_t>& tokens) {
  auto kv = KvCache::Create(model.KvOptions(16, KvDType::kF32, 4), model.backend());
  EXPECT_TRUE(kv.ok()) << kv.status();
  EXPECT_TRUE((*kv)->Reserve(0, static_cast<int>(tokens.size())).ok());
  Batch b;
  for (size_t i = 0; i < tokens.size(); ++i) b.Add(tokens[i], static_cast<int32_t>(i), 0, true);
  std::vector<float> logits;
  const absl::Status s = model.Forward(b, **kv, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

// The restricted head, written by QuantizeModel with every matrix kept in F32 (so the draft's
// layers and head rows are the target's, bit for bit): at the head's ids the logits equal the
// full head's; everywhere else they are -infinity.
TEST_F(DraftModelTest, HeadSubsetForwardEqualsFullHeadAtItsIds) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    QuantizeOptions o;
    o.input = WriteModel(tied);
    o.output = dir_ + "/draft.gguf";
    o.type = DType::kQ8_0;
    o.overrides = {".*=f32"};
    o.head_tokens = {kEos, 7, 300, 11, kFirstPiece + 1, 150};  // any order
    auto report = QuantizeModel(o, *progress_);
    PD_ASSERT_OK(report);

    Loaded target = Load(o.input), draft = Load(o.output);
    EXPECT_EQ(draft.model->config().head_tokens, o.head_tokens);
    EXPECT_FALSE(draft.model->config().tied_output);
    EXPECT_EQ(draft.model->weights().output.rows, 6);
    PD_EXPECT_OK(CheckSameVocabulary(*target.file, *draft.file));

    const std::vector<int32_t> tokens = {kBos, 300, 12, 99, 7, 250, 3};
    const std::vector<float> full = Logits(*target.model, tokens);
    const std::vector<float> sub = Logits(*draft.model, tokens);
    ASSERT_EQ(full.size(), tokens.size() * kVocab);
    ASSERT_EQ(sub.size(), full.size());
    std::vector<bool> in_head(kVocab, false);
    for (int32_t id : o.head_tokens) in_head[id] = true;
    // ForwardTop over a restricted head ranks the scattered rows: head ids, then -inf ids.
    {
      auto kv = KvCache::Create(draft.model->KvOptions(16, KvDType::kF32, 4), *draft.backend);
      PD_ASSERT_OK(kv);
      PD_ASSERT_OK((*kv)->Reserve(0, static_cast<int>(tokens.size())));
      Batch b;
      for (size_t i = 0; i < tokens.size(); ++i) b.Add(tokens[i], static_cast<int32_t>(i), 0, true);
      TopLogits top;
      constexpr int kTop = 8;  // past the head's 6 ids
      PD_ASSERT_OK(draft.model->ForwardTop(b, **kv, kTop, &top));
      for (size_t r = 0; r < tokens.size(); ++r) {
        std::vector<int32_t> ids(kTop);
        std::vector<float> values(kTop);
        RowTopK(sub.data() + r * kVocab, kVocab, kTop, ids.data(), values.data());
        EXPECT_EQ(std::vector<int32_t>(top.Ids(r).begin(), top.Ids(r).end()), ids);
        EXPECT_EQ(std::vector<float>(top.Values(r).begin(), top.Values(r).end()), values);
        EXPECT_TRUE(in_head[top.Ids(r)[0]]);
      }
    }
    for (size_t r = 0; r < tokens.size(); ++r) {
      for (int v = 0; v < kVocab; ++v) {
        const float d = sub[r * kVocab + v];
        if (in_head[v]) {
          EXPECT_EQ(d, full[r * kVocab + v]) << "row " << r << " token " << v;
        } else {
          EXPECT_TRUE(std::isinf(d) && d < 0) << "row " << r << " token " << v << ": " << d;
        }
      }
    }
  }
}

TEST_F(DraftModelTest, QuantizeRefusesBadHeadsAndDraftInputs) {
  QuantizeOptions o;
  o.input = WriteModel(/*tied=*/true);
  o.output = dir_ + "/draft.gguf";
  o.type = DType::kQ8_0;
  o.head_tokens = {1, kVocab};
  EXPECT_THAT(QuantizeModel(o, *progress_), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     "head token 320 is outside the 320 rows"));
  EXPECT_FALSE(std::filesystem::exists(o.output));
  o.head_tokens = {1, 2, 3};
  PD_ASSERT_OK(QuantizeModel(o, *progress_));
  QuantizeOptions again = o;
  again.input = o.output;
  again.output = dir_ + "/draft2.gguf";
  EXPECT_THAT(QuantizeModel(again, *progress_),
              StatusIs(absl::StatusCode::kInvalidArgument, "already a draft model"));
  // Quantized again without --draft, a draft stays a consistent draft.
  again.head_tokens.clear();
  PD_ASSERT_OK(QuantizeModel(again, *progress_));
  Loaded d = Load(again.output);
  EXPECT_EQ(d.model->config().head_tokens, std::vector<int32_t>({1, 2, 3}));
}

// Special tokens first (not the unused one), then the text's tokens by count, then the
// tokenizer's prior (SPM: score), ascending in the result.
TEST_F(DraftModelTest, HeadTokensAreSpecialThenFrequentThenPrior) {
  auto file = GgufFile::Open(WriteModel(false));
  PD_ASSERT_OK(file);
  auto tok = Tokenizer::FromGguf(**file);
  PD_ASSERT_OK(tok);
  const std::vector<int32_t> text = {300, 300, 300, 310, 310, 299, kFirstByte + 65};
  HeadSelection s = SelectHeadTokens(**tok, text, 8);
  EXPECT_EQ(s.special, 4);  // <unk>, <s>, </s>, <end_of_turn>
  EXPECT_EQ(s.from_text, 4);
  EXPECT_EQ(s.from_prior, 0);
  EXPECT_EQ(s.ids,
            std::vector<int32_t>({kUnk, kBos, kEos, kEndOfTurn, kFirstByte + 65, 299, 300, 310}));
  // Fewer rows than the text's tokens: the most frequent win (ties: lower id).
  s = SelectHeadTokens(**tok, text, 6);
  EXPECT_EQ(s.ids, std::vector<int32_t>({kUnk, kBos, kEos, kEndOfTurn, 300, 310}));
  // More rows: the highest-scored pieces fill up (kFirstPiece, kFirstPiece + 1, ...).
  s = SelectHeadTokens(**tok, text, 10);
  EXPECT_EQ(s.from_prior, 2);
  EXPECT_TRUE(std::binary_search(s.ids.begin(), s.ids.end(), kFirstPiece));
  EXPECT_TRUE(std::binary_search(s.ids.begin(), s.ids.end(), kFirstPiece + 1));
  // Never the unused token, even when every row is asked for; special tokens even when too few.
  s = SelectHeadTokens(**tok, text, kVocab);
  EXPECT_EQ(s.ids.size(), static_cast<size_t>(kVocab - 1));
  EXPECT_FALSE(std::binary_search(s.ids.begin(), s.ids.end(), kUnused));
  s = SelectHeadTokens(**tok, text, 1);
  EXPECT_EQ(s.ids, std::vector<int32_t>({kUnk, kBos, kEos, kEndOfTurn}));
}

// `pdctl quantize --draft`'s job end to end: low-bit layers (k-quant rows of 256), a head of the
// asked size with the special tokens, the file loads and runs, and the report measures it.
TEST_F(DraftModelTest, QuantizeDraftWritesLoadsAndRuns) {
  const std::string calib = dir_ + "/calib.txt";
  {
    std::ofstream out(calib);
    for (int i = 0; i < 60; ++i) {
      out << "the quick brown fox jumps over the lazy dog number " << i % 7 << "\n\n"
          << "a cat sat on a mat and looked at the " << (i % 2 ? "moon" : "sun") << "\n\n";
    }
  }
  DraftOptions d;
  d.quant.input = WriteModel(/*tied=*/true, /*n_embd=*/256);
  d.quant.output = dir_ + "/draft.gguf";
  d.quant.type = DType::kQ3_K;
  d.quant.method = Method::kImportance;
  d.quant.policy = "S";
  d.quant.calib_file = calib;
  d.quant.calib_tokens = 1024;
  d.quant.chunk_tokens = 64;
  d.head_rows = 40;
  d.eval_tokens = 128;
  d.decode_steps = 4;
  auto r = QuantizeDraft(d, *progress_);
  PD_ASSERT_OK(r);
  EXPECT_EQ(r->head.ids.size(), 40u);
  EXPECT_EQ(r->head.special, 4);
  EXPECT_GT(r->head.from_text, 0);
  EXPECT_EQ(r->n_vocab, kVocab);
  EXPECT_GT(r->eval_positions, 0);
  EXPECT_LE(r->eval_positions, 128);
  EXPECT_GE(r->agreement, 0.0);
  EXPECT_LE(r->agreement, r->head_coverage);
  EXPECT_GT(r->target_ms_per_token, 0.0);
  EXPECT_LT(r->draft_bytes, r->target_bytes);
  const std::string text = FormatDraftReport(*r);
  EXPECT_NE(text.find("top-1 agreement with the target"), std::string::npos) << text;

  Loaded target = Load(d.quant.input), draft = Load(d.quant.output);
  PD_EXPECT_OK(CheckSameVocabulary(*target.file, *draft.file));
  const ModelConfig& c = draft.model->config();
  EXPECT_EQ(c.head_tokens, r->head.ids);
  EXPECT_EQ(draft.file->FindTensor("blk.0.ffn_gate.weight")->type, DType::kQ3_K);
  // The input table keeps every row; float tables become q8_0.
  EXPECT_EQ(draft.file->FindTensor("token_embd.weight")->shape,
            target.file->FindTensor("token_embd.weight")->shape);
  EXPECT_EQ(draft.file->FindTensor("token_embd.weight")->type, DType::kQ8_0);
  EXPECT_LT(r->draft_step_bytes, r->target_step_bytes);
  for (int32_t id : {kUnk, kBos, kEos, kEndOfTurn}) {
    EXPECT_TRUE(std::binary_search(c.head_tokens.begin(), c.head_tokens.end(), id)) << id;
  }
  const std::vector<float> logits = Logits(*draft.model, {kBos, 300, 301});
  ASSERT_EQ(logits.size(), 3u * kVocab);
  int finite = 0;
  for (float v : logits) finite += std::isfinite(v);
  EXPECT_EQ(finite, 3 * 40);
}


// The self-draft in use: speculative decoding with a restricted-head draft (its probability is 0
// outside the head's 40 tokens) gives the target's greedy tokens, with f16 and INT8 KV.
TEST_F(DraftModelTest, SelfDraftSpeculatesLosslessly) {
  const std::string calib = dir_ + "/calib.txt";
  {
    std::ofstream out(calib);
    for (int i = 0; i < 60; ++i) out << "the quick brown fox jumps over the lazy dog " << i % 5 << "\n";
  }
  DraftOptions d;
  d.quant.input = WriteModel(/*tied=*/true, /*n_embd=*/256);
  d.quant.output = dir_ + "/draft.gguf";
  d.quant.type = DType::kQ8_0;  // close to the target: most proposals accepted
  d.quant.method = Method::kRtn;
  d.quant.calib_file = calib;
  d.quant.calib_tokens = 512;
  d.quant.chunk_tokens = 64;
  d.head_rows = 60;
  d.eval_tokens = 0;
  d.decode_steps = 0;
  PD_ASSERT_OK(QuantizeDraft(d, *progress_));
  Loaded target = Load(d.quant.input);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 40; ++i) {
    GenerationRequest r;
    r.id = pd::StrCat("r", i);
    r.prompt = {kBos};
    for (int k = 0; k < 6 + i % 5; ++k) r.prompt.push_back(kFirstPiece + (i * 7 + k * 3) % 50);
    r.max_tokens = 16;
    r.sampling = SamplingParams::Greedy();
    reqs.push_back(std::move(r));
  }
  for (KvDType kv : {KvDType::kF16, KvDType::kI8}) {
    auto run = [&](bool speculate, int64_t* accepted) {
      SchedulerOptions o;
      o.kv_blocks = 128;
      o.max_running_seqs = 8;
      o.token_budget = 128;
      o.kv_dtype = kv;
      o.run_thread = false;
      if (speculate) {
        auto file = GgufFile::Open(d.quant.output);
        EXPECT_TRUE(file.ok()) << file.status();
        auto m = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *target.backend);
        EXPECT_TRUE(m.ok()) << m.status();
        auto drafter = spec::DraftModelDrafter::Create(
            std::move(*m), kVocab,
            {.kv_bytes = int64_t{4} << 20,
             .cost = spec::SpecCost::FromPoints({1, 16}, {1e-4, 1.1e-4})});
        EXPECT_TRUE(drafter.ok()) << drafter.status();
        o.speculative.drafter = std::move(*drafter);
        o.speculative.cost = spec::SpecCost::FromPoints({1, 64}, {1e-3, 1.1e-3});
      }
      auto s = Scheduler::Create(*target.model, o);
      EXPECT_TRUE(s.ok()) << s.status();
      struct Sink : GenerationSink {
        std::vector<int32_t> tokens;
        void OnTokens(const std::vector<int32_t>& t) override {
          tokens.insert(tokens.end(), t.begin(), t.end());
        }
        void OnFinish(const FinishInfo&) override {}
      };
      std::vector<std::shared_ptr<Sink>> sinks;
      for (const auto& r : reqs) {
        sinks.push_back(std::make_shared<Sink>());
        PD_EXPECT_OK((*s)->Submit(r, sinks.back()));
      }
      *accepted = 0;
      for (int i = 0; i < 1000 && ((*s)->Load().running + (*s)->Load().waiting) > 0; ++i) {
        *accepted += (*s)->Step().accepted_tokens;
        PD_EXPECT_OK((*s)->AuditKv());
      }
      std::vector<std::vector<int32_t>> out;
      for (const auto& k : sinks) out.push_back(k->tokens);
      return out;
    };
    int64_t none = 0, accepted = 0;
    const auto want = run(false, &none);
    const auto got = run(true, &accepted);
    EXPECT_EQ(got, want);
    EXPECT_GT(accepted, 0);
  }
}

}  // namespace
}  // namespace pd::engine::quantize
