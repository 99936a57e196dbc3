// GPTQ-style error-compensated quantization of one weight matrix, for every block format that
// has a BlockGrid (Q8_0, Q4_0, Q2_K ... Q6_K).
//
// W is [rows, cols] (a GGUF weight: each row is one output, `cols` inputs, blocks run along the
// row). Given H = 2/n X^T X of the inputs X the matrix sees (hessian.h), the quantizer minimizes
// ||X W^T - X Q^T|| greedily, one input column at a time: it rounds column i, then spreads the
// rounding error over the columns not yet quantized through the inverse Hessian, so that they
// absorb it (Frantar et al., "GPTQ", 2022; the math below is our own implementation of it):
//   - dampening: H += damp * mean(diag H) * I; dead inputs (diag 0) get diag = mean first;
//   - act-order: columns are processed by decreasing diag(H) (most active inputs first);
//   - U = upper Cholesky factor of H^-1 (U^T U = H^-1, in processing order), computed in double
//     as the inverse of the Cholesky factor of the reversed H, so only one factorization and one
//     triangular inverse are needed;
//   - per column i: q = nearest level, e = (w_i - q) / U_ii, w_j -= e * U_ij for j > i; updates
//     beyond the current batch of `block_size` columns are applied lazily, once per batch;
//   - block formats: a block's scales (and mins) are chosen when the first of its columns comes up
//     in processing order, by QuantizeRow's weighted search over the block's CURRENT (already
//     error-corrected) weights with importance diag(H); from then on each of its weights is
//     stored as the level nearest to its corrected value (BlockGrid::Nearest).
//
// Thread safety: GptqFactor is immutable after Create() and may be shared by threads and by the
// matrices that see the same inputs (attn_q/k/v, ffn_gate/up).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/quant/dtype.h"

namespace pd::engine {

struct GptqOptions {
  double damp = 0.01;     // relative dampening of the Hessian's diagonal
  int block_size = 128;   // columns per lazy batch
  bool act_order = true;  // process columns by decreasing diag(H)
  int threads = 0;        // 0 = every core
};

// The factorization of one Hessian, shared by every matrix with those inputs.
class GptqFactor {
 public:
  // `h`: H as a full symmetric row-major [cols, cols] matrix (InputStats::Hessian()).
  // INVALID_ARGUMENT: wrong size or non-finite entries; FAILED_PRECONDITION: H stays indefinite
  // even after 5 ten-fold increases of the dampening.
  static absl::StatusOr<std::unique_ptr<GptqFactor>> Create(absl::Span<const double> h,
                                                            int64_t cols,
                                                            const GptqOptions& options = {});

  int64_t cols() const { return cols_; }
  const std::vector<int64_t>& perm() const { return perm_; }  // processing order -> column
  // U in processing order, row-major [cols, cols] (upper triangle meaningful).
  const std::vector<double>& u() const { return u_; }
  // Dampened diag(H) per column (storage order): the block scale search's importance.
  const std::vector<float>& importance() const { return importance_; }
  double damp_used() const { return damp_used_; }  // the relative dampening that succeeded

 private:
  GptqFactor() = default;
  int64_t cols_ = 0;
  std::vector<int64_t> perm_;
  std::vector<double> u_;
  std::vector<float> importance_;
  double damp_used_ = 0;
};

// Quantizes w [rows, cols] into `out` (rows * RowBytes(type, cols) bytes). Preconditions
// (INVALID_ARGUMENT otherwise): HasGrid(type), cols == factor.cols(), cols a multiple of the
// type's block size, finite weights.
absl::Status GptqQuantize(DType type, const float* w, int64_t rows, int64_t cols,
                          const GptqFactor& factor, const GptqOptions& options, uint8_t* out);

}  // namespace pd::engine
