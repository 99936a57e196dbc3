// Mixed-precision policies (engine/quant/quantize/policy.h): the built-in S/M/L files parse and
// give the tensors the issue names more bits; rules, conditions, overrides, fallbacks, errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/status_matchers.h"
#include "engine/quant/quantize/embedded.h"
#include "engine/quant/quantize/policy.h"

namespace pd::engine::quantize {
namespace {

using ::pd::testing::StatusIs;

TypeChoice Choose(const Policy& p, DType base, std::string_view name, int layer = -1,
                  int n_layers = 8, bool tied = false, const std::vector<TensorOverride>& ov = {}) {
  return ChooseType(p, base, ov, TensorPlace{name, layer, n_layers, tied});
}

TEST(PolicyTest, TypeNames) {
  EXPECT_EQ(*ParseTypeName("q4_K"), DType::kQ4_K);
  EXPECT_EQ(*ParseTypeName("Q4_K"), DType::kQ4_K);
  EXPECT_EQ(*ParseTypeName("q8_0"), DType::kQ8_0);
  EXPECT_THAT(ParseTypeName("q5_0"), StatusIs(absl::StatusCode::kInvalidArgument, "one of"));
  EXPECT_EQ(*ParseTypeName("q5_0", /*allow_float=*/true), DType::kQ5_0);  // overrides, rules
  EXPECT_THAT(ParseTypeName("f16"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(*ParseTypeName("f16", /*allow_float=*/true), DType::kF16);
  EXPECT_EQ(QuantTypes().size(), 9u);  // + pdserve's w4a16 and w8a8
  EXPECT_EQ(*ParseTypeName("w8a8"), DType::kW8A8);
  EXPECT_EQ(*ParseTypeName("W4A16"), DType::kW4A16);
  EXPECT_DOUBLE_EQ(BitsPerWeight(DType::kW4A16), 4.125);
  EXPECT_DOUBLE_EQ(BitsPerWeight(DType::kQ4_K), 4.5);
  EXPECT_DOUBLE_EQ(BitsPerWeight(DType::kQ6_K), 6.5625);
}

TEST(PolicyTest, BuiltInPoliciesGiveSensitiveTensorsMoreBits) {
  for (const char* name : {"S", "M", "L", "m"}) {
    auto p = Policy::Load(name);
    PD_ASSERT_OK(p);
    for (DType base : QuantTypes()) {
      SCOPED_TRACE(std::string(name) + " " + std::string(Traits(base).name));
      const double b = BitsPerWeight(base);
      EXPECT_TRUE(p->file_type.count(base));
      // Output head (and a tied embedding) never below the base; above it unless at the top.
      EXPECT_GE(BitsPerWeight(Choose(*p, base, "output.weight").type), b);
      EXPECT_GE(BitsPerWeight(Choose(*p, base, "token_embd.weight", -1, 8, true).type), b);
      if (base != DType::kQ8_0 && base != DType::kW8A8) {  // the tops of their ladders
        EXPECT_GT(BitsPerWeight(Choose(*p, base, "output.weight").type), b);
        EXPECT_GT(BitsPerWeight(Choose(*p, base, "blk.0.attn_v.weight", 0).type), b);
        EXPECT_GT(BitsPerWeight(Choose(*p, base, "blk.0.ffn_down.weight", 0).type), b);
      }
      EXPECT_EQ(Choose(*p, base, "blk.5.attn_q.weight", 5).type, base);
      EXPECT_EQ(Choose(*p, base, "blk.5.ffn_gate.weight", 5).type, base);
    }
  }
  // S < M < L in total extra bits on a typical layer stack.
  auto bits = [](const char* name) {
    auto p = Policy::Load(name);
    double total = 0;
    for (int l = 0; l < 16; ++l) {
      for (const char* t :
           {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
        total += BitsPerWeight(
            Choose(*p, DType::kQ4_K, "blk." + std::to_string(l) + "." + t + ".weight", l, 16).type);
      }
    }
    return total + BitsPerWeight(Choose(*p, DType::kQ4_K, "output.weight").type) +
           BitsPerWeight(Choose(*p, DType::kQ4_K, "token_embd.weight").type);
  };
  EXPECT_LT(bits("S"), bits("M"));
  EXPECT_LT(bits("M"), bits("L"));
}

TEST(PolicyTest, MediumPolicyDetails) {
  auto p = Policy::Load("M");
  PD_ASSERT_OK(p);
  EXPECT_EQ(p->name, "M");
  EXPECT_EQ(p->file_type.at(DType::kQ4_K), 15u);
  // output: two steps, at least q6_K.
  EXPECT_EQ(Choose(*p, DType::kQ2_K, "output.weight").type, DType::kQ6_K);
  EXPECT_EQ(Choose(*p, DType::kQ5_K, "output.weight").type, DType::kQ8_0);
  EXPECT_EQ(Choose(*p, DType::kQ4_0, "output.weight").type, DType::kQ8_0);
  EXPECT_EQ(Choose(*p, DType::kQ4_0, "blk.0.attn_v.weight", 0).type, DType::kQ5_0);
  // untied embedding: one step; tied: like the head.
  EXPECT_EQ(Choose(*p, DType::kQ3_K, "token_embd.weight").type, DType::kQ4_K);
  EXPECT_EQ(Choose(*p, DType::kQ3_K, "token_embd.weight", -1, 8, true).type, DType::kQ6_K);
  // ffn_down: first half of the layers only.
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.3.ffn_down.weight", 3, 8).type, DType::kQ5_K);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.4.ffn_down.weight", 4, 8).type, DType::kQ4_K);
  EXPECT_NE(Choose(*p, DType::kQ4_K, "blk.3.ffn_down.weight", 3, 8).why.find("policy M"),
            std::string::npos);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.4.ffn_down.weight", 4, 8).why, "");
  // q8_0 is the top of both ladders.
  EXPECT_EQ(Choose(*p, DType::kQ8_0, "blk.0.attn_v.weight", 0).type, DType::kQ8_0);
}

TEST(PolicyTest, OverridesComeFirstFirstMatchWins) {
  auto p = Policy::Load("M");
  PD_ASSERT_OK(p);
  std::vector<TensorOverride> ov;
  for (const char* spec : {"blk\\.[0-3]\\..*=q6_K", "blk\\.1\\.attn_q\\.weight=q2_K",
                           "output\\.weight=f16", "a=b=q8_0"}) {
    auto o = ParseOverride(spec);
    PD_ASSERT_OK(o);
    ov.push_back(*o);
  }
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.1.attn_q.weight", 1, 8, false, ov).type, DType::kQ6_K);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.3.ffn_up.weight", 3, 8, false, ov).type, DType::kQ6_K);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.4.ffn_up.weight", 4, 8, false, ov).type, DType::kQ4_K);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.10.attn_q.weight", 10, 16, false, ov).type,
            DType::kQ4_K);  // full match: "blk.1" does not match "blk.10"
  const TypeChoice out = Choose(*p, DType::kQ4_K, "output.weight", -1, 8, false, ov);
  EXPECT_EQ(out.type, DType::kF16);
  EXPECT_NE(out.why.find("override"), std::string::npos);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "a=b", -1, 8, false, ov).type, DType::kQ8_0);  // last '='

  EXPECT_THAT(ParseOverride("blk.*"), StatusIs(absl::StatusCode::kInvalidArgument, "REGEX=TYPE"));
  EXPECT_THAT(ParseOverride("blk.*="), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseOverride("=q4_K"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseOverride("blk.*=q9_K"), StatusIs(absl::StatusCode::kInvalidArgument, "q9_K"));
  EXPECT_THAT(ParseOverride("blk.(=q4_K"),
              StatusIs(absl::StatusCode::kInvalidArgument, "regular expression"));
}

TEST(PolicyTest, ParsesRulesAndRejectsMistakes) {
  const char* yaml = R"(
name: custom
description: test
file_type: {q4_K: 14}
rules:
  - match: 'blk\.\d+\.attn_(q|k)\.weight'
    layers: [0.5, 1]
    type: q8_0
  - match: '.*'
    tied_output: false
    bump: -1
)";
  auto p = Policy::Parse(yaml, "test");
  PD_ASSERT_OK(p);
  EXPECT_EQ(p->rules.size(), 2u);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.6.attn_k.weight", 6, 8).type, DType::kQ8_0);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.2.attn_k.weight", 2, 8).type, DType::kQ3_K);
  EXPECT_EQ(Choose(*p, DType::kQ4_K, "blk.2.attn_k.weight", 2, 8, true).type, DType::kQ4_K);
  EXPECT_EQ(Choose(*p, DType::kQ2_K, "x", -1, 8).type, DType::kQ2_K);  // bottom of the ladder

  const std::vector<std::pair<const char*, const char*>> bad = {
      {"name: x\nrules: [{match: 'a', bump: 1, type: q4_K}]", "excludes"},
      {"name: x\nrules: [{match: 'a'}]", "needs"},
      {"name: x\nrules: [{bump: 1}]", "no 'match'"},
      {"name: x\nrules: [{match: '(', bump: 1}]", "regular expression"},
      {"name: x\nrules: [{match: 'a', at_least: q7_K}]", "q7_K"},
      {"name: x\nrules: [{match: 'a', bump: 1, layers: [0.5, 0.2]}]", "layers"},
      {"name: x\nrules: [{match: 'a', bump: 1, colour: red}]", "unknown key"},
      {"name: x\nfile_type: {q4_K: 15}\nextra: 1", "unknown key"},
      {"rules: []", "missing 'name'"},
      {"name: x\nrules: {a: b}", "list"},
      {"[1, 2", ""},
      {"- a\n- b", "mapping"},
  };
  for (const auto& [text, what] : bad) {
    EXPECT_THAT(Policy::Parse(text, "bad"), StatusIs(absl::StatusCode::kInvalidArgument, what))
        << text;
  }
  EXPECT_THAT(Policy::Load("XL"), StatusIs(absl::StatusCode::kInvalidArgument, "unknown policy"));
}

TEST(PolicyTest, LoadsAPolicyFile) {
  const std::string path = ::testing::TempDir() + "/policy_test.yaml";
  {
    std::ofstream out(path);
    out << "name: file\nrules:\n  - match: 'output\\.weight'\n    type: q8_0\n";
  }
  auto p = Policy::Load(path);
  PD_ASSERT_OK(p);
  EXPECT_EQ(p->name, "file");
  EXPECT_EQ(p->source, path);
  EXPECT_EQ(Choose(*p, DType::kQ2_K, "output.weight").type, DType::kQ8_0);
  std::remove(path.c_str());
}

// Every policy file in the repository parses, and the compiled-in copies are current. (Tests run
// from the repository root.)
TEST(PolicyTest, EveryPolicyFileLoadsAndIsCompiledIn) {
  const std::filesystem::path dir = "engine/quant/policies";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << "run from the repository root";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    ++n;
    auto p = Policy::Load(e.path().string());
    PD_ASSERT_OK(p) << e.path();
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(EmbeddedPolicy(p->name), ss.str())
        << e.path() << " differs from the built-in " << p->name << ": reconfigure (cmake)";
    for (DType base : QuantTypes()) EXPECT_TRUE(p->file_type.count(base)) << e.path();
  }
  EXPECT_EQ(n, 3);
}

TEST(PolicyTest, RowFallbacks) {
  EXPECT_EQ(FallbackForRow(DType::kQ4_K, 512), DType::kQ4_K);
  EXPECT_EQ(FallbackForRow(DType::kQ2_K, 704), DType::kQ4_0);
  EXPECT_EQ(FallbackForRow(DType::kQ3_K, 704), DType::kQ4_0);
  EXPECT_EQ(FallbackForRow(DType::kQ4_K, 704), DType::kQ5_0);
  EXPECT_EQ(FallbackForRow(DType::kQ5_K, 704), DType::kQ5_0);
  EXPECT_EQ(FallbackForRow(DType::kQ6_K, 128), DType::kQ8_0);
  EXPECT_EQ(FallbackForRow(DType::kQ8_0, 96), DType::kQ8_0);
  EXPECT_EQ(FallbackForRow(DType::kQ6_K, 100), std::nullopt);
  EXPECT_EQ(FallbackForRow(DType::kQ4_0, 48), std::nullopt);
  EXPECT_EQ(FallbackForRow(DType::kF16, 7), DType::kF16);
}

}  // namespace
}  // namespace pd::engine::quantize
