// W8A8 ("w8a8", DType::kW8A8 = 0x50440001, pdserve's own type): INT8 weights with one f32 scale
// per output channel (row), multiplied with activations quantized to INT8 per token at run time.
// The activation rows use the same row format, so a matmul is an exact integer dot per (weight
// row, token) times the two row scales.
//
// Layout of one row of n weights (n % 32 == 0), n + 16 bytes:
//   bytes 0-3     d       f32 (IEEE binary32, little-endian): x ~= d * q
//   bytes 4-15    zero    reserved, written as zero and ignored on read: they keep the int8 codes
//                         of every row 16-byte aligned (a row is a multiple of 16 bytes), so GPU
//                         kernels can use 16-byte loads and tensor-core tiles on the rows in place
//   bytes 16..    q[n]    int8 codes in [-127, 127], weight j at byte 16 + j (-128 is not a valid
//                         code: the AVX2 kernel's sign trick needs it absent, as ggml's Q8 does)
// Bits per weight: 8 + 128 / n (8.03 for n = 4096).
//
// Quantization (weights offline, activations per token at run time, identical rule):
// d = max|x| / 127, q = roundf(x / d) computed as roundf(x * (1 / d)) (half away from zero, as
// ggml's Q8_0); an all-zero row gets d = 0 and q = 0.
//
// SmoothQuant (Xiao et al., 2023): activation outliers sit in a few input channels, which makes
// per-token INT8 activations coarse. Per input channel j, s_j = max|X_j|^a / max|W_j|^(1-a)
// migrates difficulty from activations to weights: W'[:, j] = W[:, j] * s_j, X'[:, j] = X[:, j] /
// s_j, so X' W'^T = X W^T. pdserve folds 1/s into the RMSNorm weight that produces X (so the
// division costs nothing at run time); see engine/quant/quantize/ and docs/quantization.md.
//
// All functions are pure and thread-safe; they are the scalar reference the SIMD kernels in
// engine/backend/cpu are tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pd::engine {

inline constexpr int kW8A8BlockSize = 32;       // n must be a multiple of this
inline constexpr size_t kW8A8HeaderBytes = 16;  // per-row header
// Largest n the kernels accept: the AVX2 kernel keeps 8 int32 partial sums per row pair, each
// growing by at most 4 * 127 * 127 per 32 weights, which stays below 2^31 up to n = 2^20.
inline constexpr int64_t kW8A8MaxCols = int64_t{1} << 20;

// Bytes of one row of n weights: 16 + n.
inline size_t W8A8RowBytes(int64_t n) { return kW8A8HeaderBytes + static_cast<size_t>(n); }
// The row scale d of an encoded row.
float W8A8RowScale(const void* row);
// The codes of an encoded row (n of them, at byte 16).
inline const int8_t* W8A8RowCodes(const void* row) {
  return static_cast<const int8_t*>(row) + kW8A8HeaderBytes;
}

// Quantizes one row of n floats (n % 32 == 0, PD_CHECKed) into W8A8RowBytes(n) bytes at y.
void QuantizeRowW8A8(const float* x, void* y, int64_t n);
// y[j] = d * q[j].
void DequantizeRowW8A8(const void* x, float* y, int64_t n);
// Writes a row from a scale and n codes (each in [-127, 127], PD_CHECKed); header padding zero.
void PackRowW8A8(float d, const int8_t* q, void* y, int64_t n);

// Scalar reference dot of a weight row with an activation row (both W8A8 rows of n weights):
// the exact integer sum of q_w * q_x (int64) converted to f32, times f32(d_w * d_x). The SIMD
// kernels compute the same integer sum exactly, so their results are bit-identical.
float DotW8A8(const void* w, const void* x, int64_t n);

// SmoothQuant factors for one input group: per input channel j,
//   s_j = max(act_absmax[j], 1e-5)^alpha / max(w_absmax[j], 1e-5)^(1 - alpha)
// where w_absmax is the largest |W[:, j]| over every matrix that reads the input. Channels that
// calibration never saw (act_absmax[j] == 0) or whose weights are all zero get s_j = 1. alpha in
// [0, 1] (PD_CHECKed); larger alpha moves more of the range into the weights.
std::vector<float> SmoothingFactors(const std::vector<float>& act_absmax,
                                    const std::vector<float>& w_absmax, float alpha);

}  // namespace pd::engine
