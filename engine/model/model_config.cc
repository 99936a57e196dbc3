#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/strings.h"

namespace pd::engine {
namespace {

// Reads `{arch}.{suffix}` as a positive int no larger than `max`.
absl::StatusOr<int> PositiveInt(const GgufFile& f, const std::string& key, int64_t max) {
  PD_ASSIGN_OR_RETURN(uint64_t v, f.GetUint(key));
  // Compare unsigned: a value with the top bit set must not pass as a negative int64.
  if (v == 0 || v > static_cast<uint64_t>(max)) {
    return absl::InvalidArgumentError(
        pd::StrCat("GGUF key '", key, "' = ", v, " is out of range (1..", max, ")"));
  }
  return static_cast<int>(v);
}

// Reads and checks kDraftHeadTokensKey (written as INT32; any integer array is read) into
// c.head_tokens. Needs c.n_vocab.
absl::Status ReadHeadTokens(const GgufFile& f, ModelConfig& c) {
  PD_ASSIGN_OR_RETURN(std::vector<int64_t> ids, f.GetIntArray(kDraftHeadTokensKey));
  if (ids.empty()) {
    return absl::InvalidArgumentError(pd::StrCat("'", kDraftHeadTokensKey, "' is empty"));
  }
  const GgufTensorInfo* out = f.FindTensor("output.weight");
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        pd::StrCat("'", kDraftHeadTokensKey, "' is set but tensor 'output.weight' is missing"));
  }
  if (out->shape.size() != 2 || out->shape[1] != static_cast<int64_t>(ids.size())) {
    return absl::InvalidArgumentError(
        pd::StrCat("'", kDraftHeadTokensKey, "' lists ", ids.size(),
                   " tokens but output.weight has ", out->shape.size() == 2 ? out->shape[1] : 0,
                   " rows; they must be equal (row i scores token head_tokens[i])"));
  }
  std::vector<bool> seen(c.n_vocab, false);
  c.head_tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= c.n_vocab) {
      return absl::InvalidArgumentError(pd::StrCat("'", kDraftHeadTokensKey, "'[", i,
                                                   "] = ", ids[i], " is outside the vocabulary of ",
                                                   c.n_vocab));
    }
    if (seen[ids[i]]) {
      return absl::InvalidArgumentError(
          pd::StrCat("'", kDraftHeadTokensKey, "'[", i, "]: token ", ids[i], " appears twice"));
    }
    seen[ids[i]] = true;
    c.head_tokens.push_back(static_cast<int32_t>(ids[i]));
  }
  return absl::OkStatus();
}

// Phi-3 (and Phi-4, which llama.cpp converts to the same architecture): SwiGLU with fused
// weights (Weights::Load splits them), queries scaled before Q.K as llama.cpp's phi3 graph does,
// and a sliding window on every layer when the file gives one.
absl::Status ReadPhi3(const GgufFile& f, ModelConfig& c) {
  // LongRoPE (Phi-3 128k, Phi-3.5): per-frequency factors whose set (long or short) depends on
  // the context a sequence gets, and an attention factor on top. Not run: refused, not run wrong.
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    if (f.FindTensor(t) != nullptr) {
      return absl::UnimplementedError(pd::StrCat(
          "phi3 with LongRoPE (tensor '", t,
          "': the 128k-context Phi-3 and Phi-3.5 models) is not supported; the 4k-context "
          "layout without rope_factors_long/short is"));
    }
  }
  if (f.FindTensor("blk.0.ffn_gate_inp.weight") != nullptr) {
    return absl::UnimplementedError(
        "phi3 with a mixture of experts (tensor 'blk.0.ffn_gate_inp.weight') is not supported");
  }
  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Phi-3-mini-4k was trained with a window of 2047 positions on every layer (its config.json's
  // sliding_window; Hugging Face's Phi3 masks with it); Phi-4 files say 0. llama.cpp (0.3.36)
  // ignores the window with a warning, so the two agree below `sliding_window` positions only.
  PD_ASSIGN_OR_RETURN(uint64_t window, f.GetUintOr("phi3.attention.sliding_window", 0));
  if (window > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        pd::StrCat("phi3.attention.sliding_window = ", window, " is out of range"));
  }
  c.sliding_window = static_cast<int>(window);
  c.swa_pattern = 0;  // every layer slides, with the model's own rope
  c.rope_freq_base_swa = c.rope_freq_base;
  c.rope_freq_scale_swa = c.rope_freq_scale;
  return absl::OkStatus();
}

// Mixture-of-experts keys: `{arch}.expert_count` and `expert_used_count` (qwen3moe: required;
// llama: Mixtral when present), and qwen3moe's `expert_feed_forward_length` (else n_ff /
// n_expert_used, as llama.cpp; llama's experts are n_ff rows). Expert groups (DeepSeek's
// group-limited routing) are refused; so are per-layer expert counts (arrays: GetUint fails).
absl::Status ReadExperts(const GgufFile& f, ModelConfig& c) {
  const std::string p = c.arch + ".";
  const bool moe_arch = c.arch == "qwen3moe";
  if (!moe_arch && c.arch != "llama") {
    if (f.Has(p + "expert_count") || f.FindTensor("blk.0.ffn_gate_inp.weight") != nullptr) {
      return absl::UnimplementedError(pd::StrCat(
          c.arch, " with a mixture of experts is not supported (experts run for llama and "
                  "qwen3moe)"));
    }
    return absl::OkStatus();
  }
  if (!moe_arch && !f.Has(p + "expert_count")) {
    if (f.FindTensor("blk.0.ffn_gate_inp.weight") != nullptr) {
      return absl::InvalidArgumentError(
          "tensor 'blk.0.ffn_gate_inp.weight' (an expert router) without 'llama.expert_count'");
    }
    return absl::OkStatus();
  }
  PD_ASSIGN_OR_RETURN(c.n_expert, PositiveInt(f, p + "expert_count", 4096));
  PD_ASSIGN_OR_RETURN(c.n_expert_used,
                      PositiveInt(f, p + "expert_used_count", std::min(c.n_expert, kMaxTopK)));
  for (const char* key : {"expert_group_count", "expert_group_used_count"}) {
    PD_ASSIGN_OR_RETURN(uint64_t groups, f.GetUintOr(p + key, 0));
    if (groups > 1) {
      return absl::UnimplementedError(
          pd::StrCat(p, key, " = ", groups, ": group-limited expert routing is not supported"));
    }
  }
  if (moe_arch && f.Has(p + "expert_feed_forward_length")) {
    PD_ASSIGN_OR_RETURN(c.n_ff_exp, PositiveInt(f, p + "expert_feed_forward_length", 1 << 20));
  } else {
    c.n_ff_exp = moe_arch ? c.n_ff / c.n_expert_used : c.n_ff;
    if (c.n_ff_exp == 0) {
      return absl::InvalidArgumentError(pd::StrCat(p, "feed_forward_length ", c.n_ff,
                                                   " is smaller than expert_used_count ",
                                                   c.n_expert_used));
    }
  }
  for (const char* t : {"blk.0.ffn_gate_shexp.weight", "blk.0.ffn_gate_inp_shexp.weight"}) {
    if (f.FindTensor(t) != nullptr) {
      return absl::UnimplementedError(
          pd::StrCat("shared experts (tensor '", t, "') are not supported"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& f) {
  ModelConfig c;
  PD_ASSIGN_OR_RETURN(std::string_view arch, f.GetString("general.architecture"));
  c.arch = std::string(arch);
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "qwen3moe" &&
      c.arch != "phi3" && c.arch != "gemma2" && c.arch != "gemma3") {
    return absl::UnimplementedError(pd::StrCat(
        "architecture '", c.arch,
        "' is not supported (supported: llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3)"));
  }
  if (auto name = f.GetString("general.name"); name.ok()) c.name = std::string(*name);
  const std::string p = c.arch + ".";

  PD_ASSIGN_OR_RETURN(c.n_embd, PositiveInt(f, p + "embedding_length", 1 << 16));
  PD_ASSIGN_OR_RETURN(c.n_layer, PositiveInt(f, p + "block_count", 1024));
  PD_ASSIGN_OR_RETURN(c.n_head, PositiveInt(f, p + "attention.head_count", 1024));
  PD_ASSIGN_OR_RETURN(c.n_ff, PositiveInt(f, p + "feed_forward_length", 1 << 20));
  PD_ASSIGN_OR_RETURN(c.n_ctx_train, PositiveInt(f, p + "context_length", 1 << 24));
  c.n_head_kv = c.n_head;
  if (f.Has(p + "attention.head_count_kv")) {
    PD_ASSIGN_OR_RETURN(c.n_head_kv, PositiveInt(f, p + "attention.head_count_kv", 1024));
  }
  if (c.n_head % c.n_head_kv != 0) {
    return absl::InvalidArgumentError(pd::StrCat("head_count ", c.n_head,
                                                 " is not a multiple of head_count_kv ",
                                                 c.n_head_kv));
  }
  if (f.Has(p + "attention.key_length")) {
    PD_ASSIGN_OR_RETURN(c.head_dim, PositiveInt(f, p + "attention.key_length", 1024));
    if (f.Has(p + "attention.value_length")) {
      PD_ASSIGN_OR_RETURN(int vl, PositiveInt(f, p + "attention.value_length", 1024));
      if (vl != c.head_dim) {
        return absl::UnimplementedError(pd::StrCat("key_length ", c.head_dim,
                                                   " != value_length ", vl, " is not supported"));
      }
    }
  } else {
    if (c.n_embd % c.n_head != 0) {
      return absl::InvalidArgumentError(pd::StrCat("embedding_length ", c.n_embd,
                                                   " is not a multiple of head_count ", c.n_head));
    }
    c.head_dim = c.n_embd / c.n_head;
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(pd::StrCat("head dimension ", c.head_dim, " is odd"));
  }
  PD_ASSIGN_OR_RETURN(double eps, f.GetFloatOr(p + "attention.layer_norm_rms_epsilon", 1e-5));
  if (!(eps > 0 && eps < 1)) {
    return absl::InvalidArgumentError(pd::StrCat("layer_norm_rms_epsilon ", eps, " is not in (0, 1)"));
  }
  c.rms_eps = static_cast<float>(eps);

  c.rope_mode = c.arch == "llama" ? RopeMode::kNormal : RopeMode::kNeox;
  PD_ASSIGN_OR_RETURN(uint64_t rope_dim, f.GetUintOr(p + "rope.dimension_count", c.head_dim));
  if (rope_dim == 0 || rope_dim > static_cast<uint64_t>(c.head_dim) || rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(pd::StrCat("rope.dimension_count ", rope_dim,
                                                 " must be even and at most the head dimension ",
                                                 c.head_dim));
  }
  c.rope_dim = static_cast<int>(rope_dim);
  PD_ASSIGN_OR_RETURN(double base, f.GetFloatOr(p + "rope.freq_base", 10000.0));
  if (!(base > 1.0) || !std::isfinite(static_cast<float>(base))) {
    return absl::InvalidArgumentError(pd::StrCat("rope.freq_base ", base, " must be > 1"));
  }
  c.rope_freq_base = static_cast<float>(base);

  // Rope scaling: "none" and "linear" run; others are refused rather than run wrongly.
  std::string scaling = "none";
  if (f.Has(p + "rope.scaling.type")) {
    PD_ASSIGN_OR_RETURN(std::string_view s, f.GetString(p + "rope.scaling.type"));
    scaling = std::string(s);
  }
  double factor = 0;
  if (f.Has(p + "rope.scaling.factor")) {
    PD_ASSIGN_OR_RETURN(factor, f.GetFloat(p + "rope.scaling.factor"));
  } else if (f.Has(p + "rope.scale_linear")) {  // older files
    PD_ASSIGN_OR_RETURN(factor, f.GetFloat(p + "rope.scale_linear"));
    if (scaling == "none") scaling = "linear";
  }
  if (scaling == "linear") {
    if (!(factor > 0) || !std::isfinite(factor)) {
      return absl::InvalidArgumentError(pd::StrCat("rope scaling factor ", factor, " must be > 0"));
    }
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none") {
    return absl::UnimplementedError(
        pd::StrCat("rope scaling type '", scaling, "' is not supported (supported: none, linear)"));
  }

  // Vocabulary size: from the token list, or the embedding table for files without one.
  if (f.Has("tokenizer.ggml.tokens")) {
    PD_ASSIGN_OR_RETURN(auto tokens, f.GetStringArray("tokenizer.ggml.tokens"));
    if (tokens.size() > (size_t{1} << 24)) {
      return absl::InvalidArgumentError(pd::StrCat("vocabulary of ", tokens.size(),
                                                   " tokens exceeds the supported 2^24"));
    }
    c.n_vocab = static_cast<int>(tokens.size());
  }
  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) {
    return absl::InvalidArgumentError("tensor 'token_embd.weight' is missing");
  }
  if (embd->shape.size() != 2) {
    return absl::InvalidArgumentError("tensor 'token_embd.weight' is not 2-D");
  }
  if (embd->shape[1] > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(pd::StrCat("token_embd.weight has ", embd->shape[1],
                                                 " rows, more than the supported 2^24 tokens"));
  }
  if (c.n_vocab == 0) c.n_vocab = static_cast<int>(embd->shape[1]);
  c.tied_output = f.FindTensor("output.weight") == nullptr;
  if (f.Has(kDraftHeadTokensKey)) PD_RETURN_IF_ERROR(ReadHeadTokens(f, c));

  if (c.arch == "gemma3") {
    // Gemma 3: scaled embeddings, Q/K norms, norms after each block, GeGLU, and five local
    // (sliding-window, rope base 10000) layers for every global one. Rope scaling, when present,
    // applies to the global layers only.
    c.embedding_scale = std::sqrt(static_cast<float>(c.n_embd));
    c.ffn_act = FfnActivation::kGeluTanh;
    c.qk_norm = true;
    c.post_norms = true;
    c.swa_pattern = 6;
    c.rope_freq_base_swa = 10000.f;
    c.rope_freq_scale_swa = 1.f;
    PD_ASSIGN_OR_RETURN(uint64_t window, f.GetUintOr(p + "attention.sliding_window", 0));
    if (window == 0 || window > (uint64_t{1} << 24)) {
      return absl::InvalidArgumentError(
          pd::StrCat(p, "attention.sliding_window = ", window, " is out of range"));
    }
    c.sliding_window = static_cast<int>(window);
    // The 27B model scales queries by 1/sqrt(n_embd / n_head); the others by 1/sqrt(head_dim).
    c.attention_scale = c.n_layer == 62
                            ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head))
                            : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  }
  if (c.arch == "gemma2") {
    // Gemma 2: Gemma's scaled embeddings, GeGLU and pre/post norms; local (sliding-window) and
    // global layers alternate, sharing one rope base; attention scores and output logits are
    // soft-capped (llama.cpp's defaults 50 and 30 when the keys are absent).
    c.embedding_scale = std::sqrt(static_cast<float>(c.n_embd));
    c.ffn_act = FfnActivation::kGeluTanh;
    c.post_norms = true;
    c.swa_pattern = 2;
    PD_ASSIGN_OR_RETURN(double base_swa, f.GetFloatOr(p + "rope.freq_base_swa", c.rope_freq_base));
    if (!(base_swa > 1.0) || !std::isfinite(static_cast<float>(base_swa))) {
      return absl::InvalidArgumentError(pd::StrCat("rope.freq_base_swa ", base_swa, " must be > 1"));
    }
    c.rope_freq_base_swa = static_cast<float>(base_swa);
    c.rope_freq_scale_swa = c.rope_freq_scale;
    PD_ASSIGN_OR_RETURN(uint64_t window, f.GetUintOr(p + "attention.sliding_window", 4096));
    if (window == 0 || window > (uint64_t{1} << 24)) {
      return absl::InvalidArgumentError(
          pd::StrCat(p, "attention.sliding_window = ", window, " is out of range"));
    }
    c.sliding_window = static_cast<int>(window);
    for (auto [key, def, field] : {std::tuple{"attn_logit_softcapping", 50.0, &c.attn_softcap},
                                   std::tuple{"final_logit_softcapping", 30.0, &c.final_softcap}}) {
      PD_ASSIGN_OR_RETURN(double cap, f.GetFloatOr(p + key, def));
      if (!(cap > 0) || !std::isfinite(static_cast<float>(cap))) {
        return absl::InvalidArgumentError(pd::StrCat(p, key, " = ", cap, " must be > 0"));
      }
      *field = static_cast<float>(cap);
    }
    // The 27B model (46 layers) scales queries by 1/sqrt(n_embd / n_head), as llama.cpp does.
    c.attention_scale = c.n_layer == 46
                            ? 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head))
                            : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  }
  if (c.arch == "qwen3" || c.arch == "qwen3moe") {
    // Qwen3: Qwen2 without the QKV biases, with an RMS norm over each head of Q and K before
    // rope (llama.cpp's qwen3 graph); the head size may differ from n_embd / n_head. Qwen3-MoE is
    // the same attention with experts in every layer.
    c.qk_norm = true;
  }
  PD_RETURN_IF_ERROR(ReadExperts(f, c));
  if (c.arch == "phi3") PD_RETURN_IF_ERROR(ReadPhi3(f, c));
  if (c.arch == "llama") {
    // Mistral's window (hf_convert writes it as llama.attention.sliding_window; llama.cpp's llama
    // graph does not read the key): every layer attends to the last `sliding_window` positions,
    // with the model's own rope.
    PD_ASSIGN_OR_RETURN(uint64_t window, f.GetUintOr("llama.attention.sliding_window", 0));
    if (window > (uint64_t{1} << 24)) {
      return absl::InvalidArgumentError(
          pd::StrCat("llama.attention.sliding_window = ", window, " is out of range"));
    }
    c.sliding_window = static_cast<int>(window);
    c.swa_pattern = 0;
    c.rope_freq_base_swa = c.rope_freq_base;
    c.rope_freq_scale_swa = c.rope_freq_scale;
  }
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  return c;
}

}  // namespace pd::engine
