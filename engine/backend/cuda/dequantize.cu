#include <algorithm>

#include "engine/backend/cuda/dequant_device.cuh"
#include "engine/backend/cuda/dequantize.cuh"

namespace pd::engine::cuda {
namespace {

constexpr int kDequantBlock = 256;
// gridDim.y is limited to 65535; more rows are covered by the kernels' row loop.
constexpr int64_t kMaxGridRows = 65535;

__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__half* p, float v) { *p = __float2half_rn(v); }

// One output element per thread and step: blockIdx.y walks the rows, blockIdx.x the columns.
// `ids` nullptr: output row r is table row r. Per element: reads the weight's share of its block
// (its block header again for every element, from L1) and writes 4 (F32) or 2 (F16) bytes; a
// few integer ops and at most four flops. Memory bound.
template <WeightFormat F, typename Out>
__global__ void DequantizeRowsKernel(const uint8_t* __restrict__ table, size_t row_bytes,
                                     const int32_t* __restrict__ ids, int64_t n_rows, int64_t cols,
                                     Out* __restrict__ out) {
  for (int64_t r = blockIdx.y; r < n_rows; r += gridDim.y) {
    const int64_t src = ids != nullptr ? ids[r] : r;
    const uint8_t* row = table + static_cast<size_t>(src) * row_bytes;
    Out* dst = out + r * cols;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      Store(dst + c, Dequant<F>::At(row, c));
    }
  }
}

template <typename Out>
cudaError_t Launch(WeightFormat format, const void* table, size_t row_bytes, const int32_t* ids,
                   int64_t n_rows, int64_t cols, Out* out, cudaStream_t stream) {
  if (n_rows <= 0 || cols <= 0) return cudaSuccess;
  // Enough column blocks for a wide row to fill the GPU on its own (a single decode token's
  // embedding), few enough that each thread does several elements of a long one.
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((cols + kDequantBlock - 1) / kDequantBlock, 64)),
      static_cast<unsigned>(std::min(n_rows, kMaxGridRows)));
  const auto* t = static_cast<const uint8_t*>(table);
  switch (format) {
    case WeightFormat::kF32:
      DequantizeRowsKernel<WeightFormat::kF32>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kF16:
      DequantizeRowsKernel<WeightFormat::kF16>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kBF16:
      DequantizeRowsKernel<WeightFormat::kBF16>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ8_0:
      DequantizeRowsKernel<WeightFormat::kQ8_0>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ4_0:
      DequantizeRowsKernel<WeightFormat::kQ4_0>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ5_0:
      DequantizeRowsKernel<WeightFormat::kQ5_0>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ2_K:
      DequantizeRowsKernel<WeightFormat::kQ2_K>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ3_K:
      DequantizeRowsKernel<WeightFormat::kQ3_K>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ4_K:
      DequantizeRowsKernel<WeightFormat::kQ4_K>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ5_K:
      DequantizeRowsKernel<WeightFormat::kQ5_K>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    case WeightFormat::kQ6_K:
      DequantizeRowsKernel<WeightFormat::kQ6_K>
          <<<grid, kDequantBlock, 0, stream>>>(t, row_bytes, ids, n_rows, cols, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGetRows(WeightFormat format, const void* table, size_t row_bytes,
                          const int32_t* ids, int64_t n_ids, int64_t cols, float* out,
                          cudaStream_t stream) {
  return Launch(format, table, row_bytes, ids, n_ids, cols, out, stream);
}

cudaError_t LaunchDequantizeToF16(WeightFormat format, const void* w, size_t row_bytes,
                                  int64_t n_rows, int64_t cols, __half* out, cudaStream_t stream) {
  return Launch(format, w, row_bytes, nullptr, n_rows, cols, out, stream);
}

}  // namespace pd::engine::cuda
