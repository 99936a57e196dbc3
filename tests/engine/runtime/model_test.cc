// Forward-pass invariants on tiny random models: incremental decoding equals a full prefill,
// chunked prefill equals one-shot, batching several sequences equals running them alone, and
// bad batches are refused. (Agreement with llama.cpp is checked in tests/python.)
#include "engine/runtime/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status_matchers.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/top_k.h"
#include "engine/sched/generate.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine {
namespace {

using ::pd::testing::StatusIs;
using ::pd::engine::testing::TinyModelSpec;

struct Fixture {
  std::string bytes;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> kv;
};

std::unique_ptr<Fixture> Make(const TinyModelSpec& spec, KvDType kv_type = KvDType::kF32,
                              int blocks = 64) {
  auto f = std::make_unique<Fixture>();
  f->bytes = testing::TinyModel(spec);
  f->backend = CreateCpuBackend();
  auto file = GgufFile::Parse(MappedFile::Borrow(f->bytes.data(), f->bytes.size()));
  EXPECT_TRUE(file.ok()) << file.status();
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *f->backend);
  EXPECT_TRUE(model.ok()) << model.status();
  f->model = std::move(*model);
  auto kv = KvCache::Create(f->model->KvOptions(blocks, kv_type, 4), *f->backend);
  EXPECT_TRUE(kv.ok()) << kv.status();
  f->kv = std::move(*kv);
  return f;
}

double RelL2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Logits of every position of `prompt`, computed in one batch.
std::vector<float> AllLogits(Fixture& f, const std::vector<int32_t>& prompt, int64_t seq) {
  EXPECT_TRUE(f.kv->Reserve(seq, int(prompt.size())).ok());
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.Add(prompt[i], int32_t(i), seq, true);
  std::vector<float> logits;
  EXPECT_TRUE(f.model->Forward(b, *f.kv, &logits).ok());
  return logits;
}

class ModelTest : public ::testing::TestWithParam<TinyModelSpec> {};

TEST_P(ModelTest, IncrementalDecodeMatchesPrefill) {
  auto f = Make(GetParam());
  const int V = f->model->config().n_vocab;
  const std::vector<int32_t> prompt = {1, 5, 9, 33, 2, 70, 11, 4, 8, 90, 3};
  std::vector<float> full = AllLogits(*f, prompt, 0);
  f->kv->Free(0);
  for (size_t i = 0; i < prompt.size(); ++i) {
    PD_ASSERT_OK(f->kv->Reserve(1, int(i + 1)));
    Batch b;
    b.Add(prompt[i], int32_t(i), 1, true);
    std::vector<float> one;
    PD_ASSERT_OK(f->model->Forward(b, *f->kv, &one));
    EXPECT_LT(RelL2(one.data(), full.data() + i * V, V), 1e-5) << "position " << i;
  }
}

TEST_P(ModelTest, BatchedSequencesMatchSeparateRuns) {
  auto f = Make(GetParam());
  const int V = f->model->config().n_vocab;
  const std::vector<int32_t> a = {3, 14, 15, 92, 65, 35};
  const std::vector<int32_t> c = {27, 18, 28};
  std::vector<float> la = AllLogits(*f, a, 10);
  std::vector<float> lc = AllLogits(*f, c, 11);
  f->kv->Free(10);
  f->kv->Free(11);
  // Interleave both prompts in one batch; ask logits of each last token.
  PD_ASSERT_OK(f->kv->Reserve(20, int(a.size())));
  PD_ASSERT_OK(f->kv->Reserve(21, int(c.size())));
  Batch b;
  for (size_t i = 0; i < a.size(); ++i) {
    b.Add(a[i], int32_t(i), 20, i + 1 == a.size());
    if (i < c.size()) b.Add(c[i], int32_t(i), 21, i + 1 == c.size());
  }
  std::vector<float> mixed;
  PD_ASSERT_OK(f->model->Forward(b, *f->kv, &mixed));
  ASSERT_EQ(mixed.size(), size_t(2) * V);
  // logits_rows order: c's last token comes first in the batch (index 5), a's last later.
  EXPECT_LT(RelL2(mixed.data(), lc.data() + 2 * V, V), 1e-5);
  EXPECT_LT(RelL2(mixed.data() + V, la.data() + 5 * V, V), 1e-5);
}

// On the CPU the head writes Forward's logits straight into the caller's vector: a vector reused
// across steps of different row counts (shrinking, growing, as a decode loop and a verify step
// alternate) holds exactly what a fresh vector gets, bit for bit, and an error leaves it empty
// rather than holding the rows of an earlier step.
TEST_P(ModelTest, ReusedLogitsVectorHoldsEachStepsRowsAndEmptiesOnError) {
  auto f = Make(GetParam());
  const int V = f->model->config().n_vocab;
  const std::vector<int32_t> prompt = {7, 3, 19, 44, 2, 61};
  PD_ASSERT_OK(f->kv->Reserve(0, int(prompt.size())));
  PD_ASSERT_OK(f->kv->Reserve(1, int(prompt.size())));
  std::vector<float> reused(7 * size_t(V), 123.f);  // larger than any step below
  // Steps of 3, 1 and 2 logits rows over the prompt, on sequence 0 into `reused` and on sequence
  // 1 into fresh vectors.
  const std::vector<std::pair<int, int>> steps = {{0, 3}, {3, 4}, {4, 6}};
  for (auto [begin, end] : steps) {
    Batch b0, b1;
    for (int i = begin; i < end; ++i) {
      b0.Add(prompt[i], i, 0, true);
      b1.Add(prompt[i], i, 1, true);
    }
    std::vector<float> fresh;
    PD_ASSERT_OK(f->model->Forward(b0, *f->kv, &reused));
    PD_ASSERT_OK(f->model->Forward(b1, *f->kv, &fresh));
    ASSERT_EQ(reused.size(), size_t(end - begin) * V);
    ASSERT_EQ(fresh.size(), reused.size());
    EXPECT_EQ(std::memcmp(reused.data(), fresh.data(), fresh.size() * sizeof(float)), 0)
        << "rows " << begin << ".." << end;
  }
  Batch bad;
  bad.Add(V + 5, 0, 0, true);
  EXPECT_THAT(f->model->Forward(bad, *f->kv, &reused),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the vocabulary"));
  EXPECT_TRUE(reused.empty());
}

// ForwardTop copies back each logits row's best k entries, which must be exactly those of
// Forward's rows (ids and value bits), for every k up to the vocabulary; k past it is refused.
TEST_P(ModelTest, ForwardTopIsTheBestOfForwardsRows) {
  auto f = Make(GetParam());
  const int V = f->model->config().n_vocab;
  const std::vector<int32_t> a = {3, 14, 15, 92, 65, 35}, c = {27, 18, 28};
  const auto batch = [&](int64_t sa, int64_t sc) {
    Batch b;
    for (size_t i = 0; i < a.size(); ++i) {
      b.Add(a[i], int32_t(i), sa, i + 2 >= a.size());  // two rows of a, one of c
      if (i < c.size()) b.Add(c[i], int32_t(i), sc, i + 1 == c.size());
    }
    return b;
  };
  PD_ASSERT_OK(f->kv->Reserve(0, int(a.size())));
  PD_ASSERT_OK(f->kv->Reserve(1, int(c.size())));
  std::vector<float> logits;
  PD_ASSERT_OK(f->model->Forward(batch(0, 1), *f->kv, &logits));
  const size_t rows = logits.size() / V;
  ASSERT_EQ(rows, 3u);
  for (const int k : {1, 2, 7, V}) {
    f->kv->Free(0);
    f->kv->Free(1);
    PD_ASSERT_OK(f->kv->Reserve(0, int(a.size())));
    PD_ASSERT_OK(f->kv->Reserve(1, int(c.size())));
    TopLogits top;
    PD_ASSERT_OK(f->model->ForwardTop(batch(0, 1), *f->kv, k, &top));
    ASSERT_EQ(top.k, k);
    ASSERT_EQ(top.ids.size(), rows * k);
    for (size_t r = 0; r < rows; ++r) {
      std::vector<int32_t> ids(k);
      std::vector<float> values(k);
      RowTopK(logits.data() + r * V, V, k, ids.data(), values.data());
      EXPECT_EQ(std::vector<int32_t>(top.Ids(r).begin(), top.Ids(r).end()), ids) << "k " << k;
      EXPECT_EQ(std::vector<float>(top.Values(r).begin(), top.Values(r).end()), values);
    }
  }
  TopLogits top;
  EXPECT_THAT(f->model->ForwardTop(batch(0, 1), *f->kv, 0, &top),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f->model->ForwardTop(batch(0, 1), *f->kv, V + 1, &top),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(ModelTest, GreedyGenerationIsDeterministicAndFreesKv) {
  auto f = Make(GetParam());
  GenerateOptions o;
  o.max_tokens = 12;
  o.sampling = SamplingParams::Greedy();
  o.prefill_chunk = 3;  // chunked prefill
  auto r1 = Generate(*f->model, *f->kv, 0, {1, 2, 3, 4, 5, 6, 7}, o, nullptr);
  PD_ASSERT_OK(r1);
  EXPECT_EQ(f->kv->free_blocks(), f->kv->total_blocks());
  o.prefill_chunk = 512;
  auto r2 = Generate(*f->model, *f->kv, 0, {1, 2, 3, 4, 5, 6, 7}, o, nullptr);
  PD_ASSERT_OK(r2);
  EXPECT_EQ(r1->tokens, r2->tokens);
  EXPECT_EQ(r1->tokens.size(), 12u);
  EXPECT_EQ(r1->finish_reason, "length");
}

TEST_P(ModelTest, ObserverSeesEveryMatMulInputWithoutChangingResults) {
  auto f = Make(GetParam());
  const ModelConfig& c = f->model->config();
  struct Recorder : MatMulObserver {
    std::vector<std::string> names;
    std::vector<std::pair<int64_t, int64_t>> shapes;
    double sum = 0;
    void Observe(std::string_view w, const float* x, int64_t rows, int64_t cols) override {
      names.emplace_back(w);
      shapes.emplace_back(rows, cols);
      for (int64_t i = 0; i < rows * cols; ++i) sum += std::fabs(x[i]);
    }
  } rec;
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23};
  std::vector<float> plain = AllLogits(*f, prompt, 0);
  f->kv->Free(0);
  f->model->set_observer(&rec);
  std::vector<float> observed = AllLogits(*f, prompt, 0);
  f->model->set_observer(nullptr);
  EXPECT_EQ(plain, observed);
  if (c.n_expert > 0) {
    // Per layer: q, k, v, o, the router, and each expert that tokens went to (gate and up of the
    // rows routed to it, then down): every token's k rows once each.
    std::map<std::string, int64_t> rows;
    for (size_t i = 0; i < rec.names.size(); ++i) {
      rows[rec.names[i]] += rec.shapes[i].first;
      if (rec.names[i] == "blk.0.ffn_down_exps.weight") {
        EXPECT_EQ(rec.shapes[i].second, c.n_ff_exp);
      }
      if (rec.names[i] == "blk.0.ffn_gate_inp.weight") {
        EXPECT_EQ(rec.shapes[i].second, c.n_embd);
      }
    }
    const int64_t n = static_cast<int64_t>(prompt.size());
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      EXPECT_EQ(rows[p + "ffn_gate_inp.weight"], n) << l;
      EXPECT_EQ(rows[p + "ffn_gate_exps.weight"], n * c.n_expert_used) << l;
      EXPECT_EQ(rows[p + "ffn_up_exps.weight"], n * c.n_expert_used) << l;
      EXPECT_EQ(rows[p + "ffn_down_exps.weight"], n * c.n_expert_used) << l;
    }
    EXPECT_EQ(rec.names.back(), c.tied_output ? "token_embd.weight" : "output.weight");
    return;
  }
  ASSERT_EQ(rec.names.size(), size_t(7 * c.n_layer + 1));
  // Views of a fused matrix report under its name.
  const bool fused = f->model->weights().layers[0].fused_qkv;
  EXPECT_EQ(rec.names[0], fused ? "blk.0.attn_qkv.weight" : "blk.0.attn_q.weight");
  EXPECT_EQ(rec.names[2], fused ? "blk.0.attn_qkv.weight" : "blk.0.attn_v.weight");
  EXPECT_EQ(rec.names[4], f->model->weights().layers[0].fused_gate_up ? "blk.0.ffn_up.weight"
                                                                      : "blk.0.ffn_gate.weight");
  EXPECT_EQ(rec.names[3], "blk.0.attn_output.weight");
  EXPECT_EQ(rec.shapes[3], std::make_pair(int64_t{5}, int64_t{c.n_head} * c.head_dim));
  EXPECT_EQ(rec.names[6], "blk.0.ffn_down.weight");
  EXPECT_EQ(rec.shapes[6], std::make_pair(int64_t{5}, int64_t{c.n_ff}));
  EXPECT_EQ(rec.names.back(), c.tied_output ? "token_embd.weight" : "output.weight");
  EXPECT_GT(rec.sum, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModelTest,
    ::testing::Values(
        TinyModelSpec{},
        TinyModelSpec{.arch = "qwen2", .n_head_kv = 4, .tied = true, .qkv_bias = true},
        TinyModelSpec{.n_head_kv = 1, .type = DType::kQ8_0}, TinyModelSpec{.type = DType::kF16},
        TinyModelSpec{.type = DType::kBF16},
        // Qwen3: per-head QK norm, head_dim 32 != n_embd / n_head = 16.
        TinyModelSpec{.arch = "qwen3", .tied = true, .head_dim = 32, .qk_norm = true},
        // Phi-3: fused QKV and gate/up, a window of 4 positions on every layer (the prompts are
        // longer), in F32 and Q8_0 (row views of a quantized matrix).
        TinyModelSpec{.arch = "phi3", .n_head_kv = 4, .fused = true, .sliding_window = 4},
        TinyModelSpec{.arch = "phi3", .fused = true, .sliding_window = 0, .type = DType::kQ8_0},
        // Experts: Qwen3-MoE (8 experts of 32 rows, 2 used) in F32 and Q8_0, and Mixtral's
        // layout (llama, 4 experts of n_ff rows, 2 used).
        TinyModelSpec{.arch = "qwen3moe", .tied = true, .head_dim = 32, .qk_norm = true,
                      .n_expert = 8, .n_expert_used = 2, .expert_ff = 32},
        TinyModelSpec{.arch = "qwen3moe", .head_dim = 32, .qk_norm = true, .n_expert = 8,
                      .n_expert_used = 3, .expert_ff = 32, .type = DType::kQ8_0},
        TinyModelSpec{.n_expert = 4, .n_expert_used = 2},
        // Mistral: llama with a window of 3 on every layer (prefill chunks of 3 cross it).
        TinyModelSpec{.n_head_kv = 1, .sliding_window = 3}),
    [](const auto& info) {
      return info.param.arch + "_" + std::string(Traits(info.param.type).name) + "_kv" +
             std::to_string(info.param.n_head_kv) +
             (info.param.n_expert > 0 ? "_moe" + std::to_string(info.param.n_expert) : "");
    });

// A token's experts run over the rows routed to them, gathered from the whole batch, each row in
// the single-row summation order: its logits are bit-identical whatever else shares the batch
// (and so its experts).
TEST(ModelExpertsTest, ExpertsAreBatchInvariantBitForBit) {
  for (DType type : {DType::kF32, DType::kQ8_0}) {
    SCOPED_TRACE(Traits(type).name);
    auto f = Make(TinyModelSpec{.arch = "qwen3moe",
                                .head_dim = 32,
                                .qk_norm = true,
                                .n_expert = 4,
                                .n_expert_used = 2,
                                .expert_ff = 32,
                                .type = type});
    const std::vector<int32_t> a = {3, 14, 15, 92, 65, 35, 89, 79};
    const std::vector<int32_t> c = {27, 18, 28, 18, 28, 45, 90, 45, 23};
    const std::vector<float> la = AllLogits(*f, a, 10);
    f->kv->Free(10);
    PD_ASSERT_OK(f->kv->Reserve(20, int(a.size())));
    PD_ASSERT_OK(f->kv->Reserve(21, int(c.size())));
    Batch b;
    for (size_t i = 0; i < c.size(); ++i) {
      if (i < a.size()) b.Add(a[i], int32_t(i), 20, true);
      b.Add(c[i], int32_t(i), 21, false);
    }
    std::vector<float> mixed;
    PD_ASSERT_OK(f->model->Forward(b, *f->kv, &mixed));
    ASSERT_EQ(mixed.size(), la.size());
    EXPECT_EQ(mixed, la);
  }
}

// Phi-3's window and Mistral's (attention.sliding_window of phi3 and llama) hold on every layer:
// a position sees the last `window` positions only. Logits before the window fills equal those of
// the same model without one; later ones differ.
TEST(ModelWindowTest, WindowLimitsEveryLayer) {
  for (const TinyModelSpec& windowed :
       {TinyModelSpec{.arch = "phi3", .fused = true, .sliding_window = 3},
        TinyModelSpec{.arch = "llama", .sliding_window = 3}}) {
    SCOPED_TRACE(windowed.arch);
    TinyModelSpec full = windowed;
    full.sliding_window = 0;
    auto a = Make(windowed);
    auto b = Make(full);
    ASSERT_EQ(a->model->config().sliding_window, 3);
    ASSERT_EQ(b->model->config().sliding_window, 0);
    const int V = a->model->config().n_vocab;
    const std::vector<int32_t> prompt = {1, 5, 9, 33, 2, 70, 11};
    const std::vector<float> la = AllLogits(*a, prompt, 0);
    const std::vector<float> lb = AllLogits(*b, prompt, 0);
    for (size_t i = 0; i < prompt.size(); ++i) {
      const double d = RelL2(la.data() + i * V, lb.data() + i * V, V);
      if (i < 3) {
        EXPECT_EQ(d, 0) << "position " << i;
      } else {
        EXPECT_GT(d, 1e-3) << "position " << i;
      }
    }
  }
}

// The target as its own draft: a view with the head cut to some tokens scores them with the
// target's bits, gives -infinity elsewhere, and shares the layers (the same K/V written), for a
// tied and an untied head, F32 and Q8_0 weights, one row and several.
TEST(ModelWithHeadTest, ScoresItsTokensWithTheTargetsBits) {
  for (const bool tied : {false, true}) {
    for (const DType type : {DType::kF32, DType::kQ8_0}) {
      for (const KvDType kv_type : {KvDType::kF32, KvDType::kF16}) {  // F16: the head's own order
        SCOPED_TRACE(std::string(tied ? "tied " : "untied ") + std::string(Traits(type).name) +
                     (kv_type == KvDType::kF16 ? " f16 cache" : " f32 cache"));
        TinyModelSpec spec;
        spec.tied = tied;
        spec.type = type;
        spec.n_embd = 64;
        auto f = Make(spec);
        f->model->set_head_order_own(kv_type == KvDType::kF16);  // the view must copy it
        const int V = f->model->config().n_vocab;
        std::vector<int32_t> ids;
        for (int t = 0; t < V; t += 3) ids.push_back(t);
        ids.push_back(V - 1);
        auto view = Model::WithHead(*f->model, ids);
        ASSERT_TRUE(view.ok()) << view.status();
        EXPECT_EQ((*view)->config().head_tokens, ids);
        // Each model over its own cache: a 4-row prefill, then one row per forward.
        const std::vector<int32_t> prompt = {1, 5, 9, 33, 2, 70, 11};
        auto run = [&](Model& m, std::vector<float>* out) {
          auto kv = KvCache::Create(m.KvOptions(64, kv_type, 4), *f->backend);
          ASSERT_TRUE(kv.ok());
          PD_ASSERT_OK((*kv)->Reserve(0, static_cast<int>(prompt.size())));
          Batch b;
          for (int i = 0; i < 4; ++i) b.Add(prompt[i], i, 0, true);
          PD_ASSERT_OK(m.Forward(b, **kv, out));
          for (size_t i = 4; i < prompt.size(); ++i) {
            Batch one;
            one.Add(prompt[i], static_cast<int32_t>(i), 0, true);
            std::vector<float> row;
            PD_ASSERT_OK(m.Forward(one, **kv, &row));
            out->insert(out->end(), row.begin(), row.end());
          }
        };
        std::vector<float> want, got;
        run(*f->model, &want);
        run(**view, &got);
        ASSERT_EQ(got.size(), want.size());
        for (size_t r = 0; r < prompt.size(); ++r) {
          size_t k = 0;
          for (int t = 0; t < V; ++t) {
            const float g = got[r * V + t];
            if (k < ids.size() && ids[k] == t) {
              ++k;
              EXPECT_EQ(g, want[r * V + t]) << "row " << r << " token " << t;
            } else {
              EXPECT_TRUE(std::isinf(g) && g < 0) << "row " << r << " token " << t << ": " << g;
            }
          }
        }
      }
    }
  }
}

// The head's order follows the cache and the model's setting (docs/numerics.md): llama.cpp's
// (the one-row order of a generated token) over an F32 cache and by default, the backend's own
// (kRowOrderOwn, for Q8_0 the integer-first chain) over an F16 or INT8 one when the model is set
// to it (the default), for the same hidden rows. Where the CPU runs the own order (AVX512-VNNI or
// AVX2) the two differ for Q8_0 weights, so a head that ignored the cache or the setting fails;
// without them the flag changes nothing and every case gives the plain order.
TEST(ModelHeadOrderTest, FollowsTheCachesTypeAndTheSetting) {
  const bool runs_own = cpu::Q8_0OwnOrderVnni() != nullptr || cpu::Q8_0OwnOrderAvx2() != nullptr;
  for (const bool set_own : {false, true}) {
    for (const KvDType kv_type : {KvDType::kF32, KvDType::kF16, KvDType::kI8}) {
      SCOPED_TRACE(::testing::Message()
                   << "kv " << static_cast<int>(kv_type) << " own " << set_own);
      TinyModelSpec spec;
      spec.tied = true;
      spec.type = DType::kQ8_0;
      spec.n_embd = 64;
      auto f = Make(spec, kv_type);
      EXPECT_TRUE(f->model->head_order_own());  // the default (PDSERVE_HEAD_ORDER unset)
      f->model->set_head_order_own(set_own);
      const int V = f->model->config().n_vocab;
      PD_ASSERT_OK(f->kv->Reserve(0, 3));
      std::vector<float> logits, hidden;
      for (int32_t pos = 0; pos < 3; ++pos) {
        Batch b;
        b.Add(7 + 5 * pos, pos, 0, true);
        PD_ASSERT_OK(f->model->ForwardHidden(b, *f->kv, &logits, &hidden));
      }
      Backend& be = *f->backend;
      const Weights& w = f->model->weights();
      const int64_t d = f->model->config().n_embd;
      std::vector<float> normed(d), own(V), plain(V);
      Tensor h{DType::kF32, d, 1, hidden.data()}, hn{DType::kF32, d, 1, normed.data()};
      PD_ASSERT_OK(be.RmsNorm(h, w.output_norm, f->model->config().rms_eps, hn));
      Tensor y_own{DType::kF32, V, 1, own.data()}, y_plain{DType::kF32, V, 1, plain.data()};
      PD_ASSERT_OK(be.MatMulRowOrder(w.output, hn, y_own, {kRowOrderGemv | kRowOrderOwn}));
      PD_ASSERT_OK(be.MatMulRowOrder(w.output, hn, y_plain, {kRowOrderGemv}));
      if (runs_own) {
        ASSERT_NE(std::memcmp(own.data(), plain.data(), V * sizeof(float)), 0)
            << "the orders agree on this model: the test shows nothing";
      }
      const std::vector<float>& want = set_own && kv_type != KvDType::kF32 ? own : plain;
      ASSERT_EQ(logits.size(), want.size());
      EXPECT_EQ(std::memcmp(logits.data(), want.data(), V * sizeof(float)), 0);
    }
  }
}

// A model parsed from `bytes` (testing::TinyModel's) and loaded on `be`.
absl::StatusOr<std::unique_ptr<Model>> LoadTiny(const std::string& bytes, Backend& be,
                                                bool no_f32_cache) {
  PD_ASSIGN_OR_RETURN(auto file, GgufFile::Parse(MappedFile::Borrow(bytes.data(), bytes.size())));
  return Model::Load(std::shared_ptr<const GgufFile>(std::move(file)), be,
                     {.no_f32_cache = no_f32_cache});
}

// A forward over an F32 cache is refused (a model laid out for F16 and INT8 caches).
void ExpectRefusesF32Cache(Model& m, Backend& be) {
  auto kv = KvCache::Create(m.KvOptions(16, KvDType::kF32, 4), be);
  ASSERT_TRUE(kv.ok());
  PD_ASSERT_OK((*kv)->Reserve(0, 1));
  Batch b;
  b.Add(1, 0, 0, true);
  std::vector<float> logits;
  EXPECT_THAT(m.Forward(b, **kv, &logits),
              StatusIs(absl::StatusCode::kFailedPrecondition, "F32 cache"));
}

// A prompt of 5 rows in sequence 0, then three steps of one row in each of sequences 0 and 1
// (`vocab` picks the tokens): the logits of every row in order into *out, the hidden states into
// *hidden.
void RunPromptThenTwoSequences(Model& m, Backend& be, KvDType kv_type, int vocab,
                               std::vector<float>* out, std::vector<float>* hidden) {
  auto kv = KvCache::Create(m.KvOptions(64, kv_type, 4), be);
  ASSERT_TRUE(kv.ok());
  PD_ASSERT_OK((*kv)->Reserve(0, 8));
  PD_ASSERT_OK((*kv)->Reserve(1, 8));
  Batch b;
  for (int i = 0; i < 5; ++i) b.Add(3 + 7 * i, i, 0, true);
  PD_ASSERT_OK(m.ForwardHidden(b, **kv, out, hidden));
  for (int i = 5; i < 8; ++i) {
    Batch two;
    two.Add(vocab - i, i, 0, true);
    two.Add(11 * i % vocab, i - 5, 1, true);
    std::vector<float> rows, h;
    PD_ASSERT_OK(m.ForwardHidden(two, **kv, &rows, &h));
    out->insert(out->end(), rows.begin(), rows.end());
    hidden->insert(hidden->end(), h.begin(), h.end());
  }
}

// A head laid out for the own order at load (LoadOptions::no_f32_cache: q8_0x16 on the CPU where
// the backend runs that order) gives the bits of the file's head with the flag, over F16 and INT8
// caches, tied (the embedding then read from that layout too) and untied, with a vocabulary of
// whole groups of 16 rows and one with plain rows after them; prompt rows, decode rows and two
// sequences in one batch. An F32 cache is refused. On the default kernels and on the portable
// ones (which lay it out on any CPU).
TEST(ModelHeadOrderTest, LaidOutHeadGivesTheFlagsBitsAndRefusesF32Caches) {
  for (const bool scalar : {false, true}) {
    std::unique_ptr<Backend> be = CreateCpuBackend({.force_scalar = scalar});
    for (const bool tied : {true, false}) {
      for (const int vocab : {96, 101}) {
        SCOPED_TRACE(::testing::Message() << (scalar ? "portable " : "default ")
                                          << (tied ? "tied " : "untied ") << vocab);
        TinyModelSpec spec;
        spec.tied = tied;
        spec.type = DType::kQ8_0;
        spec.n_vocab = vocab;
        const std::string bytes = testing::TinyModel(spec);
        absl::StatusOr<std::unique_ptr<Model>> plain_or = LoadTiny(bytes, *be, false);
        absl::StatusOr<std::unique_ptr<Model>> laid_or = LoadTiny(bytes, *be, true);
        ASSERT_TRUE(plain_or.ok()) << plain_or.status();
        ASSERT_TRUE(laid_or.ok()) << laid_or.status();
        std::unique_ptr<Model> plain = std::move(*plain_or), laid = std::move(*laid_or);
        EXPECT_FALSE(plain->head_laid_out_own());
        const bool expect_laid = scalar || cpu::Q8_0x16OwnOrderVnni() != nullptr ||
                                 cpu::Q8_0x16OwnOrderAvx2() != nullptr;
        ASSERT_EQ(laid->head_laid_out_own(), expect_laid);
        if (expect_laid) {
          EXPECT_EQ(laid->weights().output.type, DType::kQ8_0x16);
          EXPECT_EQ(laid->weights().token_embd.type, tied ? DType::kQ8_0x16 : DType::kQ8_0);
        }
        for (const KvDType kv_type : {KvDType::kF16, KvDType::kI8}) {
          std::vector<float> want, got, unused;
          RunPromptThenTwoSequences(*plain, *be, kv_type, vocab, &want, &unused);
          RunPromptThenTwoSequences(*laid, *be, kv_type, vocab, &got, &unused);
          ASSERT_EQ(got.size(), want.size());
          EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << "kv " << static_cast<int>(kv_type);
        }
        if (expect_laid) ExpectRefusesF32Cache(*laid, *be);
      }
    }
  }
}

// The layers' Q8_0, Q5_0, Q4_K and Q6_K matrices laid out for the own order at load (q8_0x16,
// q5_0x16, q4_Kx16, q6_Kx16 where the backend runs that order) give the bits of the file's rows
// with the flag (a model loaded without the option, the order on by default), over F16 and INT8
// caches: separate and fused projections (a fused matrix's parts laid out each), and K / V
// projections of 8 rows, off the groups of 16 (Q5_0's then keep their rows and take the order
// through the flag, a part group padded). The own order is not llama.cpp's
// (set_layer_order_own(false) on the plain model gives other hidden states), a model made by
// WithHead keeps its target's order, and an F32 cache is refused.
TEST(ModelLayerOrderTest, LaidOutLayersGiveTheFlagsBitsAndRefuseF32Caches) {
  for (const bool scalar : {false, true}) {
    std::unique_ptr<Backend> be = CreateCpuBackend({.force_scalar = scalar});
    for (const DType type : {DType::kQ5_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K}) {
      // VNNI runs every type's own order, AVX2 alone all but Q6_K's.
      const bool runs_own = scalar || cpu::Q6_Kx16OwnOrderVnni() != nullptr ||
                            (type != DType::kQ6_K && cpu::Q5_0x16OwnOrderAvx2() != nullptr);
      for (const bool fused : {false, true}) {
        for (const bool narrow_kv : {false, true}) {
          // K-quant rows are whole 256-blocks: the model is 256 wide, its attention output too.
          const bool kquant = type == DType::kQ4_K || type == DType::kQ6_K;
          if (kquant && narrow_kv) continue;
          SCOPED_TRACE(::testing::Message()
                       << (scalar ? "portable " : "default ") << Traits(type).name
                       << (fused ? " fused" : "") << (narrow_kv ? " narrow kv" : ""));
          TinyModelSpec spec;
          spec.type = type;
          spec.fused = fused;
          if (kquant) {
            spec.n_embd = 256;
            spec.n_ff = 512;  // FFN down of 2 super-blocks: the orders' chains differ
            spec.n_head = 4;  // head_dim 64: q and output 256 x 256, k and v 128 rows
          }
          if (narrow_kv) {
            spec.n_head_kv = 1;
            spec.head_dim = 8;  // q 32 rows, k and v 8
          }
          const std::string bytes = testing::TinyModel(spec);
          std::unique_ptr<Model> models[3];  // plain, laid out, plain in llama.cpp's order
          for (int i = 0; i < 3; ++i) {
            absl::StatusOr<std::unique_ptr<Model>> m = LoadTiny(bytes, *be, i == 1);
            ASSERT_TRUE(m.ok()) << m.status();
            models[i] = std::move(*m);
          }
          Model* plain = models[0].get();
          Model* laid = models[1].get();
          Model* llama = models[2].get();
          llama->set_layer_order_own(false);
          EXPECT_FALSE(plain->layers_laid_out_own());
          ASSERT_EQ(laid->layers_laid_out_own(), runs_own);
          if (runs_own) {
            const LayerWeights& l = laid->weights().layers[0];
            const DType x16 = type == DType::kQ5_0   ? DType::kQ5_0x16
                              : type == DType::kQ4_K ? DType::kQ4_Kx16
                              : type == DType::kQ6_K ? DType::kQ6_Kx16
                                                     : DType::kQ8_0x16;
            EXPECT_EQ(l.wq.type, x16);
            EXPECT_EQ(l.wk.type, narrow_kv && type == DType::kQ5_0 ? type : x16);
            EXPECT_EQ(l.wo.type, x16);
            EXPECT_EQ(l.w_gate.type, x16);
            EXPECT_EQ(l.w_down.type, x16);
          }
          for (const KvDType kv_type : {KvDType::kF16, KvDType::kI8}) {
            std::vector<float> want, got, theirs, want_h, got_h, theirs_h;
            RunPromptThenTwoSequences(*plain, *be, kv_type, spec.n_vocab, &want, &want_h);
            RunPromptThenTwoSequences(*laid, *be, kv_type, spec.n_vocab, &got, &got_h);
            RunPromptThenTwoSequences(*llama, *be, kv_type, spec.n_vocab, &theirs, &theirs_h);
            ASSERT_EQ(got.size(), want.size());
            ASSERT_EQ(got_h.size(), want_h.size());
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << "kv " << static_cast<int>(kv_type);
            EXPECT_EQ(std::memcmp(got_h.data(), want_h.data(), got_h.size() * sizeof(float)), 0)
                << "kv " << static_cast<int>(kv_type);
            if (runs_own) {
              EXPECT_NE(std::memcmp(theirs_h.data(), want_h.data(), want_h.size() * sizeof(float)),
                        0)
                  << "the orders agree on this model: the test shows nothing";
            }
          }
          absl::StatusOr<std::unique_ptr<Model>> draft = Model::WithHead(*laid, {1, 5, 9});
          ASSERT_TRUE(draft.ok()) << draft.status();
          EXPECT_EQ((*draft)->layer_order_own(), laid->layer_order_own());
          if (runs_own) ExpectRefusesF32Cache(*laid, *be);
        }
      }
    }
  }
}

// PDSERVE_HEAD_ORDER and PDSERVE_LAYER_ORDER (docs/config.md): `llama` turns the order and its
// layouts off, anything but own / llama is refused with the variable's name, unset is own.
TEST(ModelLayerOrderTest, TheSettingsAreReadAndCheckedAtLoad) {
  std::unique_ptr<Backend> be = CreateCpuBackend({.force_scalar = true});
  TinyModelSpec spec;
  spec.type = DType::kQ5_0;
  const std::string bytes = testing::TinyModel(spec);
  auto load = [&]() { return LoadTiny(bytes, *be, /*no_f32_cache=*/true); };
  for (const char* name : {"PDSERVE_LAYER_ORDER", "PDSERVE_HEAD_ORDER"}) {
    SCOPED_TRACE(name);
    ASSERT_EQ(setenv(name, "fast", 1), 0);
    EXPECT_THAT(load().status(), StatusIs(absl::StatusCode::kInvalidArgument, name));
    ASSERT_EQ(setenv(name, "llama", 1), 0);
    absl::StatusOr<std::unique_ptr<Model>> m = load();
    ASSERT_TRUE(m.ok()) << m.status();
    const bool layers = std::string_view(name) == "PDSERVE_LAYER_ORDER";
    EXPECT_EQ((*m)->layer_order_own(), !layers);
    EXPECT_EQ((*m)->layers_laid_out_own(), !layers);
    EXPECT_EQ((*m)->head_order_own(), layers);
    ASSERT_EQ(unsetenv(name), 0);
    m = load();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE((*m)->layer_order_own());
    EXPECT_TRUE((*m)->head_order_own());
  }
}

TEST(ModelWithHeadTest, RefusesBadTokenLists) {
  auto f = Make(TinyModelSpec{});
  EXPECT_THAT(Model::WithHead(*f->model, {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no tokens"));
  EXPECT_THAT(Model::WithHead(*f->model, {3, 2}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "ascending"));
  EXPECT_THAT(Model::WithHead(*f->model, {4, 4}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "ascending"));
  EXPECT_THAT(Model::WithHead(*f->model, {1, 96}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the vocabulary"));
  EXPECT_THAT(Model::WithHead(*f->model, {-1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the vocabulary"));
  auto view = Model::WithHead(*f->model, {1, 2, 3});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_THAT(Model::WithHead(**view, {1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "already restricted"));
}

TEST(ModelErrorsTest, BadBatchesAreRefused) {
  auto f = Make(TinyModelSpec{});
  std::vector<float> logits;
  Batch empty;
  EXPECT_THAT(f->model->Forward(empty, *f->kv, &logits),
              StatusIs(absl::StatusCode::kInvalidArgument));
  Batch b;
  b.Add(5, 0, 0, true);
  EXPECT_THAT(f->model->Forward(b, *f->kv, &logits),
              StatusIs(absl::StatusCode::kInvalidArgument, "beyond its reserved KV"));
  PD_ASSERT_OK(f->kv->Reserve(0, 1));
  Batch bad_token;
  bad_token.Add(96, 0, 0, true);
  EXPECT_THAT(f->model->Forward(bad_token, *f->kv, &logits),
              StatusIs(absl::StatusCode::kInvalidArgument, "outside the vocabulary"));
}

TEST(ModelErrorsTest, GenerateRefusesOversizedRequestAndKeepsNoBlocks) {
  auto f = Make(TinyModelSpec{}, KvDType::kF16, /*blocks=*/4);  // 16 tokens
  GenerateOptions o;
  o.max_tokens = 10;
  o.sampling = SamplingParams::Greedy();
  EXPECT_THAT(Generate(*f->model, *f->kv, 0, std::vector<int32_t>(8, 1), o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "exceeds the KV cache"));
  EXPECT_THAT(Generate(*f->model, *f->kv, 0, {}, o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(f->kv->free_blocks(), 4);
}

}  // namespace
}  // namespace pd::engine
