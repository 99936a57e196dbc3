// Whole-matrix helpers for the offline quantizer: row-parallel round-to-nearest (optionally
// importance-weighted) quantization, dequantization, and the error measures the quantizer
// reports. W is [rows, cols] row-major, as a GGUF weight (rows = outputs, cols = inputs).
//
// All functions are thread-safe for disjoint outputs; `threads` = 0 uses every core.
#pragma once

#include <cstdint>

#include "engine/quant/dtype.h"

namespace pd::engine {

// QuantizeRow on every row; `importance`: nullptr or `cols` non-negative weights per input
// column, shared by all rows (k_quants.h's weighted scale search; Q8_0 and the float types ignore
// it). Precondition: cols is a multiple of the type's block size.
void QuantizeMatrix(DType type, const float* w, int64_t rows, int64_t cols, const float* importance,
                    int threads, uint8_t* out);

// Rows of any DType back to F32.
void DequantizeMatrix(DType type, const uint8_t* q, int64_t rows, int64_t cols, int threads,
                      float* out);

// ||W - Q||_F / ||W||_F (0 when W is 0).
double RelativeError(const float* w, const float* q, int64_t n);

// sqrt(sum_ij a_j (W - Q)_ij^2 / sum_ij a_j W_ij^2): the relative output error if the inputs
// were uncorrelated with mean square a ([cols]).
double WeightedRelativeError(const float* w, const float* q, int64_t rows, int64_t cols,
                             const float* a);

// sqrt(tr(E H E^T) / tr(W H W^T)) with E = W - Q: the relative output error
// ||X W^T - X Q^T||_F / ||X W^T||_F on the inputs X whose H = 2/n X^T X is given
// (full symmetric [cols, cols]).
double OutputRelativeError(const float* w, const float* q, int64_t rows, int64_t cols,
                           const double* h, int threads);

}  // namespace pd::engine
