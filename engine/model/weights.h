// A model's weights, made usable by one Backend. Borrows the GgufFile's mapped bytes on the CPU
// (no copy); on a device backend it owns the device copies. Immutable after Load().
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/model/gguf.h"
#include "engine/model/model_config.h"

namespace pd::engine {

struct LayerWeights {
  Tensor attn_norm;            // F32 [1, n_embd]
  Tensor wq, wk, wv, wo;       // [n_head*hd, n_embd], [n_head_kv*hd, n_embd] x2, [n_embd, n_head*hd]
  Tensor bq, bk, bv;           // optional biases (data == nullptr when absent)
  Tensor q_norm, k_norm;       // F32 [1, head_dim] (qk_norm architectures)
  Tensor post_attn_norm;       // F32 [1, n_embd] (post_norms architectures)
  Tensor ffn_norm;             // F32 [1, n_embd]
  Tensor post_ffn_norm;        // F32 [1, n_embd] (post_norms architectures)
  Tensor w_gate, w_up, w_down; // [n_ff, n_embd] x2, [n_embd, n_ff]; empty with experts
  // A mixture of experts (ModelConfig::n_expert > 0): the router ffn_gate_inp [n_expert, n_embd],
  // and the experts' matrices stacked by rows as the file stores them (ggml shape {cols, rows,
  // n_expert}): gate_exps and up_exps [n_expert * n_ff_exp, n_embd], down_exps [n_expert *
  // n_embd, n_ff_exp]. Expert e's matrix is the row block Expert(stacked, e).
  Tensor ffn_gate_inp;
  Tensor gate_exps, up_exps, down_exps;
  int n_expert = 0;
  Tensor Expert(const Tensor& stacked, int e) const {
    const int64_t rows = stacked.rows / n_expert;
    return stacked.Rows(e * rows, rows);
  }
  // The file stores wq, wk and wv as the row blocks of one matrix (attn_qkv.weight), and w_gate
  // and w_up as the two halves of ffn_up.weight: the tensors above are views (copies on a
  // device) of those rows. Matmul observers see them under the file's names.
  bool fused_qkv = false;
  bool fused_gate_up = false;
};

class Weights {
 public:
  // Validates every tensor against `config` (presence, shape, type) and maps it onto `backend`.
  // INVALID_ARGUMENT names the tensor, its shape and the expected one. Fused matrices are split
  // by rows: blk.N.attn_qkv.weight (q, k, v rows) in place of attn_{q,k,v}.weight, and an
  // ffn_up.weight of 2 * n_ff rows (gate, then up) when there is no ffn_gate.weight. The file and
  // the backend must outlive the Weights.
  // `own_head_layout`: map the output head in its backend's layout for pdserve's own order
  // (Backend::MapWeightsOwnLayout: the CPU backend's q8_0x16 for a Q8_0 head), and a tied token
  // embedding on the same backend with it (GetRows reads that layout), instead of the file's;
  // where the backend has none, the file's as usual. A head so laid out multiplies every row in
  // the own order, so the model runs over F16 and INT8 caches only (Model::LoadOptions).
  // `own_layer_layout`: the same for the layers' dense matrices (q, k, v, output, gate, up, down;
  // the CPU backend's q8_0x16, q5_0x16, q4_Kx16 and q6_Kx16), not the experts of a mixture.
  static absl::StatusOr<std::unique_ptr<Weights>> Load(const GgufFile& file,
                                                       const ModelConfig& config, Backend& backend,
                                                       bool own_head_layout = false,
                                                       bool own_layer_layout = false);
  // Layer l's tensors on layer_backends[l] (config.n_layer entries, none null); the token
  // embedding on layer 0's backend, the output norm and head on the last layer's (a tied head is
  // mapped a second time there when the two differ).
  static absl::StatusOr<std::unique_ptr<Weights>> Load(const GgufFile& file,
                                                       const ModelConfig& config,
                                                       absl::Span<Backend* const> layer_backends,
                                                       bool own_head_layout = false,
                                                       bool own_layer_layout = false);

  // A view of `base` (a model's full weights, `config` its config, head_tokens empty) whose output
  // head holds only the rows of `head_tokens` (ascending token ids < n_vocab, no repeats), copied
  // from the file's head (output.weight, or token_embd.weight when tied) into a new buffer on
  // `head_backend`, in the file's type: row i scores token head_tokens[i] with exactly the bits
  // of the full head's row. Every other tensor is base's (views, no copy); the view keeps base
  // alive. What the target as its own draft runs (Model::WithHead).
  // INVALID_ARGUMENT for a bad id list or a base that already has a restricted head;
  // RESOURCE_EXHAUSTED when the backend cannot hold the rows.
  static absl::StatusOr<std::unique_ptr<Weights>> WithHead(std::shared_ptr<const Weights> base,
                                                           const GgufFile& file,
                                                           const ModelConfig& config,
                                                           absl::Span<const int32_t> head_tokens,
                                                           Backend& head_backend);

  Tensor token_embd;   // [n_vocab, n_embd]
  Tensor output_norm;  // F32 [1, n_embd]
  Tensor output;       // [n_vocab, n_embd] (a draft's: [head_tokens, n_embd]); token_embd if tied
                       // and the head shares the embedding's backend
  std::vector<float> rope_freq_factors;  // host, rope_dim/2 values, or empty
  std::vector<LayerWeights> layers;
  size_t total_bytes = 0;  // bytes of all weight tensors (a tied head counted once)
  // Whether Load mapped any layer matrix in an own-order layout (own_layer_layout).
  bool layers_laid_out_own() const { return layers_laid_out_own_; }

 private:
  Weights() = default;
  std::vector<std::unique_ptr<Buffer>> storage_;  // device copies (empty on the CPU backend)
  std::shared_ptr<const Weights> base_;           // WithHead: the weights it shares
  bool layers_laid_out_own_ = false;
};

}  // namespace pd::engine
