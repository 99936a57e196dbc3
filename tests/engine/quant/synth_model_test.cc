// Synthetic models (engine/quant/quantize/synth_model.h): a tiny model of every supported type
// is written, read back with the shape asked for, loaded on the CPU backend and run to finite
// logits; the file is a function of the spec and seed alone (not of the thread count); the
// synthetic vocabulary loads as an SPM tokenizer that round-trips text; the named shapes have
// their real parameter counts; bad specs are refused before anything is written.
#include "engine/quant/quantize/synth_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/status_matchers.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"
#include "engine/quant/matrix_quant.h"
#include "engine/quant/quantize/policy.h"
#include "engine/runtime/model.h"
#include "engine/tokenizer/tokenizer.h"

namespace pd::engine::quantize {
namespace {

using ::pd::testing::StatusIs;

std::string TempPath(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/synth_model_test";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

SynthModelSpec Tiny(DType type, uint64_t seed = 1) {
  auto s = FindSynthShape("tiny");
  PD_CHECK(s.ok());
  s->type = type;
  s->seed = seed;
  return *s;
}

absl::Status Write(const SynthModelSpec& spec, const std::string& path) {
  std::unique_ptr<Progress> quiet = MakeQuietProgress();
  return WriteSynthModel(spec, path, *quiet);
}

// Loads `path` on the CPU backend and returns the logits of the last of `tokens` (empty on a
// failure, which is reported).
std::vector<float> LastLogits(const std::string& path, const std::vector<int32_t>& tokens) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  std::unique_ptr<Backend> backend = CreateCpuBackend();
  auto model = Model::Load(std::shared_ptr<const GgufFile>(std::move(*file)), *backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  auto kv = KvCache::Create((*model)->KvOptions(16, KvDType::kF32, 4), *backend);
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return {};
  EXPECT_TRUE((*kv)->Reserve(0, static_cast<int>(tokens.size())).ok());
  Batch b;
  for (size_t i = 0; i < tokens.size(); ++i) {
    b.Add(tokens[i], static_cast<int32_t>(i), 0, i + 1 == tokens.size());
  }
  std::vector<float> logits;
  const absl::Status s = (*model)->Forward(b, **kv, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

// ---- every type ----

class SynthTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(SynthTypeTest, WritesLoadsAndRuns) {
  const DType type = GetParam();
  SynthModelSpec spec = Tiny(type);
  spec.n_layer = 1;  // the k-quants' scale search is slow: small tensors are quantized directly
  const std::string path = TempPath(pd::StrCat("tiny_", Traits(type).name, ".gguf"));
  PD_ASSERT_OK(Write(spec, path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto plan = PlanSynthModel(spec);
  PD_ASSERT_OK(plan);
  EXPECT_EQ(std::filesystem::file_size(path), plan->file_bytes);

  auto file = GgufFile::Open(path);
  PD_ASSERT_OK(file);
  auto c = ModelConfig::FromGguf(**file);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->arch, "llama");
  EXPECT_EQ(c->n_layer, spec.n_layer);
  EXPECT_EQ(c->n_embd, spec.n_embd);
  EXPECT_EQ(c->n_head, spec.n_head);
  EXPECT_EQ(c->n_head_kv, spec.n_head_kv);
  EXPECT_EQ(c->head_dim, spec.n_embd / spec.n_head);
  EXPECT_EQ(c->n_ff, spec.n_ff);
  EXPECT_EQ(c->n_vocab, spec.n_vocab);
  EXPECT_EQ(c->n_ctx_train, spec.n_ctx);
  EXPECT_FLOAT_EQ(c->rope_freq_base, spec.rope_freq_base);
  EXPECT_FLOAT_EQ(c->rms_eps, spec.rms_eps);
  EXPECT_FALSE(c->tied_output);
  for (const char* name : {"token_embd.weight", "blk.0.ffn_down.weight", "output.weight"}) {
    const GgufTensorInfo* t = (*file)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, type) << name;
  }
  const GgufTensorInfo* norm = (*file)->FindTensor("blk.0.attn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->type, DType::kF32);
  EXPECT_EQ((*file)->tensors().size(), plan->tensors.size());

  const std::vector<float> logits = LastLogits(path, {1, 300, 301, 302, 420, 7});
  ASSERT_EQ(logits.size(), static_cast<size_t>(spec.n_vocab));
  float lo = logits[0], hi = logits[0];
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    lo = std::min(lo, x), hi = std::max(hi, x);
  }
  EXPECT_GT(hi - lo, 0.1f);  // not a constant head
  std::filesystem::remove(path);
}

std::vector<DType> AllTypes() {
  std::vector<DType> types = QuantTypes();
  types.insert(types.end(), {DType::kQ5_0, DType::kF32, DType::kF16, DType::kBF16});
  return types;
}

INSTANTIATE_TEST_SUITE_P(Types, SynthTypeTest, ::testing::ValuesIn(AllTypes()),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(Traits(i.param).name);
                         });

// ---- the layout options ----

TEST(SynthModelTest, OutputTypeTiedAndHeadDim) {
  SynthModelSpec spec = Tiny(DType::kQ8_0);
  spec.output_type = DType::kQ6_K;
  std::string path = TempPath("out_type.gguf");
  PD_ASSERT_OK(Write(spec, path));
  {
    auto file = GgufFile::Open(path);
    PD_ASSERT_OK(file);
    EXPECT_EQ((*file)->FindTensor("output.weight")->type, DType::kQ6_K);
    EXPECT_EQ((*file)->FindTensor("token_embd.weight")->type, DType::kQ8_0);
  }

  spec = Tiny(DType::kQ8_0);
  spec.tied_output = true;
  spec.head_dim = 96;  // q dim 384 != n_embd 256: written as attention.key_length
  path = TempPath("tied.gguf");
  PD_ASSERT_OK(Write(spec, path));
  auto file = GgufFile::Open(path);
  PD_ASSERT_OK(file);
  EXPECT_EQ((*file)->FindTensor("output.weight"), nullptr);
  auto c = ModelConfig::FromGguf(**file);
  PD_ASSERT_OK(c);
  EXPECT_TRUE(c->tied_output);
  EXPECT_EQ(c->head_dim, 96);
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q.weight")->shape, (std::vector<int64_t>{256, 384}));
  const std::vector<float> logits = LastLogits(path, {1, 2, 3});
  ASSERT_EQ(logits.size(), 512u);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// ---- determinism ----

// A one-layer model with a 32k vocabulary: with q4_0, every matrix but ffn_down is pooled
// (SynthTensor::pooled).
SynthModelSpec Vocab32k(DType type, uint64_t seed = 1) {
  SynthModelSpec spec = Tiny(type, seed);
  spec.n_layer = 1;
  spec.n_vocab = 32000;
  return spec;
}

TEST(SynthModelTest, SameSeedSameBytesWhateverTheThreads) {
  SynthModelSpec spec = Vocab32k(DType::kQ4_0, 7);
  auto plan = PlanSynthModel(spec);
  PD_ASSERT_OK(plan);
  ASSERT_TRUE(plan->tensors.front().pooled);  // both paths are covered
  ASSERT_EQ(plan->tensors[9].name, "blk.0.ffn_down.weight");
  ASSERT_FALSE(plan->tensors[9].pooled);
  spec.threads = 1;
  const std::string a = TempPath("seed7_t1.gguf"), b = TempPath("seed7_t3.gguf"),
                    c = TempPath("seed8.gguf");
  PD_ASSERT_OK(Write(spec, a));
  spec.threads = 3;
  PD_ASSERT_OK(Write(spec, b));
  spec.seed = 8;
  PD_ASSERT_OK(Write(spec, c));
  const std::string ba = ReadAll(a), bb = ReadAll(b), bc = ReadAll(c);
  ASSERT_FALSE(ba.empty());
  EXPECT_TRUE(ba == bb) << "same seed, different bytes";
  ASSERT_EQ(ba.size(), bc.size());  // the same layout...
  EXPECT_FALSE(ba == bc);           // ...other weights
}

// ---- weights ----

TEST(SynthModelTest, WeightsHaveTheirScale) {
  SynthModelSpec spec = Tiny(DType::kF32, 3);
  const std::string path = TempPath("f32.gguf");
  PD_ASSERT_OK(Write(spec, path));
  auto file = GgufFile::Open(path);
  PD_ASSERT_OK(file);
  auto stats = [&](const char* name) {
    const GgufTensorInfo* t = (*file)->FindTensor(name);
    PD_CHECK(t != nullptr);
    const float* v = reinterpret_cast<const float*>(t->data);
    const int64_t n = t->numel();
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i) sum += v[i], sq += double{v[i]} * v[i];
    return std::pair<double, double>(sum / n, std::sqrt(sq / n - (sum / n) * (sum / n)));
  };
  const auto [m_norm, s_norm] = stats("blk.0.attn_norm.weight");
  EXPECT_EQ(m_norm, 1.0);
  EXPECT_EQ(s_norm, 0.0);
  const auto [m_q, s_q] = stats("blk.0.attn_q.weight");  // 1 / sqrt(256)
  EXPECT_NEAR(m_q, 0.0, 0.002);
  EXPECT_NEAR(s_q, 1.0 / 16, 0.002);
  const auto [m_down, s_down] = stats("blk.1.ffn_down.weight");  // 1 / sqrt(512)
  EXPECT_NEAR(s_down, 1.0 / std::sqrt(512.0), 0.002);
  const auto [m_e, s_e] = stats("token_embd.weight");
  EXPECT_NEAR(m_e, 0.0, 0.01);
  EXPECT_NEAR(s_e, 1.0, 0.01);
}

TEST(SynthModelTest, PooledTensorsAreNormalDistinctAndRun) {
  const SynthModelSpec spec = Vocab32k(DType::kQ4_0, 5);
  auto plan = PlanSynthModel(spec);
  PD_ASSERT_OK(plan);
  // Pools by stddev: token_embd's (1), the n_embd-wide matrices' (1/16) serve over 8192 blocks;
  // ffn_down's (1/sqrt(512)) only 4096.
  for (const SynthTensor& t : plan->tensors) {
    EXPECT_EQ(t.pooled, t.stddev != 0 && t.name.find("ffn_down") == std::string::npos) << t.name;
  }
  // Rows of one q4_K block would repeat pool blocks: quantized directly.
  auto k_plan = PlanSynthModel(Vocab32k(DType::kQ4_K));
  PD_ASSERT_OK(k_plan);
  EXPECT_FALSE(k_plan->tensors.front().pooled);
  SynthModelSpec wide = Vocab32k(DType::kQ4_K);
  wide.n_embd = 1024;
  k_plan = PlanSynthModel(wide);
  PD_ASSERT_OK(k_plan);
  EXPECT_TRUE(k_plan->tensors.front().pooled);
  const std::string path = TempPath("pooled.gguf");
  PD_ASSERT_OK(Write(spec, path));
  auto file = GgufFile::Open(path);
  PD_ASSERT_OK(file);
  const GgufTensorInfo* e = (*file)->FindTensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  std::vector<float> v(e->numel());
  DequantizeMatrix(e->type, e->data, e->rows(), e->shape[0], 0, v.data());
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += double{x} * x;
  EXPECT_NEAR(sum / v.size(), 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / v.size()), 1.0, 0.05);  // q4_0 adds ~10% noise
  std::set<std::vector<float>> rows;
  for (int64_t r = 0; r < e->rows(); ++r) {
    rows.insert(std::vector<float>(v.begin() + r * 256, v.begin() + (r + 1) * 256));
  }
  EXPECT_EQ(rows.size(), static_cast<size_t>(e->rows()));

  const std::vector<float> logits = LastLogits(path, {1, 5000, 17, 31999});
  ASSERT_EQ(logits.size(), 32000u);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// ---- tokenizer ----

TEST(SynthModelTest, VocabularyIsExactAndUnique) {
  for (int n : {259, 260, 512, 32000, 128256}) {
    const std::vector<std::string> v = SynthVocabulary(n);
    ASSERT_EQ(v.size(), static_cast<size_t>(n));
    EXPECT_EQ(std::set<std::string>(v.begin(), v.end()).size(), v.size()) << n;
    EXPECT_EQ(v[0], "<unk>");
    EXPECT_EQ(v[1], "<s>");
    EXPECT_EQ(v[2], "</s>");
    EXPECT_EQ(v[3], "<0x00>");
    EXPECT_EQ(v[258], "<0xFF>");
  }
}

TEST(SynthModelTest, TokenizerLoadsAndRoundTrips) {
  // A 32k vocabulary (every piece of up to 3 letters): merges happen.
  const SynthModelSpec spec = Vocab32k(DType::kQ8_0);
  const std::string path = TempPath("vocab32k.gguf");
  PD_ASSERT_OK(Write(spec, path));
  auto file = GgufFile::Open(path);
  PD_ASSERT_OK(file);
  auto tok = Tokenizer::FromGguf(**file);
  PD_ASSERT_OK(tok);
  EXPECT_EQ((*tok)->model(), TokenizerModel::kSpm);
  EXPECT_EQ((*tok)->n_vocab(), 32000);
  EXPECT_EQ((*tok)->bos(), 1);
  EXPECT_EQ((*tok)->eos(), 2);
  EXPECT_TRUE((*tok)->IsEog(2));

  const std::string text = "Hello, world! The quick brown fox jumps over 13 lazy dogs.\n\tEnd~";
  const std::vector<int32_t> ids = (*tok)->Encode(text, /*add_special=*/false, false);
  EXPECT_EQ((*tok)->Decode(ids), text);
  EXPECT_LT(ids.size(), text.size() * 2 / 3) << "pieces should merge";
  EXPECT_EQ((*tok)->Encode("hello", false, false).size(), 2u);  // "▁hel" "lo"?
  const std::vector<int32_t> with_bos = (*tok)->Encode("the cat", /*add_special=*/true, false);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], 1);
  // Bytes outside the pieces fall back to byte tokens.
  const std::string utf8 = "na\xC3\xAFve \xE2\x82\xAC";
  EXPECT_EQ((*tok)->Decode((*tok)->Encode(utf8, false, false)), utf8);
}

// ---- shapes and plans ----

TEST(SynthModelTest, NamedShapesHaveTheirRealSizes) {
  auto s7 = FindSynthShape("llama-7b");
  PD_ASSERT_OK(s7);
  EXPECT_EQ(s7->n_layer, 32);
  EXPECT_EQ(s7->n_embd, 4096);
  EXPECT_EQ(s7->n_head_kv, 32);
  EXPECT_EQ(s7->n_ff, 11008);
  EXPECT_EQ(s7->n_vocab, 32000);
  s7->type = DType::kF16;
  auto p7 = PlanSynthModel(*s7);
  PD_ASSERT_OK(p7);
  EXPECT_EQ(p7->n_params, 6738415616);  // Llama 2 7B
  EXPECT_EQ(p7->tensors.size(), 3u + 32 * 9);
  // f16: 2 bytes a weight (norms 4) plus a header under 1 MiB.
  EXPECT_GT(p7->file_bytes, uint64_t(p7->n_params) * 2);
  EXPECT_LT(p7->file_bytes, uint64_t(p7->n_params) * 2 + (2u << 20));
  s7->type = DType::kQ4_K;
  auto p7q = PlanSynthModel(*s7);
  PD_ASSERT_OK(p7q);
  EXPECT_NEAR(double(p7q->file_bytes) / p7q->n_params, 4.5 / 8, 0.001);  // 3.8 GB

  auto s8 = FindSynthShape("llama3-8b");
  PD_ASSERT_OK(s8);
  EXPECT_EQ(s8->n_head_kv, 8);
  EXPECT_EQ(s8->n_vocab, 128256);
  EXPECT_EQ(s8->rope_freq_base, 500000.f);
  auto p8 = PlanSynthModel(*s8);
  PD_ASSERT_OK(p8);
  EXPECT_EQ(p8->n_params, 8030261248);  // Llama 3 8B

  auto s1 = FindSynthShape("llama-1b");
  PD_ASSERT_OK(s1);
  auto p1 = PlanSynthModel(*s1);
  PD_ASSERT_OK(p1);
  EXPECT_NEAR(double(p1->n_params), 1.1e9, 0.05e9);

  for (const SynthShape& sh : SynthShapes()) {
    SynthModelSpec s = sh.spec;
    s.type = DType::kQ4_K;  // the strictest block size: every shape must take it
    PD_EXPECT_OK(PlanSynthModel(s)) << sh.name;
    EXPECT_NE(DescribeSynthShapes().find(std::string(sh.name)), std::string::npos);
  }
}

// ---- errors ----

TEST(SynthModelTest, BadSpecsAreRefused) {
  EXPECT_THAT(FindSynthShape("llama-70x"), StatusIs(absl::StatusCode::kNotFound, "llama-7b"));
  auto bad = [](auto edit) {
    SynthModelSpec s = Tiny(DType::kQ4_K);
    edit(s);
    return ValidateSynthSpec(s);
  };
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.n_head = 3, s.n_head_kv = 3; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a multiple of heads"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.n_head_kv = 3; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "kv-heads"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.head_dim = 63; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.n_embd = 320, s.n_head = 5, s.n_head_kv = 5; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "multiple of 256"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.n_ff = 640; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "ff = 640"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.head_dim = 80; }),  // q dim 320
              StatusIs(absl::StatusCode::kInvalidArgument, "heads * head-dim"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.type = DType::kQ8_K; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "q8_K"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.output_type = DType::kQ8_K; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "output type"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.n_vocab = 258; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "vocab"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.n_layer = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "layers"));
  EXPECT_THAT(bad([](SynthModelSpec& s) { s.rope_freq_base = 1.f; }),
              StatusIs(absl::StatusCode::kInvalidArgument, "rope"));
  PD_EXPECT_OK(bad([](SynthModelSpec& s) {
    s.type = DType::kQ8_0, s.n_embd = 320, s.n_head = 5, s.n_head_kv = 5;
  }));

  // Nothing is written for a bad spec.
  SynthModelSpec s = Tiny(DType::kQ4_K);
  s.n_ff = 640;
  const std::string path = TempPath("bad.gguf");
  EXPECT_THAT(Write(s, path), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(SynthModelTest, MissingFolderAndFailedWritesLeaveNoFile) {
  const std::string missing = TempPath("no/such/folder/m.gguf");
  EXPECT_THAT(Write(Tiny(DType::kQ8_0), missing),
              StatusIs(absl::StatusCode::kNotFound, "does not exist"));
  EXPECT_FALSE(std::filesystem::exists(missing + ".tmp"));

  // PATH.tmp cannot be created (a folder is in the way): no file at PATH either.
  const std::string path = TempPath("blocked.gguf");
  std::filesystem::create_directories(path + ".tmp");
  EXPECT_FALSE(Write(Tiny(DType::kQ8_0), path).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  std::filesystem::remove_all(path + ".tmp");
}

// ---- progress ----

class RecordingProgress final : public Progress {
 public:
  void Start(std::string_view stage, int64_t total, std::string_view unit) override {
    starts++;
    this->total = total;
    this->unit = std::string(unit);
  }
  void Update(int64_t done, std::string_view detail) override {
    last_done = done;
    details.insert(std::string(detail));
  }
  void Finish() override { finishes++; }
  void Note(std::string_view) override {}
  int starts = 0, finishes = 0;
  int64_t total = 0, last_done = 0;
  std::string unit;
  std::set<std::string> details;
};

TEST(SynthModelTest, ReportsProgressPerTensor) {
  SynthModelSpec spec = Tiny(DType::kF32);
  RecordingProgress p;
  PD_ASSERT_OK(WriteSynthModel(spec, TempPath("progress.gguf"), p));
  EXPECT_EQ(p.starts, 1);
  EXPECT_EQ(p.finishes, 1);
  EXPECT_EQ(p.unit, "MiB");
  EXPECT_GT(p.total, 0);
  EXPECT_GE(p.last_done, p.total - 1);  // whole MiB done, rounded down
  const size_t n = PlanSynthModel(spec)->tensors.size();
  EXPECT_EQ(p.details.size(), n);
  EXPECT_EQ(p.details.count(pd::StrCat("tensor 1/", n, " token_embd.weight")), 1u);
}

}  // namespace
}  // namespace pd::engine::quantize
