// Calibration: runs text through the model with our own engine and gathers, for every weight
// matrix, statistics of the inputs it multiplies (MatMulObserver, engine/runtime/model.h):
// mean x^2 per input column always, and X^T X (for GPTQ) for the matrices a filter picks.
//
// Matrices that see the same input in a forward pass (attn_q/k/v, ffn_gate/up) share one set of
// statistics: the collector notices that an input equals the previous matmul's and files the
// weight under the first one's name (its "leader"), so each X^T X is accumulated and stored once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/gguf.h"
#include "engine/quant/hessian.h"
#include "engine/quant/quantize/progress.h"
#include "engine/runtime/model.h"
#include "engine/tokenizer/tokenizer.h"

namespace pd::engine::quantize {

// The token chunks calibration runs: `text` tokenized (special-token text is not parsed), cut
// into chunks of at most `chunk_tokens` tokens, each starting with BOS when the vocabulary adds
// one. When the text holds more than `max_tokens` tokens, chunks are picked evenly spaced over it
// so that the whole text is sampled. A trailing piece shorter than 16 tokens is dropped unless
// it is the only one.
std::vector<std::vector<int32_t>> MakeCalibrationChunks(const Tokenizer& tokenizer,
                                                        std::string_view text, int chunk_tokens,
                                                        int64_t max_tokens);

// A norm and the weight matrices that read its output: the readers of the residual stream.
struct NormReaders {
  std::string norm;
  std::vector<std::string> readers;
};

// Every layer's (blk.N.) readers, then the head's: attn_norm -> attn_qkv when the file has it
// (Phi-3), else attn_q/k/v; ffn_norm -> ffn_gate and ffn_up, or the router and the stacked
// experts (ffn_gate_inp, ffn_gate_exps, ffn_up_exps) when the layer has a router, or ffn_up
// alone (Phi-3's fused gate/up); output_norm -> output. Names are listed whether or not the file
// holds them; each caller decides what a missing one means.
std::vector<NormReaders> ResidualReaders(const GgufFile& file);

// The importance of each column of an untied token embedding ([cols] per row), from the weights
// rather than from calibration: a lookup has no inputs to measure. A token's row starts the
// residual stream, which every layer reads through its input norm (weight g) and the output
// head through the final norm; an error e_j in column j reaches a consumer W as W[:, j] g_j e_j
// scaled by the token's 1/rms (the same for the whole row, so it does not change how the row is
// rounded). Its cost is e_j^2 times
//   importance_j = sum over consumers of g_j^2 ||W[:, j]||^2
// (the diagonal of G W^T W G) over ResidualReaders' matrices that the file holds (stacked
// experts averaged and counted expert_used_count times). The error stays in the stream for every later layer, so each
// consumer counts; the residual's growth with depth is not modeled. Consumers stored quantized
// are dequantized. Empty when no consumer reads `cols` columns.
std::vector<float> ResidualImportance(const GgufFile& file, int64_t cols, int threads);

class ActivationCollector final : public MatMulObserver {
 public:
  // Whether to accumulate X^T X for the group led by `weight` (called once per group, when it is
  // first seen, with the input width `cols`).
  using HessianFilter = std::function<bool(std::string_view weight, int64_t cols)>;

  ActivationCollector(HessianFilter filter, int threads);

  void Observe(std::string_view weight, const float* x, int64_t rows, int64_t cols) override;

  // Statistics of the inputs `weight` saw (shared within its group), or nullptr if never seen.
  const InputStats* Find(std::string_view weight) const;
  // The weight whose name files the group `weight` belongs to ("" if never seen).
  std::string_view LeaderOf(std::string_view weight) const;
  // Every leader, in name order.
  std::vector<std::string> Leaders() const;

 private:
  HessianFilter filter_;
  int threads_;
  std::map<std::string, std::unique_ptr<InputStats>, std::less<>> stats_;  // by leader
  std::map<std::string, std::string, std::less<>> leader_;                 // weight -> leader
  std::vector<float> last_x_;
  int64_t last_rows_ = 0, last_cols_ = 0;
  std::string last_leader_;
};

// Runs each chunk through `model` as a fresh sequence, with `observer` installed (and removed
// afterwards). The hidden states of every `head_stride`-th position (and the last) go through
// the output head, so the head is calibrated too. Progress counts tokens.
// Errors: whatever Model::Forward / KvCache::Create return.
absl::Status RunCalibration(Model& model, const std::vector<std::vector<int32_t>>& chunks,
                            int head_stride, MatMulObserver& observer, Progress& progress,
                            std::string_view stage);

}  // namespace pd::engine::quantize
