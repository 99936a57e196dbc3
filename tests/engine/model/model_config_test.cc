#include "engine/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status_matchers.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/model/weights.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine {
namespace {

using ::pd::engine::testing::GgufBuilder;
using ::pd::engine::testing::kTypeF16;
using ::pd::engine::testing::kTypeF32;
using ::pd::engine::testing::kTypeQ8_0;
using ::pd::engine::testing::ParseBytes;
using ::pd::engine::testing::TensorSpec;
using ::pd::testing::StatusIs;

// A tiny model described as data so each test can change one thing.
//   n_embd 8, n_head 2, n_head_kv 1 (head_dim 4), n_ff 16, n_layer 2, n_vocab 10.
struct TinyModel {
  std::string arch = "llama";
  int64_t n_embd = 8, n_head = 2, n_head_kv = 1, n_ff = 16, n_layer = 2, n_vocab = 10;
  bool tokens = true;               // write tokenizer.ggml.tokens (n_vocab of them)
  bool qkv_bias = false;            // write attn_{q,k,v}.bias
  bool tied = false;                // leave output.weight out
  int64_t head_dim = 0;             // > 0: attention.key_length/value_length (else n_embd/n_head)
  bool qk_norm = false;             // write attn_{q,k}_norm.weight
  bool fused = false;               // attn_qkv.weight and a gate/up ffn_up.weight, as Phi-3
  uint32_t weight_type = kTypeF32;  // of the matmul weights
  // Experts (n_expert > 0): {arch}.expert_count / expert_used_count, and for expert_ff > 0
  // expert_feed_forward_length; ffn_gate_inp and stacked ffn_{gate,up,down}_exps in place of the
  // dense feed-forward (experts of expert_ff rows, else n_ff).
  int64_t n_expert = 0, n_expert_used = 0, expert_ff = 0;
  // Extra metadata, applied after the defaults (so tests can add keys).
  std::function<void(GgufBuilder&)> extra_kv;
  // Metadata keys (without the arch prefix) to leave out.
  std::vector<std::string> drop_keys;
  // Tensor overrides: name -> dims (empty dims = remove the tensor), and type overrides.
  std::map<std::string, std::vector<uint64_t>> dims;
  std::map<std::string, uint32_t> types;

  std::string Build() const {
    GgufBuilder b;
    b.Str("general.architecture", arch).Str("general.name", "tiny");
    auto u32 = [&](const std::string& k, uint32_t v) {
      for (const std::string& d : drop_keys) {
        if (d == k) return;
      }
      b.U32(arch + "." + k, v);
    };
    u32("embedding_length", n_embd);
    u32("block_count", n_layer);
    u32("attention.head_count", n_head);
    u32("attention.head_count_kv", n_head_kv);
    u32("feed_forward_length", n_ff);
    u32("context_length", 256);
    if (tokens) {
      std::vector<std::string> toks;
      for (int i = 0; i < n_vocab; ++i) toks.push_back(pd::StrCat("t", i));
      b.StrArray("tokenizer.ggml.tokens", toks);
    }
    if (head_dim > 0) {
      u32("attention.key_length", head_dim);
      u32("attention.value_length", head_dim);
    }
    if (n_expert > 0) {
      u32("expert_count", n_expert);
      u32("expert_used_count", n_expert_used);
      if (expert_ff > 0) u32("expert_feed_forward_length", expert_ff);
    }
    if (extra_kv) extra_kv(b);

    const uint64_t e = n_embd, hd = head_dim > 0 ? head_dim : n_embd / n_head, q = n_head * hd,
                   kv = n_head_kv * hd;
    std::vector<std::pair<std::string, std::vector<uint64_t>>> ts = {
        {"token_embd.weight", {e, uint64_t(n_vocab)}}, {"output_norm.weight", {e}}};
    if (!tied) ts.push_back({"output.weight", {e, uint64_t(n_vocab)}});
    for (int i = 0; i < n_layer; ++i) {
      const std::string p = pd::StrCat("blk.", i, ".");
      ts.push_back({p + "attn_norm.weight", {e}});
      if (fused) {
        ts.push_back({p + "attn_qkv.weight", {e, q + 2 * kv}});
      } else {
        ts.push_back({p + "attn_q.weight", {e, q}});
        ts.push_back({p + "attn_k.weight", {e, kv}});
        ts.push_back({p + "attn_v.weight", {e, kv}});
      }
      if (qk_norm) {
        ts.push_back({p + "attn_q_norm.weight", {hd}});
        ts.push_back({p + "attn_k_norm.weight", {hd}});
      }
      ts.push_back({p + "attn_output.weight", {q, e}});
      if (qkv_bias) {
        ts.push_back({p + "attn_q.bias", {q}});
        ts.push_back({p + "attn_k.bias", {kv}});
        ts.push_back({p + "attn_v.bias", {kv}});
      }
      ts.push_back({p + "ffn_norm.weight", {e}});
      if (n_expert > 0) {
        const uint64_t ne = n_expert, fe = expert_ff > 0 ? expert_ff : n_ff;
        ts.push_back({p + "ffn_gate_inp.weight", {e, ne}});
        ts.push_back({p + "ffn_gate_exps.weight", {e, fe, ne}});
        ts.push_back({p + "ffn_up_exps.weight", {e, fe, ne}});
        ts.push_back({p + "ffn_down_exps.weight", {fe, e, ne}});
        continue;
      }
      if (fused) {
        ts.push_back({p + "ffn_up.weight", {e, 2 * uint64_t(n_ff)}});
      } else {
        ts.push_back({p + "ffn_gate.weight", {e, uint64_t(n_ff)}});
        ts.push_back({p + "ffn_up.weight", {e, uint64_t(n_ff)}});
      }
      ts.push_back({p + "ffn_down.weight", {uint64_t(n_ff), e}});
    }
    for (const auto& [name, d] : dims) {  // additions not in the default list
      bool found = false;
      for (const auto& t : ts) found |= t.first == name;
      if (!found) ts.push_back({name, d});
    }
    for (auto& [name, d] : ts) {
      if (auto it = dims.find(name); it != dims.end()) {
        if (it->second.empty()) continue;
        d = it->second;
      }
      uint32_t type = kTypeF32;
      if (d.size() >= 2 && name != "token_embd.weight") type = weight_type;
      if (auto it = types.find(name); it != types.end()) type = it->second;
      b.Tensor(name, d, type);
    }
    return b.Build();
  }
};

// Parses `bytes` (kept alive by the caller) and reads its config.
absl::StatusOr<ModelConfig> Config(const std::string& bytes) {
  auto f = ParseBytes(bytes);
  if (!f.ok()) return f.status();
  return ModelConfig::FromGguf(**f);
}

// ------------------------------------------------------------------------------------------------
// ModelConfig::FromGguf
// ------------------------------------------------------------------------------------------------

TEST(ModelConfigTest, LlamaWithGqaRopeAndLinearScaling) {
  TinyModel m;
  m.n_embd = 64;
  m.n_head = 8;
  m.n_head_kv = 2;
  m.extra_kv = [](GgufBuilder& b) {
    b.F32("llama.attention.layer_norm_rms_epsilon", 1e-6f)
        .F32("llama.rope.freq_base", 500000.f)
        .U32("llama.rope.dimension_count", 6)
        .Str("llama.rope.scaling.type", "linear")
        .F32("llama.rope.scaling.factor", 4.f);
  };
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->arch, "llama");
  EXPECT_EQ(c->name, "tiny");
  EXPECT_EQ(c->n_embd, 64);
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->n_head, 8);
  EXPECT_EQ(c->n_head_kv, 2);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->n_ff, 16);
  EXPECT_EQ(c->n_ctx_train, 256);
  EXPECT_EQ(c->n_vocab, 10);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-6f);
  EXPECT_EQ(c->rope_mode, RopeMode::kNormal);
  EXPECT_EQ(c->rope_dim, 6);
  EXPECT_FLOAT_EQ(c->rope_freq_base, 500000.f);
  EXPECT_FLOAT_EQ(c->rope_freq_scale, 0.25f);
  EXPECT_FALSE(c->tied_output);
  EXPECT_FALSE(c->qkv_bias);
}

TEST(ModelConfigTest, DefaultsWhenOptionalKeysAreAbsent) {
  TinyModel m;
  m.drop_keys = {"attention.head_count_kv"};
  m.tokens = false;  // vocabulary size then comes from token_embd
  m.n_vocab = 12;
  m.n_head_kv = 2;  // keeps the builder's k/v shapes equal to q for MHA
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->n_head_kv, c->n_head);
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_EQ(c->rope_dim, 4);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_freq_base, 10000.f);
  EXPECT_FLOAT_EQ(c->rope_freq_scale, 1.f);
  EXPECT_EQ(c->n_vocab, 12);
}

TEST(ModelConfigTest, Qwen2NeoxRopeBiasAndTiedOutput) {
  TinyModel m;
  m.arch = "qwen2";
  m.qkv_bias = true;
  m.tied = true;
  m.extra_kv = [](GgufBuilder& b) {
    b.F32("qwen2.rope.freq_base", 1000000.f).F32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  };
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->arch, "qwen2");
  EXPECT_EQ(c->rope_mode, RopeMode::kNeox);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->tied_output);
  EXPECT_EQ(c->n_head_kv, 1);
  EXPECT_FLOAT_EQ(c->rope_freq_base, 1e6f);
}

TEST(ModelConfigTest, Gemma2SoftCapsAndAlternatingWindows) {
  TinyModel m;
  m.arch = "gemma2";
  m.tied = true;
  const std::string defaults = m.Build();
  auto c = Config(defaults);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->rope_mode, RopeMode::kNeox);
  EXPECT_FLOAT_EQ(c->attn_softcap, 50.f);  // llama.cpp's defaults without the keys
  EXPECT_FLOAT_EQ(c->final_softcap, 30.f);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_TRUE(c->IsSlidingLayer(0));
  EXPECT_FALSE(c->IsSlidingLayer(1));
  EXPECT_FLOAT_EQ(c->rope_freq_base_swa, c->rope_freq_base);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->post_norms);
  EXPECT_FLOAT_EQ(c->attention_scale, 1.f / std::sqrt(static_cast<float>(c->head_dim)));

  m.extra_kv = [](GgufBuilder& b) {
    b.F32("gemma2.attn_logit_softcapping", 20.f)
        .F32("gemma2.final_logit_softcapping", 10.f)
        .U32("gemma2.attention.sliding_window", 8);
  };
  const std::string set = m.Build();
  c = Config(set);
  PD_ASSERT_OK(c);
  EXPECT_FLOAT_EQ(c->attn_softcap, 20.f);
  EXPECT_FLOAT_EQ(c->final_softcap, 10.f);
  EXPECT_EQ(c->sliding_window, 8);

  m.extra_kv = [](GgufBuilder& b) { b.F32("gemma2.final_logit_softcapping", -1.f); };
  const std::string bad = m.Build();
  EXPECT_THAT(Config(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "final_logit_softcapping = -1 must be > 0"));
}

TEST(ModelConfigTest, LegacyLinearScaleKey) {
  TinyModel m;
  m.extra_kv = [](GgufBuilder& b) { b.F32("llama.rope.scale_linear", 2.f); };
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_FLOAT_EQ(c->rope_freq_scale, 0.5f);
}

TEST(ModelConfigTest, ExplicitKeyLength) {
  TinyModel m;
  m.extra_kv = [](GgufBuilder& b) {
    b.U32("llama.attention.key_length", 16).U32("llama.attention.value_length", 16);
  };
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rope_dim, 16);

  m.extra_kv = [](GgufBuilder& b) {
    b.U32("llama.attention.key_length", 16).U32("llama.attention.value_length", 8);
  };
  const std::string bad = m.Build();
  EXPECT_THAT(Config(bad),
              StatusIs(absl::StatusCode::kUnimplemented, "key_length 16 != value_length 8"));
}

TEST(ModelConfigTest, MissingKeys) {
  for (const char* key : {"embedding_length", "block_count", "attention.head_count",
                          "feed_forward_length", "context_length"}) {
    SCOPED_TRACE(key);
    TinyModel m;
    m.drop_keys = {key};
    const std::string bytes = m.Build();
    EXPECT_THAT(Config(bytes), StatusIs(absl::StatusCode::kNotFound,
                                        pd::StrCat("GGUF key 'llama.", key, "' is missing")));
  }
  const std::string no_arch = GgufBuilder().U32("llama.block_count", 1).Build();
  EXPECT_THAT(Config(no_arch),
              StatusIs(absl::StatusCode::kNotFound, "'general.architecture' is missing"));
  TinyModel m;
  m.dims["token_embd.weight"] = {};
  const std::string no_embd = m.Build();
  EXPECT_THAT(Config(no_embd), StatusIs(absl::StatusCode::kInvalidArgument,
                                        "tensor 'token_embd.weight' is missing"));
}

TEST(ModelConfigTest, HeadCountNotAMultipleOfKvHeads) {
  TinyModel m;
  m.n_embd = 48;
  m.n_head = 6;
  m.n_head_kv = 4;
  const std::string bytes = m.Build();
  EXPECT_THAT(Config(bytes), StatusIs(absl::StatusCode::kInvalidArgument,
                                      "head_count 6 is not a multiple of head_count_kv 4"));
}

TEST(ModelConfigTest, UnsupportedArchitecture) {
  TinyModel m;
  m.arch = "gpt2";
  const std::string bytes = m.Build();
  EXPECT_THAT(Config(bytes),
              StatusIs(absl::StatusCode::kUnimplemented, "architecture 'gpt2' is not supported"));
  const std::string wrong_type = GgufBuilder().U32("general.architecture", 1).Build();
  EXPECT_THAT(Config(wrong_type), StatusIs(absl::StatusCode::kInvalidArgument, "expected string"));
}

TEST(ModelConfigTest, YarnScalingIsUnimplemented) {
  TinyModel m;
  m.extra_kv = [](GgufBuilder& b) {
    b.Str("llama.rope.scaling.type", "yarn").F32("llama.rope.scaling.factor", 4.f);
  };
  const std::string bytes = m.Build();
  EXPECT_THAT(Config(bytes), StatusIs(absl::StatusCode::kUnimplemented,
                                      "rope scaling type 'yarn' is not supported"));
}

TEST(ModelConfigTest, OutOfRangeValues) {
  struct Case {
    std::function<void(GgufBuilder&)> kv;
    std::vector<std::string> drop;
    const char* message;
  };
  const Case cases[] = {
      {[](GgufBuilder& b) { b.U32("llama.block_count", 0); },
       {"block_count"},
       "'llama.block_count' = 0 is out of range"},
      {[](GgufBuilder& b) { b.I32("llama.block_count", -2); },
       {"block_count"},
       "'llama.block_count' is -2, expected a non-negative value"},
      {[](GgufBuilder& b) { b.F32("llama.block_count", 2.f); },
       {"block_count"},
       "has type float32, expected an integer"},
      {[](GgufBuilder& b) { b.U32("llama.embedding_length", 9); },
       {"embedding_length"},
       "embedding_length 9 is not a multiple of head_count 2"},
      {[](GgufBuilder& b) { b.U32("llama.attention.key_length", 3); },
       {},
       "head dimension 3 is odd"},
      {[](GgufBuilder& b) { b.F32("llama.attention.layer_norm_rms_epsilon", 0.f); },
       {},
       "layer_norm_rms_epsilon 0 is not in (0, 1)"},
      {[](GgufBuilder& b) { b.U32("llama.rope.dimension_count", 6); },
       {},
       "rope.dimension_count 6 must be even and at most the head dimension 4"},
      {[](GgufBuilder& b) { b.U32("llama.rope.dimension_count", 3); },
       {},
       "rope.dimension_count 3"},
      {[](GgufBuilder& b) { b.F32("llama.rope.freq_base", 1.f); },
       {},
       "rope.freq_base 1 must be > 1"},
      {[](GgufBuilder& b) { b.Str("llama.rope.scaling.type", "linear"); },
       {},
       "rope scaling factor 0 must be > 0"},
      {[](GgufBuilder& b) { b.U32("llama.rope.scaling.type", 1); },
       {},
       "'llama.rope.scaling.type' has type uint32, expected string"},
      {[](GgufBuilder& b) { b.StrArray("tokenizer.ggml.tokens", {"a"}); },
       {},
       "'tokenizer.ggml.tokens' appears twice"},  // a parse error, for completeness
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    TinyModel m;
    m.extra_kv = c.kv;
    m.drop_keys = c.drop;
    const std::string bytes = m.Build();
    auto config = Config(bytes);
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(), ::testing::HasSubstr(c.message));
  }
}

TEST(ModelConfigTest, HugeUnsignedValuesAreOutOfRangeNotNegative) {
  // Values with the top bit set once passed the range check as negative int64s and became
  // 0 or negative ints (then divided by: SIGFPE). They must be refused.
  for (uint64_t v : {uint64_t{1} << 63, (uint64_t{1} << 63) | (uint64_t{1} << 31), ~uint64_t{0}}) {
    SCOPED_TRACE(v);
    for (const char* key :
         {"embedding_length", "attention.head_count", "attention.head_count_kv", "block_count"}) {
      SCOPED_TRACE(key);
      TinyModel m;
      m.drop_keys = {key};
      m.extra_kv = [&](GgufBuilder& b) { b.U64(pd::StrCat("llama.", key), v); };
      const std::string bytes = m.Build();
      EXPECT_THAT(Config(bytes),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           pd::StrCat("'llama.", key, "' = ", v, " is out of range")));
    }
  }
}

TEST(ModelConfigTest, Qwen3QkNormNeoxAndItsOwnHeadSize) {
  TinyModel m;
  m.arch = "qwen3";
  m.head_dim = 8;  // n_embd / n_head = 4
  m.qk_norm = true;
  m.tied = true;
  m.extra_kv = [](GgufBuilder& b) {
    b.F32("qwen3.rope.freq_base", 1000000.f).F32("qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
  };
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->arch, "qwen3");
  EXPECT_EQ(c->rope_mode, RopeMode::kNeox);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->post_norms);
  EXPECT_EQ(c->ffn_act, FfnActivation::kSilu);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->rope_dim, 8);
  EXPECT_EQ(c->n_head_kv, 1);
  EXPECT_FLOAT_EQ(c->attention_scale, 0.f);  // 1/sqrt(head_dim) on the Q.K logits
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FALSE(c->IsSlidingLayer(0));
  EXPECT_FLOAT_EQ(c->rope_freq_base, 1e6f);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-6f);
}

TEST(ModelConfigTest, Phi3QueryScaleAndAWindowOnEveryLayer) {
  TinyModel m;
  m.arch = "phi3";
  m.n_head_kv = 2;
  m.fused = true;
  m.extra_kv = [](GgufBuilder& b) {
    b.U32("phi3.attention.sliding_window", 2047)
        .F32("phi3.rope.freq_base", 20000.f)
        .U32("phi3.rope.scaling.original_context_length", 4096);
  };
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->arch, "phi3");
  EXPECT_EQ(c->rope_mode, RopeMode::kNeox);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->ffn_act, FfnActivation::kSilu);
  EXPECT_FLOAT_EQ(c->attention_scale, 0.5f);  // 1/sqrt(4), on Q as llama.cpp does
  EXPECT_EQ(c->sliding_window, 2047);
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(c->IsSlidingLayer(l)) << l;
  EXPECT_FLOAT_EQ(c->rope_freq_base_swa, 20000.f);
  EXPECT_FLOAT_EQ(c->rope_freq_scale_swa, 1.f);

  // Phi-4 files (also phi3) say 0: no window.
  m.extra_kv = [](GgufBuilder& b) { b.U32("phi3.attention.sliding_window", 0); };
  const std::string phi4 = m.Build();
  auto c4 = Config(phi4);
  PD_ASSERT_OK(c4);
  EXPECT_EQ(c4->sliding_window, 0);
  EXPECT_FALSE(c4->IsSlidingLayer(0));
}

TEST(ModelConfigTest, Phi3LongRopeAndExpertsAreRefused) {
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    SCOPED_TRACE(t);
    TinyModel m;
    m.arch = "phi3";
    m.fused = true;
    m.dims[t] = {2};
    const std::string bytes = m.Build();
    EXPECT_THAT(Config(bytes), StatusIs(absl::StatusCode::kUnimplemented,
                                        pd::StrCat("phi3 with LongRoPE (tensor '", t, "'")));
  }
  TinyModel moe;
  moe.arch = "phi3";
  moe.fused = true;
  moe.dims["blk.0.ffn_gate_inp.weight"] = {8, 4};
  const std::string bytes = moe.Build();
  EXPECT_THAT(Config(bytes),
              StatusIs(absl::StatusCode::kUnimplemented, "phi3 with a mixture of experts"));
  TinyModel big;
  big.arch = "phi3";
  big.fused = true;
  big.extra_kv = [](GgufBuilder& b) { b.U64("phi3.attention.sliding_window", uint64_t{1} << 40); };
  const std::string window = big.Build();
  EXPECT_THAT(Config(window), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "phi3.attention.sliding_window = 1099511627776 is out of "
                                       "range"));
}

TEST(ModelConfigTest, Qwen3MoeExpertsAndTheirSize) {
  TinyModel m;
  m.arch = "qwen3moe";
  m.qk_norm = true;
  m.n_expert = 4;
  m.n_expert_used = 2;
  m.expert_ff = 8;
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->arch, "qwen3moe");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->rope_mode, RopeMode::kNeox);
  EXPECT_EQ(c->n_expert, 4);
  EXPECT_EQ(c->n_expert_used, 2);
  EXPECT_EQ(c->n_ff_exp, 8);
  EXPECT_EQ(c->n_ff, 16);  // the dense size the file states

  // Without expert_feed_forward_length: n_ff / n_expert_used, as llama.cpp.
  TinyModel implicit = m;
  implicit.expert_ff = 0;
  const std::string b2 = implicit.Build();
  auto c2 = Config(b2);
  PD_ASSERT_OK(c2);
  EXPECT_EQ(c2->n_ff_exp, 8);

  // Mixtral: llama with experts of n_ff rows.
  TinyModel mixtral;
  mixtral.n_expert = 8;
  mixtral.n_expert_used = 2;
  const std::string b3 = mixtral.Build();
  auto c3 = Config(b3);
  PD_ASSERT_OK(c3);
  EXPECT_EQ(c3->n_expert, 8);
  EXPECT_EQ(c3->n_ff_exp, 16);
  EXPECT_EQ(c3->rope_mode, RopeMode::kNormal);
  TinyModel dense;
  const std::string b4 = dense.Build();
  auto c4 = Config(b4);
  PD_ASSERT_OK(c4);
  EXPECT_EQ(c4->n_expert, 0);
}

TEST(ModelConfigTest, BadExpertConfigsAreRefused) {
  struct Case {
    std::function<void(TinyModel&)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](TinyModel& m) { m.drop_keys = {"expert_count"}; }, absl::StatusCode::kNotFound,
       "qwen3moe.expert_count"},
      {[](TinyModel& m) { m.n_expert_used = 5; }, absl::StatusCode::kInvalidArgument,
       "'qwen3moe.expert_used_count' = 5 is out of range (1..4)"},
      {[](TinyModel& m) { m.n_expert_used = 0; }, absl::StatusCode::kInvalidArgument,
       "'qwen3moe.expert_used_count' = 0 is out of range"},
      {[](TinyModel& m) {
         m.extra_kv = [](GgufBuilder& b) { b.U32("qwen3moe.expert_group_count", 2); };
       },
       absl::StatusCode::kUnimplemented, "group-limited expert routing is not supported"},
      {[](TinyModel& m) { m.dims["blk.0.ffn_gate_shexp.weight"] = {8, 16}; },
       absl::StatusCode::kUnimplemented, "shared experts (tensor 'blk.0.ffn_gate_shexp.weight')"},
      {[](TinyModel& m) {
         m.expert_ff = 0;
         m.n_ff = 1;
       },
       absl::StatusCode::kInvalidArgument,
       "feed_forward_length 1 is smaller than expert_used_count 2"},
      {[](TinyModel& m) {
         m.arch = "qwen2";
         m.qk_norm = false;
       },
       absl::StatusCode::kUnimplemented, "qwen2 with a mixture of experts is not supported"},
      {[](TinyModel& m) {
         m.arch = "llama";
         m.qk_norm = false;
         m.drop_keys = {"expert_count"};
       },
       absl::StatusCode::kInvalidArgument,
       "tensor 'blk.0.ffn_gate_inp.weight' (an expert router) without 'llama.expert_count'"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    TinyModel m;
    m.arch = "qwen3moe";
    m.qk_norm = true;
    m.n_expert = 4;
    m.n_expert_used = 2;
    m.expert_ff = 8;
    cases[i].edit(m);
    const std::string bytes = m.Build();
    EXPECT_THAT(Config(bytes), StatusIs(cases[i].code, cases[i].message));
  }
}

// Mistral's window, as hf_convert writes it (llama.attention.sliding_window): every layer slides,
// with the model's own rope (base and linear scale); without the key no layer does.
TEST(ModelConfigTest, MistralWindowOnEveryLlamaLayer) {
  TinyModel m;
  m.extra_kv = [](GgufBuilder& b) {
    b.U32("llama.attention.sliding_window", 16)
        .F32("llama.rope.freq_base", 1e6f)
        .Str("llama.rope.scaling.type", "linear")
        .F32("llama.rope.scaling.factor", 2.f);
  };
  const std::string bytes = m.Build();
  auto c = Config(bytes);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->rope_mode, RopeMode::kNormal);
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(c->swa_pattern, 0);
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(c->IsSlidingLayer(l)) << l;
  EXPECT_FLOAT_EQ(c->rope_freq_base_swa, 1e6f);
  EXPECT_FLOAT_EQ(c->rope_freq_scale_swa, 0.5f);
  EXPECT_EQ(c->attention_scale, 0.f);  // Llama's scale on Q.K, unchanged

  const std::string plain = TinyModel{}.Build();
  auto full = Config(plain);
  PD_ASSERT_OK(full);
  EXPECT_EQ(full->sliding_window, 0);
  EXPECT_FALSE(full->IsSlidingLayer(0));

  TinyModel big;
  big.extra_kv = [](GgufBuilder& b) { b.U64("llama.attention.sliding_window", uint64_t{1} << 40); };
  const std::string window = big.Build();
  EXPECT_THAT(Config(window), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "llama.attention.sliding_window = 1099511627776 is out of "
                                       "range"));
}

// A draft model's restricted head (pdserve.draft.head_tokens): read when consistent, refused with
// INVALID_ARGUMENT naming the problem otherwise.
TEST(ModelConfigTest, DraftHeadTokens) {
  auto draft = [](std::vector<int32_t> ids, int64_t rows, bool with_output = true) {
    TinyModel m;
    m.extra_kv = [ids](GgufBuilder& b) {
      b.Array("pdserve.draft.head_tokens", GgufValueType::kInt32, ids);
    };
    if (with_output) {
      m.dims["output.weight"] = {8, uint64_t(rows)};
    } else {
      m.dims["output.weight"] = {};
    }
    return m.Build();
  };
  const std::string ok = draft({7, 0, 3}, 3);
  auto c = Config(ok);
  PD_ASSERT_OK(c);
  EXPECT_EQ(c->head_tokens, std::vector<int32_t>({7, 0, 3}));
  EXPECT_FALSE(c->tied_output);
  EXPECT_EQ(c->n_vocab, 10);

  const std::string plain = TinyModel().Build();
  auto p = Config(plain);
  PD_ASSERT_OK(p);
  EXPECT_TRUE(p->head_tokens.empty());

  struct Bad {
    std::string bytes, message;
  };
  const std::vector<Bad> bad = {
      {draft({1, 10}, 2), "'pdserve.draft.head_tokens'[1] = 10 is outside the vocabulary of 10"},
      {draft({1, -1}, 2), "'pdserve.draft.head_tokens'[1] = -1 is outside the vocabulary"},
      {draft({4, 2, 4}, 3), "'pdserve.draft.head_tokens'[2]: token 4 appears twice"},
      {draft({1, 2}, 3), "lists 2 tokens but output.weight has 3 rows"},
      {draft({1, 2}, 2, false), "is set but tensor 'output.weight' is missing"},
      {draft({}, 1), "'pdserve.draft.head_tokens' is empty"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.message);
    EXPECT_THAT(Config(b.bytes), StatusIs(absl::StatusCode::kInvalidArgument, b.message));
  }
}

// ------------------------------------------------------------------------------------------------
// Weights::Load
// ------------------------------------------------------------------------------------------------

class WeightsTest : public ::testing::Test {
 protected:
  // Parses and configures `m`, then loads its weights on the CPU backend.
  absl::StatusOr<std::unique_ptr<Weights>> Load(const TinyModel& m) {
    bytes_ = m.Build();
    auto f = ParseBytes(bytes_);
    if (!f.ok()) return f.status();
    file_ = std::move(*f);
    auto c = ModelConfig::FromGguf(*file_);
    if (!c.ok()) return c.status();
    config_ = *c;
    return Weights::Load(*file_, config_, *backend_);
  }

  // Views of the file's bytes (PDSERVE_CPU_WEIGHTS=mmap), so that the tests can say which bytes
  // each tensor is; CopiesHoldTheFileBytes loads with the default copies.
  std::unique_ptr<Backend> backend_ =
      CreateCpuBackend(CpuBackendOptions{.threads = 1, .copy_weights = false});
  std::string bytes_;
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
};

TEST_F(WeightsTest, LoadsEveryTensorWithoutCopying) {
  TinyModel m;
  m.dims["rope_freqs.weight"] = {2};
  auto w = Load(m);
  PD_ASSERT_OK(w);
  ASSERT_EQ((*w)->layers.size(), 2u);
  const Weights& ws = **w;
  EXPECT_EQ(ws.token_embd.cols, 8);
  EXPECT_EQ(ws.token_embd.rows, 10);
  EXPECT_EQ(ws.token_embd.data, file_->FindTensor("token_embd.weight")->data);
  EXPECT_EQ(ws.output.data, file_->FindTensor("output.weight")->data);
  EXPECT_EQ(ws.output_norm.rows, 1);
  const LayerWeights& l1 = ws.layers[1];
  EXPECT_EQ(l1.wk.cols, 8);
  EXPECT_EQ(l1.wk.rows, 4);
  EXPECT_EQ(l1.wo.cols, 8);
  EXPECT_EQ(l1.wo.rows, 8);
  EXPECT_EQ(l1.w_down.cols, 16);
  EXPECT_EQ(l1.w_down.rows, 8);
  EXPECT_EQ(l1.w_up.data, file_->FindTensor("blk.1.ffn_up.weight")->data);
  EXPECT_EQ(l1.bq.data, nullptr);  // no biases in a llama file
  // rope_freqs: the two floats of the file, copied to the host (compared as bytes: the
  // builder's pattern need not be a number).
  ASSERT_EQ(ws.rope_freq_factors.size(), 2u);
  EXPECT_EQ(std::memcmp(ws.rope_freq_factors.data(), file_->FindTensor("rope_freqs.weight")->data,
                        2 * sizeof(float)),
            0);
  // Every tensor but rope_freqs counts.
  size_t sum = 0;
  for (const GgufTensorInfo& t : file_->tensors()) {
    if (t.name != "rope_freqs.weight") sum += t.nbytes;
  }
  EXPECT_EQ(ws.total_bytes, sum);
}

// With the CPU backend's default copies every tensor holds the file's bytes at its own address
// (64-byte aligned), and a tied output shares the embedding's copy.
TEST_F(WeightsTest, CopiesHoldTheFileBytes) {
  backend_ = CreateCpuBackend(CpuBackendOptions{.threads = 1});
  TinyModel m;
  m.arch = "qwen2";
  m.tied = true;
  m.qkv_bias = true;
  auto w = Load(m);
  PD_ASSERT_OK(w);
  const Weights& ws = **w;
  auto same_bytes = [&](const Tensor& t, const std::string& name) {
    const GgufTensorInfo* info = file_->FindTensor(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_NE(static_cast<const void*>(t.data), static_cast<const void*>(info->data)) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u) << name;
    ASSERT_EQ(t.bytes(), info->nbytes) << name;
    EXPECT_EQ(std::memcmp(t.data, info->data, info->nbytes), 0) << name;
  };
  same_bytes(ws.token_embd, "token_embd.weight");
  EXPECT_EQ(ws.output.data, ws.token_embd.data);
  same_bytes(ws.layers[1].wq, "blk.1.attn_q.weight");
  same_bytes(ws.layers[0].bk, "blk.0.attn_k.bias");
  same_bytes(ws.layers[1].w_down, "blk.1.ffn_down.weight");
}

TEST_F(WeightsTest, TiedOutputAndBiases) {
  TinyModel m;
  m.arch = "qwen2";
  m.tied = true;
  m.qkv_bias = true;
  auto w = Load(m);
  PD_ASSERT_OK(w);
  EXPECT_EQ((*w)->output.data, (*w)->token_embd.data);
  EXPECT_EQ((*w)->layers[0].bq.data, file_->FindTensor("blk.0.attn_q.bias")->data);
  EXPECT_EQ((*w)->layers[0].bk.cols, 4);
  EXPECT_EQ((*w)->layers[1].bv.data, file_->FindTensor("blk.1.attn_v.bias")->data);
}

TEST_F(WeightsTest, QuantizedMatmulWeights) {
  TinyModel m;
  m.n_embd = 64;
  m.n_head = 2;
  m.n_ff = 32;
  m.weight_type = kTypeQ8_0;
  auto w = Load(m);
  PD_ASSERT_OK(w);
  EXPECT_EQ((*w)->layers[0].wq.type, DType::kQ8_0);
  EXPECT_EQ((*w)->layers[0].wq.bytes(), file_->FindTensor("blk.0.attn_q.weight")->nbytes);
}

TEST_F(WeightsTest, ShapeMismatchNamesTheTensor) {
  TinyModel m;
  m.dims["blk.1.attn_k.weight"] = {8, 8};  // an MHA-sized K in a GQA model
  EXPECT_THAT(Load(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                "tensor 'blk.1.attn_k.weight' has shape [8, 8], expected [8, 4] "
                                "for this architecture"));
}

TEST_F(WeightsTest, TransposedWeightIsRejected) {
  TinyModel m;
  m.dims["blk.0.ffn_down.weight"] = {8, 16};
  EXPECT_THAT(Load(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                "'blk.0.ffn_down.weight' has shape [8, 16], expected [16, 8]"));
}

TEST_F(WeightsTest, DraftHeadHasOneRowPerHeadToken) {
  TinyModel m;
  m.extra_kv = [](GgufBuilder& b) {
    b.Array("pdserve.draft.head_tokens", GgufValueType::kInt32, std::vector<int32_t>{9, 2, 5, 0});
  };
  m.dims["output.weight"] = {8, 4};
  auto w = Load(m);
  PD_ASSERT_OK(w);
  EXPECT_EQ((*w)->output.rows, 4);
  EXPECT_EQ((*w)->token_embd.rows, 10);
}

TEST_F(WeightsTest, VocabularyMismatch) {
  TinyModel m;
  m.dims["token_embd.weight"] = {8, 12};  // 10 tokens in the tokenizer
  EXPECT_THAT(Load(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                "tensor 'token_embd.weight' has shape [8, 12], expected [8, 10]"));
}

TEST_F(WeightsTest, ExtraDimensionIsRejected) {
  TinyModel m;
  m.dims["output_norm.weight"] = {8, 1};
  EXPECT_THAT(Load(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                "'output_norm.weight' has shape [8, 1], expected [8]"));
}

TEST_F(WeightsTest, MissingTensor) {
  TinyModel m;
  m.dims["blk.1.ffn_up.weight"] = {};
  EXPECT_THAT(Load(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                "tensor 'blk.1.ffn_up.weight' is missing"));
  TinyModel q;
  q.arch = "qwen2";
  q.qkv_bias = true;
  q.dims["blk.0.attn_k.bias"] = {};
  EXPECT_THAT(Load(q), StatusIs(absl::StatusCode::kInvalidArgument,
                                "tensor 'blk.0.attn_k.bias' is missing"));
}

TEST_F(WeightsTest, NormsMustBeF32) {
  TinyModel m;
  m.types["blk.0.attn_norm.weight"] = kTypeF16;
  EXPECT_THAT(Load(m), StatusIs(absl::StatusCode::kInvalidArgument,
                                "tensor 'blk.0.attn_norm.weight' has type f16, expected f32"));
}

TEST_F(WeightsTest, BadRopeFreqs) {
  TinyModel m;
  m.dims["rope_freqs.weight"] = {3};
  EXPECT_THAT(Load(m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'rope_freqs.weight' has shape [3] and type f32, expected [2] f32"));
  TinyModel h;
  h.dims["rope_freqs.weight"] = {2};
  h.types["rope_freqs.weight"] = kTypeF16;
  EXPECT_THAT(Load(h), StatusIs(absl::StatusCode::kInvalidArgument, "type f16, expected [2] f32"));
}

TEST_F(WeightsTest, Qwen3QkNormsAreLoadedAndRequired) {
  TinyModel m;
  m.arch = "qwen3";
  m.head_dim = 8;
  m.qk_norm = true;
  auto w = Load(m);
  PD_ASSERT_OK(w);
  const LayerWeights& l = (*w)->layers[1];
  EXPECT_EQ(l.wq.rows, 16);  // n_head * head_dim, not n_embd
  EXPECT_EQ(l.wk.rows, 8);
  EXPECT_EQ(l.wo.cols, 16);
  EXPECT_EQ(l.q_norm.cols, 8);
  EXPECT_EQ(l.q_norm.data, file_->FindTensor("blk.1.attn_q_norm.weight")->data);
  EXPECT_EQ(l.k_norm.data, file_->FindTensor("blk.1.attn_k_norm.weight")->data);
  EXPECT_FALSE(l.fused_qkv);

  TinyModel missing = m;
  missing.dims["blk.1.attn_k_norm.weight"] = {};
  EXPECT_THAT(Load(missing), StatusIs(absl::StatusCode::kInvalidArgument,
                                      "tensor 'blk.1.attn_k_norm.weight' is missing"));
  TinyModel wide = m;
  wide.dims["blk.0.attn_q_norm.weight"] = {16};  // per head, not per model
  EXPECT_THAT(Load(wide),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'blk.0.attn_q_norm.weight' has shape [16], expected [8]"));
}

// Fused matrices become views of their rows: q, k, v of attn_qkv; gate then up of ffn_up.
TEST_F(WeightsTest, FusedMatricesAreSplitIntoRowViews) {
  for (uint32_t type : {kTypeF32, kTypeQ8_0}) {
    SCOPED_TRACE(type);
    TinyModel m;
    m.arch = "phi3";
    m.fused = true;
    m.weight_type = type;
    if (type == kTypeQ8_0) {  // rows of whole Q8_0 blocks
      m.n_embd = 64;
      m.n_ff = 32;
    }
    auto w = Load(m);
    PD_ASSERT_OK(w);
    const int64_t e = m.n_embd, hd = e / m.n_head, q = m.n_head * hd, kv = m.n_head_kv * hd;
    for (int i = 0; i < 2; ++i) {
      const LayerWeights& l = (*w)->layers[i];
      const GgufTensorInfo* qkv = file_->FindTensor(pd::StrCat("blk.", i, ".attn_qkv.weight"));
      const GgufTensorInfo* up = file_->FindTensor(pd::StrCat("blk.", i, ".ffn_up.weight"));
      ASSERT_NE(qkv, nullptr);
      ASSERT_NE(up, nullptr);
      const size_t row = l.wq.row_bytes();
      EXPECT_TRUE(l.fused_qkv);
      EXPECT_TRUE(l.fused_gate_up);
      EXPECT_EQ(l.wq.rows, q);
      EXPECT_EQ(l.wk.rows, kv);
      EXPECT_EQ(l.wv.rows, kv);
      EXPECT_EQ(l.wq.cols, e);
      EXPECT_EQ(l.wq.data, qkv->data);
      EXPECT_EQ(l.wk.data, qkv->data + q * row);
      EXPECT_EQ(l.wv.data, qkv->data + (q + kv) * row);
      EXPECT_EQ(l.wv.bytes() + l.wv.row_bytes() * (q + kv), qkv->nbytes);
      EXPECT_EQ(l.w_gate.rows, m.n_ff);
      EXPECT_EQ(l.w_up.rows, m.n_ff);
      EXPECT_EQ(l.w_gate.data, up->data);
      EXPECT_EQ(l.w_up.data, up->data + m.n_ff * l.w_up.row_bytes());
      EXPECT_EQ(l.w_gate.type, l.wq.type);
    }
    // Every tensor's bytes counted once.
    size_t sum = 0;
    for (const GgufTensorInfo& t : file_->tensors()) sum += t.nbytes;
    EXPECT_EQ((*w)->total_bytes, sum);
  }
}

TEST_F(WeightsTest, WrongFusedShapesNameTheLayout) {
  TinyModel qkv;
  qkv.arch = "phi3";
  qkv.fused = true;
  qkv.dims["blk.1.attn_qkv.weight"] = {8, 24};  // q, k, v of an MHA model in a GQA one
  EXPECT_THAT(Load(qkv), StatusIs(absl::StatusCode::kInvalidArgument,
                                  "tensor 'blk.1.attn_qkv.weight' has shape [8, 24], expected "
                                  "[8, 16] (q, k and v rows: 8 + 4 + 4)"));
  TinyModel up;
  up.arch = "phi3";
  up.fused = true;
  up.dims["blk.0.ffn_up.weight"] = {8, 16};  // up alone
  EXPECT_THAT(Load(up), StatusIs(absl::StatusCode::kInvalidArgument,
                                 "tensor 'blk.0.ffn_up.weight' has shape [8, 16], expected [8, 32] "
                                 "(no 'blk.0.ffn_gate.weight': gate and up fused, 16 + 16 rows)"));
  TinyModel both;
  both.arch = "phi3";
  both.fused = true;
  both.dims["blk.0.attn_k.weight"] = {8, 4};
  EXPECT_THAT(Load(both), StatusIs(absl::StatusCode::kInvalidArgument,
                                   "has both 'blk.0.attn_qkv.weight' and 'blk.0.attn_k.weight'"));
  TinyModel bias;
  bias.arch = "phi3";
  bias.fused = true;
  bias.dims["blk.1.attn_qkv.bias"] = {16};
  EXPECT_THAT(Load(bias), StatusIs(absl::StatusCode::kUnimplemented,
                                   "a fused QKV bias ('blk.1.attn_qkv.bias') is not supported"));
  TinyModel norm;
  norm.arch = "phi3";
  norm.fused = true;
  norm.dims["blk.1.ffn_norm.weight"] = {};
  EXPECT_THAT(Load(norm), StatusIs(absl::StatusCode::kInvalidArgument,
                                   "tensor 'blk.1.ffn_norm.weight' is missing"));
}

// Stacked experts are one mapping each; expert e is the e-th block of rows, a view of the file.
TEST_F(WeightsTest, ExpertsAreRowBlocksOfTheStackedTensors) {
  for (uint32_t type : {kTypeF32, kTypeQ8_0}) {
    SCOPED_TRACE(type);
    TinyModel m;
    m.arch = "qwen3moe";
    m.qk_norm = true;
    m.n_expert = 4;
    m.n_expert_used = 2;
    m.expert_ff = 8;
    m.weight_type = type;
    if (type == kTypeQ8_0) {  // rows of whole Q8_0 blocks
      m.n_embd = 64;
      m.expert_ff = 32;
      m.types["blk.0.ffn_gate_inp.weight"] = kTypeF32;
      m.types["blk.1.ffn_gate_inp.weight"] = kTypeF32;
    }
    auto w = Load(m);
    PD_ASSERT_OK(w);
    for (int i = 0; i < 2; ++i) {
      const LayerWeights& l = (*w)->layers[i];
      const GgufTensorInfo* up = file_->FindTensor(pd::StrCat("blk.", i, ".ffn_up_exps.weight"));
      const GgufTensorInfo* down =
          file_->FindTensor(pd::StrCat("blk.", i, ".ffn_down_exps.weight"));
      ASSERT_NE(up, nullptr);
      ASSERT_NE(down, nullptr);
      EXPECT_EQ(l.w_gate.data, nullptr);  // no dense feed-forward
      EXPECT_EQ(l.ffn_gate_inp.rows, 4);
      EXPECT_EQ(l.ffn_gate_inp.cols, m.n_embd);
      EXPECT_EQ(l.up_exps.rows, 4 * m.expert_ff);
      for (int e = 0; e < 4; ++e) {
        const Tensor ue = l.Expert(l.up_exps, e), de = l.Expert(l.down_exps, e);
        EXPECT_EQ(ue.rows, m.expert_ff);
        EXPECT_EQ(ue.cols, m.n_embd);
        EXPECT_EQ(ue.data, up->data + e * m.expert_ff * ue.row_bytes());
        EXPECT_EQ(de.rows, m.n_embd);
        EXPECT_EQ(de.cols, m.expert_ff);
        EXPECT_EQ(de.data, down->data + e * m.n_embd * de.row_bytes());
        EXPECT_EQ(ue.type, type == kTypeQ8_0 ? DType::kQ8_0 : DType::kF32);
      }
    }
    size_t sum = 0;
    for (const GgufTensorInfo& t : file_->tensors()) sum += t.nbytes;
    EXPECT_EQ((*w)->total_bytes, sum);
  }
  TinyModel bad;
  bad.arch = "qwen3moe";
  bad.qk_norm = true;
  bad.n_expert = 4;
  bad.n_expert_used = 2;
  bad.expert_ff = 8;
  bad.dims["blk.1.ffn_down_exps.weight"] = {8, 8, 3};  // one expert short
  EXPECT_THAT(Load(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                  "tensor 'blk.1.ffn_down_exps.weight' has shape [8, 8, 3], "
                                  "expected [8, 8, 4] ({cols, rows, experts})"));
}

}  // namespace
}  // namespace pd::engine
