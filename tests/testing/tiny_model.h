// Test helper: a tiny random Llama-style (or Qwen2-, Qwen3-, Qwen3-MoE-, Mixtral-, Phi-3-style)
// model as GGUF bytes,
// written with GgufBuilder. Weights are drawn from a seeded normal distribution and stored in
// `type`.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/quant/dtype.h"
#include "engine/quant/k_quants.h"
#include "engine/quant/q5_0.h"
#include "engine/quant/q8_0.h"
#include "tests/testing/gguf_builder.h"

namespace pd::engine::testing {

struct TinyModelSpec {
  std::string arch = "llama";
  int n_vocab = 96, n_embd = 64, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 96;
  bool tied = false, qkv_bias = false;
  int head_dim = 0;         // > 0: written as attention.key_length/value_length (Qwen3)
  bool qk_norm = false;     // attn_{q,k}_norm.weight (Qwen3)
  bool fused = false;       // attn_qkv.weight and a gate/up ffn_up.weight (Phi-3)
  int sliding_window = -1;  // >= 0: written as attention.sliding_window (Phi-3, Mistral)
  // Experts (n_expert > 0): expert_count / expert_used_count, a router and stacked experts of
  // expert_ff rows (written as expert_feed_forward_length when > 0; else n_ff rows, Mixtral's
  // layout) in place of the dense feed-forward. The router is F32, as converters write it.
  int n_expert = 0, n_expert_used = 0, expert_ff = 0;
  DType type = DType::kF32;
  uint32_t seed = 1;
  // > 0: every matrix weight gets this much of an independent normal perturbation (relative to
  // its scale) from perturb_seed: a model near the seed's one (a test draft model).
  float perturb = 0;
  float output_scale = 1;  // multiplies the output head's weights: sharper next-token laws
  uint32_t perturb_seed = 2;
  uint32_t context_length = 256;  // the model's trained context (`<arch>.context_length`)
  // Extra metadata written after the model's own keys (e.g. a tokenizer.ggml.* vocabulary).
  std::function<void(GgufBuilder&)> metadata = nullptr;
};

// Encodes F32 values as `type` rows of `row` elements.
inline std::string EncodeRows(const std::vector<float>& v, int64_t row, DType type) {
  const int64_t rows = static_cast<int64_t>(v.size()) / row;
  std::string out(RowBytes(type, row) * rows, '\0');
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = v.data() + r * row;
    void* dst = out.data() + r * RowBytes(type, row);
    switch (type) {
      case DType::kF32: std::memcpy(dst, src, row * 4); break;
      case DType::kF16: F32ToF16Row(src, static_cast<uint16_t*>(dst), row); break;
      case DType::kBF16: F32ToBf16Row(src, static_cast<uint16_t*>(dst), row); break;
      case DType::kQ8_0: QuantizeRowQ8_0(src, static_cast<BlockQ8_0*>(dst), row); break;
      case DType::kQ5_0:
        QuantizeRowQ5_0(src, static_cast<BlockQ5_0*>(dst), row);
        break;
      case DType::kQ4_K:
      case DType::kQ6_K:  // k_quants.h's reference quantizers
        QuantizeRow(type, src, dst, row);
        break;
      default: PD_CHECK_MSG(false, "TinyModel: unsupported type");
    }
  }
  return out;
}

inline std::string TinyModel(const TinyModelSpec& s) {
  GgufBuilder b;
  std::mt19937 rng(s.seed);
  std::mt19937 prng(s.perturb_seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::normal_distribution<float> pnd(0.f, 1.f);  // its own: a distribution caches draws
  auto add = [&](const std::string& name, std::vector<uint64_t> dims, float scale, bool norm,
                 DType type) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::vector<float> v(n);
    for (float& x : v) {
      x = norm ? 1.f + 0.1f * nd(rng) : nd(rng) * scale;
      if (!norm && s.perturb > 0) x += s.perturb * scale * pnd(prng);
    }
    b.Tensor(TensorSpec{name, dims, static_cast<uint32_t>(type), std::nullopt,
                        EncodeRows(v, int64_t(dims[0]), type)});
  };
  const std::string a = s.arch;
  const uint64_t E = s.n_embd, hd = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head, F = s.n_ff;
  const uint64_t q = s.n_head * hd, kv = s.n_head_kv * hd;
  b.Str("general.architecture", a);
  b.U32(a + ".context_length", s.context_length);
  b.U32(a + ".embedding_length", s.n_embd);
  b.U32(a + ".block_count", s.n_layer);
  b.U32(a + ".feed_forward_length", s.n_ff);
  b.U32(a + ".attention.head_count", s.n_head);
  b.U32(a + ".attention.head_count_kv", s.n_head_kv);
  b.F32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  b.F32(a + ".rope.freq_base", 10000.f);
  if (s.head_dim > 0) {
    b.U32(a + ".attention.key_length", s.head_dim);
    b.U32(a + ".attention.value_length", s.head_dim);
  }
  if (s.sliding_window >= 0) b.U32(a + ".attention.sliding_window", s.sliding_window);
  if (s.n_expert > 0) {
    b.U32(a + ".expert_count", s.n_expert);
    b.U32(a + ".expert_used_count", s.n_expert_used);
    if (s.expert_ff > 0) b.U32(a + ".expert_feed_forward_length", s.expert_ff);
  }
  if (s.metadata) s.metadata(b);
  const float w = 1.0f / std::sqrt(float(E));
  add("token_embd.weight", {E, uint64_t(s.n_vocab)}, 1.f, false, s.type);
  add("output_norm.weight", {E}, 0, true, DType::kF32);
  if (!s.tied) add("output.weight", {E, uint64_t(s.n_vocab)}, w * s.output_scale, false, s.type);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {E}, 0, true, DType::kF32);
    if (s.fused) {
      add(p + "attn_qkv.weight", {E, q + 2 * kv}, w, false, s.type);
    } else {
      add(p + "attn_q.weight", {E, q}, w, false, s.type);
      add(p + "attn_k.weight", {E, kv}, w, false, s.type);
      add(p + "attn_v.weight", {E, kv}, w, false, s.type);
    }
    if (s.qk_norm) {
      add(p + "attn_q_norm.weight", {hd}, 0, true, DType::kF32);
      add(p + "attn_k_norm.weight", {hd}, 0, true, DType::kF32);
    }
    if (s.qkv_bias) {
      add(p + "attn_q.bias", {q}, 0.1f, false, DType::kF32);
      add(p + "attn_k.bias", {kv}, 0.1f, false, DType::kF32);
      add(p + "attn_v.bias", {kv}, 0.1f, false, DType::kF32);
    }
    add(p + "attn_output.weight", {q, E}, w, false, s.type);
    add(p + "ffn_norm.weight", {E}, 0, true, DType::kF32);
    if (s.n_expert > 0) {
      const uint64_t ne = s.n_expert, fe = s.expert_ff > 0 ? s.expert_ff : F;
      add(p + "ffn_gate_inp.weight", {E, ne}, 2.f * w, false, DType::kF32);
      add(p + "ffn_gate_exps.weight", {E, fe, ne}, w, false, s.type);
      add(p + "ffn_up_exps.weight", {E, fe, ne}, w, false, s.type);
      add(p + "ffn_down_exps.weight", {fe, E, ne}, 1.0f / std::sqrt(float(fe)), false, s.type);
      continue;
    }
    if (s.fused) {
      add(p + "ffn_up.weight", {E, 2 * F}, w, false, s.type);  // gate rows, then up rows
    } else {
      add(p + "ffn_gate.weight", {E, F}, w, false, s.type);
      add(p + "ffn_up.weight", {E, F}, w, false, s.type);
    }
    add(p + "ffn_down.weight", {F, E}, 1.0f / std::sqrt(float(F)), false, s.type);
  }
  return b.Build();
}

}  // namespace pd::engine::testing
