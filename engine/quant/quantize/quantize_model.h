// The model quantizer behind `pdctl quantize`: reads a GGUF model (F32/F16/BF16, or an already
// quantized one, dequantized first), picks each weight tensor's block type from the base type, a
// mixed-precision policy and overrides (policy.h), quantizes it by round-to-nearest, by
// importance-weighted scale search on calibration statistics, or by GPTQ error compensation
// (gptq.h), and writes a GGUF with every metadata key copied (general.file_type and
// general.quantization_version set) that our engine and llama.cpp load.
//
// Calibration (importance, gptq) runs the input model with our engine on a text: the built-in one
// (texts.h) or --calib FILE. GPTQ needs X^T X per input group; when those exceed the memory
// budget, the calibration text is run again for the groups left over (one pass per budget-full).
//
// The output is written to OUT.tmp and renamed onto OUT at the end: a failure leaves nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
#include "engine/quant/dtype.h"
#include "engine/quant/gptq.h"
#include "engine/quant/quantize/progress.h"

namespace pd::engine::quantize {

enum class Method { kRtn, kImportance, kGptq };
// "rtn", "importance", "gptq"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Method> ParseMethod(std::string_view name);
std::string_view MethodName(Method m);

struct QuantizeOptions {
  // output "": the quantized model stays in memory (QuantizeReport::model), for quantizing at load.
  std::string input, output;
  // Opens `input` (default GgufFile::Open): callers that also take other formats (a Hugging Face
  // folder, engine/convert/hf_convert.h) pass their opener.
  std::function<absl::StatusOr<std::unique_ptr<GgufFile>>(const std::string&)> open_input;
  DType type = DType::kQ4_K;  // base type (QuantTypes())
  Method method = Method::kRtn;
  std::string policy = "M";            // S, M, L or a policy YAML file
  std::vector<std::string> overrides;  // "REGEX=TYPE", first match wins
  // Calibration text file; empty = the built-in calibration text. Calibration runs for
  // importance and gptq, and for rtn only when a file is given or eval_hessian is set.
  std::string calib_file;
  int64_t calib_tokens = 16384;  // at most this many tokens in total
  int chunk_tokens = 512;        // tokens per forward pass (capped by the training context)
  int head_stride = 8;           // every n-th position calibrates the output head
  // Also accumulate X^T X when the method does not need it, so that x_err is the exact output
  // error for every method (for comparing methods); costs the time and memory GPTQ's does.
  bool eval_hessian = false;
  uint64_t hessian_budget_bytes = uint64_t{4} << 30;  // X^T X held at once (doubles)
  int threads = 0;                                    // 0 = every core
  GptqOptions gptq;
  // SmoothQuant for W8A8 (w8a8.h): when any matrix reading an RMSNorm's output (attn_q/k/v,
  // ffn_gate/up, an untied output head) is w8a8, the input's per-channel range is migrated
  // into the weights with s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) from the calibration
  // activations (calibration runs for every method then): every matrix of the group gets its
  // columns multiplied by s, and the norm's weight is divided by s. alpha in [0, 1].
  bool smooth = true;
  float smooth_alpha = 0.5f;

  // ---- draft models (draft_model.h) ----
  // Not empty: write a draft model. Its output.weight holds only these rows of the input's head
  // (output.weight, or token_embd.weight when tied; row i scores token head_tokens[i]), the key
  // pdserve.draft.head_tokens lists them, and token_embd stays as the input table (the policy sees
  // the model as untied). INVALID_ARGUMENT for an id outside the head or an input that already is
  // a draft.
  std::vector<int32_t> head_tokens;
  // The calibration text itself, when set: replaces calib_file and the built-in text (and counts
  // as given, like calib_file); calib_text_source names it in the report.
  std::optional<std::string> calib_text;
  std::string calib_text_source;
};

struct TensorReport {
  std::string name;
  std::vector<int64_t> shape;  // ggml order
  DType src_type = DType::kF32;
  DType type = DType::kF32;
  bool quantized = false;  // false: copied byte for byte
  size_t bytes = 0;
  std::string method;        // rtn | importance | gptq | convert | copy
  double w_err = -1;         // ||W - Q||_F / ||W||_F; -1 when copied
  // Relative output error on the calibration inputs; -1 without stats. For an untied
  // token_embd weighed by the residual stream (ResidualImportance): the error weighed so.
  double x_err = -1;
  bool x_err_exact = false;  // from the full X^T X (else the diagonal approximation)
  std::string note;          // policy rule / override / fallback
  // W8A8 smoothing: max s / min s over the input channels for smoothed matrices (0 when not
  // smoothed), and for a norm whose weight was divided by s.
  double smooth_range = 0;
};

struct QuantizeReport {
  std::string input, output, policy;
  // QuantizeOptions::output "": the quantized model, in an anonymous in-memory file.
  std::shared_ptr<GgufFile> model;
  DType base = DType::kQ4_K;
  Method method = Method::kRtn;
  uint32_t file_type = 0;
  std::vector<TensorReport> tensors;
  uint64_t file_bytes = 0;
  int64_t n_elements = 0;    // all tensors
  double bpw = 0;            // tensor data bits per element, all tensors
  double bpw_quantized = 0;  // over the quantized tensors only
  int64_t calib_tokens = 0;  // tokens run per calibration pass
  int calib_passes = 0;
  std::string calib_source;  // "built-in (fortunes: science, ...)" or the file
  double seconds = 0;
  std::vector<std::string> warnings;
};

// Runs the whole job. Errors (nothing is left at options.output on any of them):
//   INVALID_ARGUMENT  unknown policy, bad override, malformed input file, empty calibration text;
//   NOT_FOUND         unreadable input or calibration file, missing output folder;
//   PERMISSION_DENIED output not writable;
//   FAILED_PRECONDITION calibration needs to run the model and our engine cannot (the message
//                     says why), or the built-in texts' sources are missing or changed;
//   others            I/O failures while writing.
absl::StatusOr<QuantizeReport> QuantizeModel(const QuantizeOptions& options, Progress& progress);

// The per-tensor table and the summary, as pdctl prints them.
std::string FormatReport(const QuantizeReport& report);

// llama.cpp's name of a general.file_type value ("Q4_K_M"), or "type N".
std::string FileTypeName(uint32_t file_type);

}  // namespace pd::engine::quantize
