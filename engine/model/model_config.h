// Hyper-parameters of a decoder-only transformer, read from GGUF metadata.
//
// Architectures differ by configuration, not by forked code: `llama` (Llama 2/3, Mistral with
// its window, TinyLlama), `qwen2`, `qwen3`, `phi3`, `gemma2` and `gemma3` share one forward
// pass; the fields below select their differences. How the weights are stored (fused QKV or
// gate/up matrices) is not part of the config: Weights::Load splits fused matrices into the
// per-projection views the forward pass reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/model/gguf.h"

namespace pd::engine {

enum class FfnActivation {
  kSilu,      // SwiGLU: silu(gate) * up (Llama, Qwen2)
  kGeluTanh,  // GeGLU: gelu_tanh(gate) * up (Gemma)
};

struct ModelConfig {
  std::string arch;  // general.architecture
  std::string name;  // general.name, if present
  int n_vocab = 0;
  int n_ctx_train = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;  // n_embd / n_head unless the file says otherwise
  int n_ff = 0;
  float rms_eps = 1e-5f;

  RopeMode rope_mode = RopeMode::kNormal;
  int rope_dim = 0;
  float rope_freq_base = 10000.f;
  float rope_freq_scale = 1.f;  // 1 / linear scaling factor

  bool tied_output = false;  // output head shares token_embd.weight
  // A draft model's restricted output head (`pdserve.draft.head_tokens`, written by
  // `pdctl quantize --draft`): row i of output.weight scores token id head_tokens[i]; every other
  // id gets -infinity. Empty: the head covers the whole vocabulary (every ordinary model).
  std::vector<int32_t> head_tokens;
  bool qkv_bias = false;     // attn_{q,k,v}.bias present

  // Architecture hooks (defaults are Llama's).
  float embedding_scale = 0.f;  // > 0: embeddings are multiplied by it (Gemma: sqrt(n_embd))
  FfnActivation ffn_act = FfnActivation::kSilu;
  bool qk_norm = false;          // RMSNorm over each head of Q and K (attn_{q,k}_norm)
  bool post_norms = false;       // RMSNorm on the attention and FFN outputs before the residual
  float attention_scale = 0.f;   // Q is multiplied by this before Q.K; 0 = 1/sqrt(head_dim)
  // Sliding-window attention (sliding_window > 0): a sliding layer attends to the last
  // `sliding_window` positions only, with its own rope base and scale. With swa_pattern P > 0,
  // layer i is global when (i + 1) % P == 0 and sliding otherwise (Gemma 3); with P == 0 every
  // layer slides (Phi-3; Mistral, as llama with llama.attention.sliding_window).
  int sliding_window = 0;
  int swa_pattern = 0;
  float rope_freq_base_swa = 10000.f;
  float rope_freq_scale_swa = 1.f;
  // Logit soft-capping, cap * tanh(x / cap), when > 0: of the attention scores, and of the output
  // logits (Gemma 2).
  float attn_softcap = 0.f;
  float final_softcap = 0.f;
  // Mixture of experts (n_expert > 0; Qwen3-MoE, Mixtral): each layer's feed-forward is n_expert
  // SwiGLU experts of n_ff_exp rows (ffn_{gate,up,down}_exps); a router (ffn_gate_inp) scores the
  // experts of each token, softmax gives their probabilities, the n_expert_used most probable run,
  // and their outputs are summed weighted by those probabilities renormalized to sum 1
  // (llama.cpp's softmax gating with normalized weights). n_ff is then the dense size the file
  // states, unused.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;

  bool IsSlidingLayer(int layer) const {
    return sliding_window > 0 && (swa_pattern == 0 || (layer + 1) % swa_pattern != 0);
  }

  // Reads and validates the config (architectures: llama (with or without experts), qwen2,
  // qwen3, qwen3moe, phi3, gemma2, gemma3).
  // INVALID_ARGUMENT names the key and the bad value (also for head_tokens that are out of range,
  // repeated, not one per row of output.weight, or given without an output.weight);
  // UNIMPLEMENTED for an architecture, rope scaling or variant this engine does not run (phi3
  // with LongRoPE factors or experts).
  static absl::StatusOr<ModelConfig> FromGguf(const GgufFile& f);
};

// The context a sequence gets when none is configured: the training context, at most 4096 tokens
// (the rule of every engine the node runtime builds, pdctl's, and the router's requests).
// The metadata key of ModelConfig::head_tokens (an INT32 array).
inline constexpr char kDraftHeadTokensKey[] = "pdserve.draft.head_tokens";

inline int DefaultContext(int n_ctx_train) { return n_ctx_train < 4096 ? n_ctx_train : 4096; }

}  // namespace pd::engine
