// Hugging Face checkpoints (a folder with config.json, safetensors weights and tokenizer.json) as
// GGUF: the one mapping from a transformers model to the GGUF that llama.cpp's converter would
// write for it, used both by `pdctl convert` (a file) and by every engine entry point that is given
// a folder instead of a .gguf (the same GGUF, built in memory: OpenModelFile).
//
// Supported `architectures` (config.json): LlamaForCausalLM and MistralForCausalLM (GGUF "llama";
// Q/K rows reordered for llama.cpp's adjacent-pair rotary layout; Mistral's sliding_window, when
// shorter than the context, written as llama.attention.sliding_window: every layer slides),
// Qwen2ForCausalLM ("qwen2"), Qwen3ForCausalLM ("qwen3": per-head q_norm/k_norm),
// Phi3ForCausalLM ("phi3": fused qkv_proj and gate_up_proj kept fused, as attn_qkv and a 2 * n_ff
// row ffn_up; its sliding_window written as llama.cpp writes it), the mixtures of experts
// Qwen3MoeForCausalLM ("qwen3moe") and MixtralForCausalLM ("llama" with expert_count; both:
// the router as an F32 ffn_gate_inp, each layer's experts stacked into ffn_{gate,up,down}_exps), Gemma2ForCausalLM and
// Gemma3ForCausalLM ("gemma2", "gemma3"; norm weights stored as w, applied as 1 + w, become
// 1 + w; Gemma 2's soft-capping as its GGUF keys). Rope scaling: linear, and Llama 3's (written
// as rope_freqs.weight, as llama.cpp does); none for Phi-3 (LongRoPE is refused). Anything else
// is UNIMPLEMENTED naming what (Qwen2/Qwen3 windows that would bite, for one), never converted
// into a model that runs wrongly. docs/models.md has the tables.
//
// Thread safety: free functions, no shared state.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
#include "engine/quant/dtype.h"

namespace pd::engine {

struct HfConvertOptions {
  // Storage of the 2-D weights: F32, F16 or BF16; nullopt keeps each tensor's stored type (F32,
  // F16 or BF16). Norms, biases and rope factors are always F32, as llama.cpp writes them.
  std::optional<DType> float_type;
  // Called once per tensor written (name, index from 1, count): progress of long conversions.
  std::function<void(const std::string& name, size_t i, size_t n)> progress;
};

// True when `path` is a folder holding config.json.
bool IsHfCheckpoint(const std::string& path);

// Writes the GGUF of the checkpoint in `dir` to `out` (atomically: out.tmp, renamed when whole).
// NOT_FOUND for missing files, INVALID_ARGUMENT for malformed ones (naming the file and key),
// UNIMPLEMENTED for an architecture, option or tensor this converter does not handle.
absl::Status ConvertHfCheckpoint(const std::string& dir, const std::string& out,
                                 const HfConvertOptions& options);

// The same GGUF, in an anonymous in-memory file: serving a checkpoint without writing a file.
absl::StatusOr<std::unique_ptr<GgufFile>> LoadHfCheckpoint(const std::string& dir,
                                                           const HfConvertOptions& options);

// A model path as users give it: a GGUF file, or a Hugging Face folder (LoadHfCheckpoint with
// default options).
absl::StatusOr<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& path);

}  // namespace pd::engine
