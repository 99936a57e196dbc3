// The whole quantizer job (engine/quant/quantize/quantize_model.h) on tiny random models
// (tests/testing/tiny_model.h): every base type with round-to-nearest; the output loads in our
// reader with the planned types and shapes, unquantized tensors and all metadata copied bit for
// bit, the quantization keys set; fallbacks for rows that k-quants cannot take; errors leave no
// file. (Calibrated methods need a tokenizer: tests/python/test_quantize.py runs them on the
// synthetic models.)
#include "engine/quant/quantize/quantize_model.h"

#include <gtest/gtest.h>

#include <cstring>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "common/strings.h"
#include "engine/model/gguf.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/matrix_quant.h"
#include "engine/quant/quantize/calibration.h"
#include "engine/quant/quantize/policy.h"
#include "tests/testing/tiny_model.h"

namespace pd::engine::quantize {
namespace {

using ::pd::testing::StatusIs;
namespace t = ::pd::engine::testing;

class QuantizeModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test and process: ctest runs the tests of this binary in parallel.
    dir_ = ::testing::TempDir() + "/quantize_model_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
           std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    progress_ = MakeQuietProgress();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // A model whose matrices take k-quants (rows of 256), untied head.
  std::string KModel(DType type = DType::kF32, const std::string& arch = "llama") {
    t::TinyModelSpec s;
    s.arch = arch;
    s.n_embd = 256;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 512;
    s.type = type;
    return Write(pd::StrCat("k_", Traits(type).name, "_", arch, ".gguf"), t::TinyModel(s));
  }
  bool NothingAt(const std::string& out) {
    return !std::filesystem::exists(out) && !std::filesystem::exists(out + ".tmp");
  }

  std::string dir_;
  std::unique_ptr<Progress> progress_;
};

TEST_F(QuantizeModelTest, EveryTypeWritesAFileOurReaderLoads) {
  const std::string in = KModel();
  auto src = GgufFile::Open(in);
  PD_ASSERT_OK(src);
  auto policy = Policy::Load("M");
  PD_ASSERT_OK(policy);
  for (DType base : QuantTypes()) {
    SCOPED_TRACE(std::string(Traits(base).name));
    QuantizeOptions o;
    o.input = in;
    o.output = dir_ + "/out.gguf";
    o.type = base;
    auto report = QuantizeModel(o, *progress_);
    PD_ASSERT_OK(report);
    EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
    auto out = GgufFile::Open(o.output);
    PD_ASSERT_OK(out);
    EXPECT_EQ((*out)->alignment(), 32u);
    EXPECT_EQ(report->file_bytes, (*out)->file_size());

    // Metadata: every key of the input, value for value, plus the quantization keys.
    for (const auto& [key, v] : (*src)->metadata()) {
      const GgufValue* o2 = (*out)->Find(key);
      ASSERT_NE(o2, nullptr) << key;
      EXPECT_EQ(o2->type, v.type) << key;
      EXPECT_EQ(o2->u, v.u) << key;
      EXPECT_EQ(o2->i, v.i) << key;
      EXPECT_EQ(o2->f, v.f) << key;
      EXPECT_EQ(o2->str, v.str) << key;
    }
    EXPECT_EQ(*(*out)->GetUint("general.quantization_version"), 2u);
    EXPECT_EQ(*(*out)->GetUint("general.file_type"), policy->file_type.at(base));
    EXPECT_EQ(report->file_type, policy->file_type.at(base));

    // Tensors: same names, order and shapes; types as planned; copies bit for bit.
    const auto& st = (*src)->tensors();
    const auto& ot = (*out)->tensors();
    ASSERT_EQ(ot.size(), st.size());
    ASSERT_EQ(report->tensors.size(), st.size());
    for (size_t i = 0; i < st.size(); ++i) {
      SCOPED_TRACE(st[i].name);
      const TensorReport& r = report->tensors[i];
      EXPECT_EQ(ot[i].name, st[i].name);
      EXPECT_EQ(ot[i].shape, st[i].shape);
      EXPECT_EQ(ot[i].type, r.type);
      EXPECT_EQ(ot[i].offset % 32, 0u);
      if (st[i].shape.size() == 1) {
        EXPECT_FALSE(r.quantized);
        EXPECT_EQ(ot[i].type, DType::kF32);
        ASSERT_EQ(ot[i].nbytes, st[i].nbytes);
        if (r.method == "smooth") {
          // W8A8 smoothing divided this norm by s (tested in W8A8SmoothingIsExact...).
          EXPECT_EQ(base, DType::kW8A8);
          continue;
        }
        EXPECT_EQ(std::memcmp(ot[i].data, st[i].data, st[i].nbytes), 0);
        continue;
      }
      EXPECT_TRUE(r.quantized);
      EXPECT_EQ(r.method, "rtn");
      const TypeChoice c = ChooseType(*policy, base, {}, TensorPlace{st[i].name, -1, 2, false});
      if (st[i].name.rfind("blk.", 0) != 0) {
        EXPECT_EQ(r.type, c.type);
      }
      EXPECT_GE(BitsPerWeight(r.type), BitsPerWeight(base));
      // The stored weights dequantize close to the input (and match the reported error).
      const int64_t rows = st[i].rows(), cols = st[i].shape[0];
      std::vector<float> q(rows * cols);
      DequantizeMatrix(ot[i].type, ot[i].data, rows, cols, 1, q.data());
      const double err =
          RelativeError(reinterpret_cast<const float*>(st[i].data), q.data(), rows * cols);
      EXPECT_NEAR(err, r.w_err, 1e-9);
      EXPECT_LT(err, base == DType::kQ2_K ? 0.45 : 0.2);
    }
    // The policy's extra bits: attn_v and the head above the base (unless at the top).
    if (base != DType::kQ8_0 && base != DType::kW8A8) {
      EXPECT_GT(BitsPerWeight((*out)->FindTensor("blk.0.attn_v.weight")->type),
                BitsPerWeight(base));
      EXPECT_GT(BitsPerWeight((*out)->FindTensor("output.weight")->type), BitsPerWeight(base));
      EXPECT_EQ((*out)->FindTensor("blk.1.attn_q.weight")->type, base);
    }
    EXPECT_GT(report->bpw, 0);
    EXPECT_NE(FormatReport(*report).find("blk.0.attn_v.weight"), std::string::npos);
  }
}

TEST_F(QuantizeModelTest, HalfAndQuantizedInputs) {
  for (DType src : {DType::kF16, DType::kBF16, DType::kQ8_0}) {
    SCOPED_TRACE(std::string(Traits(src).name));
    QuantizeOptions o;
    o.input = KModel(src);
    o.output = dir_ + "/half.gguf";
    o.type = DType::kQ4_K;
    auto report = QuantizeModel(o, *progress_);
    PD_ASSERT_OK(report);
    const bool warned = !report->warnings.empty() &&
                        report->warnings[0].find("already quantized") != std::string::npos;
    EXPECT_EQ(warned, src == DType::kQ8_0);
    auto out = GgufFile::Open(o.output);
    PD_ASSERT_OK(out);
    EXPECT_EQ((*out)->FindTensor("blk.1.ffn_up.weight")->type, DType::kQ4_K);
  }
}

// The column weights of an untied token_embd (calibration.h): the sum over the matrices that
// read the residual stream of g_j^2 ||W[:, j]||^2, recomputed here by hand from the F32 file;
// a model stored as F16 gives the same weights to F16 rounding; no reader of that width: empty.
TEST_F(QuantizeModelTest, ResidualImportanceSumsEveryReaderOfTheStream) {
  auto f32 = GgufFile::Open(KModel());
  PD_ASSERT_OK(f32);
  const GgufFile& f = **f32;
  const int64_t cols = 256;
  auto column_sq = [&](const std::string& name, int64_t j) {
    const GgufTensorInfo* t = f.FindTensor(name);
    const float* w = reinterpret_cast<const float*>(t->data);
    double s = 0;
    for (int64_t r = 0; r < t->rows(); ++r) s += double{w[r * cols + j]} * w[r * cols + j];
    return s;
  };
  auto norm = [&](const std::string& name, int64_t j) {
    return double{reinterpret_cast<const float*>(f.FindTensor(name)->data)[j]};
  };
  std::vector<double> want(cols, 0.0);
  for (int64_t j = 0; j < cols; ++j) {
    for (int layer = 0; f.FindTensor(pd::StrCat("blk.", layer, ".attn_norm.weight")); ++layer) {
      const std::string b = pd::StrCat("blk.", layer, ".");
      const double ga = norm(b + "attn_norm.weight", j), gf = norm(b + "ffn_norm.weight", j);
      want[j] += ga * ga *
                 (column_sq(b + "attn_q.weight", j) + column_sq(b + "attn_k.weight", j) +
                  column_sq(b + "attn_v.weight", j));
      want[j] += gf * gf * (column_sq(b + "ffn_gate.weight", j) + column_sq(b + "ffn_up.weight", j));
    }
    const double go = norm("output_norm.weight", j);
    want[j] += go * go * column_sq("output.weight", j);
  }
  double mean = 0;
  for (double v : want) mean += v / cols;
  const std::vector<float> got = ResidualImportance(f, cols, 2);
  ASSERT_EQ(got.size(), static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    EXPECT_NEAR(got[j], want[j] + 1e-2 * mean, 1e-5 * want[j]) << j;  // float sums of doubles
  }
  auto f16 = GgufFile::Open(KModel(DType::kF16));
  PD_ASSERT_OK(f16);
  const std::vector<float> half = ResidualImportance(**f16, cols, 1);
  ASSERT_EQ(half.size(), got.size());
  for (int64_t j = 0; j < cols; ++j) EXPECT_NEAR(half[j], got[j], 2e-3 * got[j]) << j;
  EXPECT_TRUE(ResidualImportance(f, 128, 1).empty());
}

TEST_F(QuantizeModelTest, RowsThatKQuantsCannotTakeFallBack) {
  t::TinyModelSpec s;  // n_embd 64, n_ff 96
  QuantizeOptions o;
  o.input = Write("small.gguf", t::TinyModel(s));
  o.output = dir_ + "/small_q.gguf";
  o.type = DType::kQ3_K;
  o.overrides = {"blk\\.1\\.ffn_up\\.weight=f16"};
  auto report = QuantizeModel(o, *progress_);
  PD_ASSERT_OK(report);
  for (const TensorReport& r : report->tensors) {
    if (r.shape.size() < 2) continue;
    SCOPED_TRACE(r.name);
    if (r.name == "blk.1.ffn_up.weight") {
      EXPECT_EQ(r.type, DType::kF16);
      EXPECT_EQ(r.method, "convert");
      EXPECT_NE(r.note.find("override"), std::string::npos);
      continue;
    }
    // Rows of 64 or 96: q3_K -> q4_0; its policy bumps q4_K -> q5_0, q6_K -> q8_0.
    EXPECT_TRUE(r.type == DType::kQ4_0 || r.type == DType::kQ5_0 || r.type == DType::kQ8_0)
        << Traits(r.type).name;
    EXPECT_NE(r.note.find("needs rows of 256"), std::string::npos) << r.note;
  }
  EXPECT_NE(FormatReport(*report).find("needs rows of 256"), std::string::npos);
}

TEST_F(QuantizeModelTest, ErrorsLeaveNoFile) {
  const std::string in = KModel();
  const std::string out = dir_ + "/err.gguf";
  auto run = [&](QuantizeOptions o) {
    if (o.input.empty()) o.input = in;
    if (o.output.empty()) o.output = out;
    return QuantizeModel(o, *progress_).status();
  };
  QuantizeOptions o;
  o.policy = "XL";
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kInvalidArgument, "unknown policy"));
  EXPECT_TRUE(NothingAt(out));
  o = {};
  o.overrides = {"no-equals-sign"};
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kInvalidArgument, "REGEX=TYPE"));
  o = {};
  o.type = DType::kF16;
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kInvalidArgument, "not a quantized type"));
  o = {};
  o.input = dir_ + "/missing.gguf";
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kNotFound, "cannot read input"));
  EXPECT_TRUE(NothingAt(out));
  o = {};
  o.input = Write("garbage.gguf", "this is not a GGUF file at all, not even close....");
  EXPECT_FALSE(run(o).ok());
  EXPECT_TRUE(NothingAt(out));
  o = {};
  o.output = dir_ + "/no/such/dir/out.gguf";
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kNotFound));
  // Calibration needs to run the model: an architecture the engine does not run, or no
  // tokenizer, is a clear error and the half-written file is removed.
  const std::string calib = Write("calib.txt", "Some calibration text. More of it.\n");
  o = {};
  o.input = KModel(DType::kF32, "mamba");
  o.method = Method::kGptq;
  o.calib_file = calib;
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kFailedPrecondition, "cannot run this model"));
  EXPECT_TRUE(NothingAt(out));
  o = {};
  o.method = Method::kImportance;
  o.calib_file = calib;
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kFailedPrecondition, "tokenizer"));
  EXPECT_TRUE(NothingAt(out));
  o = {};
  o.method = Method::kGptq;
  o.calib_file = dir_ + "/missing.txt";
  EXPECT_THAT(run(o), StatusIs(absl::StatusCode::kNotFound, "calibration text"));
  EXPECT_TRUE(NothingAt(out));
  // rtn never runs the model: the unknown architecture quantizes fine.
  o = {};
  o.input = KModel(DType::kF32, "mamba");
  PD_EXPECT_OK(run(o));
  EXPECT_THAT(ParseMethod("awq"), StatusIs(absl::StatusCode::kInvalidArgument, "rtn"));
}

TEST(ActivationCollectorTest, GroupsMatricesThatSeeTheSameInput) {
  std::vector<std::string> asked;
  ActivationCollector c(
      [&](std::string_view w, int64_t cols) {
        asked.emplace_back(w);
        return cols == 4;
      },
      1);
  std::vector<float> x1 = {1, 2, 3, 4, 5, 6, 7, 8}, x2 = {1, 0, 0, 1, 0, 1, 1, 0};
  for (int pass = 0; pass < 2; ++pass) {  // two "forward passes"
    c.Observe("blk.0.attn_q.weight", x1.data(), 2, 4);
    c.Observe("blk.0.attn_k.weight", x1.data(), 2, 4);
    c.Observe("blk.0.attn_v.weight", x1.data(), 2, 4);
    c.Observe("blk.0.attn_output.weight", x2.data(), 2, 4);
    c.Observe("blk.0.ffn_down.weight", x2.data(), 1, 8);
  }
  EXPECT_EQ(asked, (std::vector<std::string>{"blk.0.attn_q.weight", "blk.0.attn_output.weight",
                                             "blk.0.ffn_down.weight"}));
  EXPECT_EQ(c.LeaderOf("blk.0.attn_v.weight"), "blk.0.attn_q.weight");
  EXPECT_EQ(c.Find("blk.0.attn_k.weight"), c.Find("blk.0.attn_q.weight"));
  ASSERT_NE(c.Find("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(c.Find("blk.0.attn_q.weight")->samples(), 4);  // counted once per pass
  EXPECT_TRUE(c.Find("blk.0.attn_q.weight")->full());
  EXPECT_FALSE(c.Find("blk.0.ffn_down.weight")->full());
  EXPECT_EQ(c.Find("blk.0.attn_output.weight")->samples(), 4);
  EXPECT_EQ(c.Find("nothing"), nullptr);
  EXPECT_EQ(c.Leaders().size(), 3u);
}

}  // namespace
}  // namespace pd::engine::quantize

namespace pd::engine::quantize {
namespace {

std::string Capture(bool terminal) {
  std::FILE* f = std::tmpfile();
  auto p = MakeStreamProgress(f, terminal, /*interval_s=*/0);
  p->Start("stage", 10, "things");
  for (int i = 1; i <= 10; ++i) p->Update(i, "detail");
  p->Note("a note");
  p->Finish();
  std::rewind(f);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

TEST(ProgressTest, PlainLinesWhenNotATerminalBarOtherwise) {
  const std::string plain = Capture(false);
  EXPECT_EQ(plain.find('\r'), std::string::npos);
  EXPECT_NE(plain.find("stage:   0% (0/10 things"), std::string::npos) << plain;
  EXPECT_NE(plain.find("stage: 100% (10/10 things"), std::string::npos) << plain;
  EXPECT_NE(plain.find("a note\n"), std::string::npos);
  // 100% once, not again from Finish().
  EXPECT_EQ(plain.find("100%"), plain.rfind("100%")) << plain;
  const std::string bar = Capture(true);
  EXPECT_NE(bar.find("\r\033[K"), std::string::npos);
  EXPECT_NE(bar.find("[##############################] 100%"), std::string::npos) << bar;
}

}  // namespace
}  // namespace pd::engine::quantize
