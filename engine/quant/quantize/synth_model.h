// Synthetic models: a Llama-architecture GGUF of a given shape with random weights and a
// synthetic SentencePiece-style vocabulary, written without any source model (`pdctl
// synth-model`). Machines without Python or a network make their test and benchmark models with
// it: the file loads, tokenizes and generates (gibberish) like a real model of that shape, and
// its speed is a real model's speed.
//
// Weights: matrices ~ N(0, 1/cols) (each output starts near unit scale, so activations stay
// finite through any depth; token_embd ~ N(0, 1) so the output depends on the input), norms = 1.
// The values of row r of tensor t come from a counter-based generator seeded with (seed, t, r):
// the file is byte-identical for the same spec whatever the thread count (on the same build: the
// normal draws use libm's log, sin and cos). The types whose quantizer searches scales per block
// (q4_0, q2_K..q6_K, w4a16; microseconds a weight) would take hours for a 7B model: their large
// tensors are made of blocks drawn from a pool of 4096 quantized normal blocks instead (see
// SynthTensor::pooled), which costs what writing the file costs.
//
// Lives in engine/quant/quantize (pd_quantize) for the GGUF writer and the quantizers; pd_model
// cannot depend on them (pd_quantize depends on pd_model).
//
// Thread safety: the functions are thread-safe; WriteSynthModel uses `threads` threads itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/quant/dtype.h"
#include "engine/quant/quantize/progress.h"

namespace pd::engine::quantize {

struct SynthModelSpec {
  std::string name = "custom";  // the shape's name; general.name is "synth-<name>-<type>"
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;  // divides n_head (GQA)
  int head_dim = 0;   // 0: n_embd / n_head; otherwise written as attention.key_length
  int n_ff = 0;
  int n_vocab = 0;   // at least 259: <unk>, <s>, </s> and the 256 byte tokens
  int n_ctx = 4096;  // llama.context_length
  float rope_freq_base = 10000.f;
  float rms_eps = 1e-5f;
  DType type = DType::kQ8_0;  // every matrix, token_embd included
  // output.weight's type (llama.cpp's Q4_K_M keeps it at q6_K); nullopt: `type`.
  std::optional<DType> output_type;
  bool tied_output = false;  // no output.weight: the head reuses token_embd
  uint64_t seed = 0;
  int threads = 0;  // 0: every core
};

// A named shape: `spec` has every field but type, seed and threads set.
struct SynthShape {
  std::string_view name;
  std::string_view description;
  SynthModelSpec spec;
};

// The built-in shapes (tiny, llama-1b, tinyllama-1.1b, llama-7b, llama-13b, llama3-8b).
const std::vector<SynthShape>& SynthShapes();
// The shape named `name`; NOT_FOUND listing the known names otherwise.
absl::StatusOr<SynthModelSpec> FindSynthShape(std::string_view name);
// One line per shape ("llama-7b  32 layers, ...: Llama 2 7B"), for --help and `--shape list`.
std::string DescribeSynthShapes();

// Checks a spec. INVALID_ARGUMENT naming the field: a size out of range (the limits
// ModelConfig::FromGguf enforces), n_head not a multiple of n_head_kv, n_embd not a multiple of
// n_head without head_dim, an odd head dimension, a vocabulary under 259 tokens, a type the
// quantizer cannot write (q8_K), or a row length (n_embd, n_head * head_dim, n_ff) that is not a
// multiple of a type's block size (q4_K: 256).
absl::Status ValidateSynthSpec(const SynthModelSpec& spec);

struct SynthTensor {
  std::string name;
  DType type;
  std::vector<int64_t> shape;  // ggml order: shape[0] = row length
  float stddev;                // of the normal draws; 0: all ones (a norm)
  // Rows are random sequences of blocks from a pool of 4096 quantized N(0, stddev^2) blocks.
  // For the types whose quantizer searches scales (q4_0, q2_K..q6_K, w4a16), in tensors whose
  // rows have at least 4 blocks, when the tensors of that type and stddev hold over 8192 blocks.
  bool pooled = false;
};

struct SynthPlan {
  std::vector<SynthTensor> tensors;  // in file order
  int64_t n_params = 0;              // weights in all tensors
  uint64_t file_bytes = 0;           // the exact size of the file WriteSynthModel writes
};

// What WriteSynthModel would write, without writing (or generating) anything. Errors as
// ValidateSynthSpec.
absl::StatusOr<SynthPlan> PlanSynthModel(const SynthModelSpec& spec);

// Writes the model to `path` (through path.tmp, renamed at the end: never a partial file at
// `path`). Each tensor is generated and quantized in pieces of a few MiB, in parallel, and
// streamed to the file, so memory stays small whatever the model's size. Progress: one stage in
// MiB, the tensor being written as its detail. Errors: those of ValidateSynthSpec; NOT_FOUND when
// the output folder does not exist; RESOURCE_EXHAUSTED when the file system has less free space
// than the file needs; PERMISSION_DENIED / INTERNAL from creating or writing the file.
absl::Status WriteSynthModel(const SynthModelSpec& spec, const std::string& path,
                             Progress& progress);

// The synthetic vocabulary of `n_vocab` tokens (n_vocab >= 259): <unk>, <s>, </s>, <0x00> ..
// <0xFF>, "▁" and the printable ASCII characters, then lowercase letter strings with and without
// a leading "▁", shortest first (so that every prefix of a piece is itself a token and SPM's
// pairwise merges reach it). Exposed for tests.
std::vector<std::string> SynthVocabulary(int n_vocab);

}  // namespace pd::engine::quantize
