// The CPU backend: host memory, synchronous ops built from the kernel table (kernels.h), run on a
// fixed thread pool. See backend.h for the semantics of every op.
//
// Numerics follow ggml's CPU backend so that logits match llama.cpp closely: MatMul converts each
// activation row once per call to the weight's companion type (F16, BF16, Q8_0 for Q8_0/Q4_0,
// Q8_K for the k-quants) and dots in that type with F32 accumulation; RmsNorm sums squares in
// F64; Softmax sums exponentials in F64; Rope builds angles in F32 by repeated multiplication.
// Attention follows ggml's order (dot, softmax, weighted sum of V: cpu::AttnKernels), bit-exact
// with llama.cpp for an F32 K/V cache; F16 keys and values are widened to F32 (llama.cpp instead
// rounds the query and the probabilities to F16), INT8 ones dequantized on the fly.
//
// Thread safety: as backend.h says, one engine thread at a time; ops parallelize internally.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend_internal.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/kv_rotation.h"
#include "engine/backend/top_k.h"
#include "engine/quant/dtype.h"
#include "engine/quant/fp16.h"
#include "engine/quant/q4_kx16.h"
#include "engine/quant/q5_0x16.h"
#include "engine/quant/q6_kx16.h"
#include "engine/quant/q8_0x16.h"

namespace pd::engine {
namespace cpu {

bool IsSupported(DType t) {
  return t == DType::kQ8_0x16 || t == DType::kQ5_0x16 || t == DType::kQ4_Kx16 ||
         t == DType::kQ6_Kx16 || DTypeFromGgml(static_cast<uint32_t>(t)).has_value();
}

bool HasMatMul(DType t) { return t != DType::kQ8_K; }

absl::Status NoMatMul(const Tensor& w, const char* what) {
  return absl::UnimplementedError(absl::StrCat(what, ": the CPU backend has no matmul for ",
                                               std::string(Traits(w.type).name), " weights yet"));
}

std::string Describe(const Tensor& t) {
  return absl::StrCat(IsSupported(t.type) ? std::string(Traits(t.type).name)
                                          : RawGgmlTypeName(static_cast<uint32_t>(t.type)),
                      "[", t.rows, ", ", t.cols, "]");
}

namespace {

// Row r of a q5_0x16 / q4_Kx16 / q6_Kx16 table as F32: unpacked to the `source` blocks it was
// made from, then that type's reference dequantizer.
template <typename Block>
void DequantizeX16Row(DType source, void (*unpack)(const void*, int64_t, int64_t, Block*),
                      const Tensor& table, int64_t r, float* dst) {
  thread_local std::vector<Block> row;
  row.resize(static_cast<size_t>(table.cols / Traits(source).block_size));
  unpack(table.data, table.cols, r, row.data());
  DequantizeRow(source, row.data(), dst, table.cols);
}

}  // namespace

absl::Status CheckTensor(const Tensor& t, const char* what) {
  if (!IsSupported(t.type)) {
    return absl::UnimplementedError(absl::StrCat(what, ": the CPU backend does not run type ",
                                                 RawGgmlTypeName(static_cast<uint32_t>(t.type))));
  }
  if (t.rows < 0 || t.cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative shape ", Describe(t)));
  }
  if (t.cols % Traits(t.type).block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cols of ", Describe(t),
                                                   " is not a multiple of the block size ",
                                                   Traits(t.type).block_size));
  }
  if (t.numel() > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null data for ", Describe(t)));
  }
  return absl::OkStatus();
}

absl::Status CheckF32(const Tensor& t, const char* what) {
  PD_RETURN_IF_ERROR(CheckTensor(t, what));
  if (t.type != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": expected f32, the CPU backend does not run ", Describe(t)));
  }
  return absl::OkStatus();
}

std::string Describe(const KvTensor& t) {
  return pd::StrCat(KvDTypeName(t.type), "[", t.n_blocks, " blocks x ", t.block_size, " slots x ",
                    t.n_kv_heads, " heads x ", t.head_dim, "]");
}

absl::Status CheckCache(const KvTensor& t, const KvBatch& kv, const char* what) {
  if (t.type != KvDType::kF32 && t.type != KvDType::kF16 && t.type != KvDType::kI8) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": unknown KV cache type ", static_cast<int>(t.type)));
  }
  if (t.n_kv_heads <= 0 || t.head_dim <= 0 || t.block_size <= 0 || t.n_blocks < 0 ||
      (t.n_blocks > 0 && t.data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bad cache ", Describe(t), t.data == nullptr ? " (null data)" : ""));
  }
  if (t.block_size != kv.block_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cache blocks of ", t.block_size,
                                                   " slots, batch block size ", kv.block_size));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const Tensor& a, const Tensor& b, const char* what) {
  if (a.rows != b.rows || a.cols != b.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shapes differ: ", Describe(a), " vs ", Describe(b)));
  }
  return absl::OkStatus();
}

bool Overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

// ---- MapWeights' copies --------------------------------------------------------------------
namespace {

// /proc/meminfo's MemAvailable in bytes; SIZE_MAX when it cannot be read (no limit known).
size_t MemAvailableBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return SIZE_MAX;
  char line[256];
  size_t bytes = SIZE_MAX;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long kib = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      bytes = static_cast<size_t>(kib) * 1024;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WeightSlice>> CpuBackend::ReserveWeights(size_t bytes) {
  const size_t padded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (!copy_budget_set_) {
    copy_budget_set_ = true;
    if (copy_budget_ == 0) copy_budget_ = MemAvailableBytes() / 2;
  }
  // Only the bytes copied count: a chunk's untouched pages are never made resident.
  if (padded > copy_budget_) {
    if (!copy_budget_hit_) {
      copy_budget_hit_ = true;
      PD_LOG(kWarning,
             "cpu: weights past this point stay in the model file's pages (4 KiB, "
             "slower matmuls): copying them would take more than the ",
             copy_budget_ >> 20, " MiB left for copies (half of MemAvailable at load)");
    }
    return nullptr;
  }
  copy_budget_ -= padded;
  if (weight_chunk_ == nullptr || weight_chunk_size_ - weight_chunk_used_ < padded) {
    const size_t size = std::max(kWeightChunk, padded);
    char* p = static_cast<char*>(AllocHost(size, kAlignment));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: cannot allocate ", size,
                       " bytes of host memory for weights (PDSERVE_CPU_WEIGHTS="
                       "mmap uses the model file's pages in place)"));
    }
    weight_chunk_.reset(p, [](char* q) { std::free(q); });
    weight_chunk_size_ = size;
    weight_chunk_used_ = 0;
  }
  auto buf =
      std::make_unique<WeightSlice>(weight_chunk_, weight_chunk_.get() + weight_chunk_used_, bytes);
  weight_chunk_used_ += padded;
  return buf;
}

absl::StatusOr<Tensor> CpuBackend::CopyWeights(const Tensor& host,
                                               std::unique_ptr<Buffer>* storage) {
  const size_t bytes = host.bytes();
  PD_ASSIGN_OR_RETURN(std::unique_ptr<WeightSlice> buf, ReserveWeights(bytes));
  if (buf == nullptr) return host;
  constexpr int64_t kPiece = int64_t{4} << 20;
  const int64_t pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
  char* dst = static_cast<char*>(buf->data());
  const char* src = static_cast<const char*>(host.data);
  pool_.ParallelFor(pieces, [&](int64_t p0, int64_t p1) {
    const size_t begin = static_cast<size_t>(p0 * kPiece);
    const size_t end = std::min(bytes, static_cast<size_t>(p1 * kPiece));
    std::memcpy(dst + begin, src + begin, end - begin);
  });
  Tensor copy = host;
  copy.data = dst;
  *storage = std::move(buf);
  return copy;
}

absl::StatusOr<Tensor> CpuBackend::MapWeightsOwnLayout(const Tensor& host,
                                                       std::unique_ptr<Buffer>* storage) {
  PD_RETURN_IF_ERROR(CheckTensor(host, "MapWeightsOwnLayout"));
  if (storage != nullptr) storage->reset();
  Tensor none{host.type, host.cols, host.rows, nullptr};
  // Q8_0 as q8_0x16 (any rows: the last rows % 16 stay plain), Q5_0 as q5_0x16, Q4_K as q4_Kx16
  // and Q6_K as q6_Kx16 (rows a multiple of 16; other matrices keep their rows and take the order
  // through the flag). Only where the flag on the rows takes the own order (OwnOrderKernels),
  // whose bits these are.
  DType laid;
  void (*repack)(const void*, size_t, int64_t, int64_t, void*) = nullptr;
  switch (host.type) {
    case DType::kQ8_0:
      laid = DType::kQ8_0x16, repack = &RepackQ8_0x16;
      break;
    case DType::kQ5_0:
      laid = DType::kQ5_0x16, repack = &RepackQ5_0x16;
      break;
    case DType::kQ4_K:
      laid = DType::kQ4_Kx16, repack = &RepackQ4_Kx16;
      break;
    case DType::kQ6_K:
      laid = DType::kQ6_Kx16, repack = &RepackQ6_Kx16;
      break;
    default:
      laid = host.type;
      break;
  }
  if (repack == nullptr || (host.type != DType::kQ8_0 && host.rows % 16 != 0) ||
      OwnOrderKernels(host.type) == nullptr || !copy_weights_ || storage == nullptr ||
      host.bytes() == 0) {
    return none;
  }
  const Tensor out{laid, host.cols, host.rows, nullptr};
  // Past the copies' budget: the plain rows with the flag, at the same bits.
  PD_ASSIGN_OR_RETURN(std::unique_ptr<WeightSlice> buf, ReserveWeights(out.bytes()));
  if (buf == nullptr) return none;
  char* p = static_cast<char*>(buf->data());
  // In pieces of whole groups of 16 rows; the last piece takes q8_0x16's plain tail rows.
  const int64_t rows = host.rows, k = host.cols, rs = static_cast<int64_t>(host.row_bytes());
  const int64_t out_rs = static_cast<int64_t>(out.row_bytes());  // q4_Kx16: 148 per 144
  constexpr int64_t kPieceRows = 1024;
  pool_.ParallelFor((rows + kPieceRows - 1) / kPieceRows, [&](int64_t p0, int64_t p1) {
    const int64_t r0 = p0 * kPieceRows, r1 = std::min(rows, p1 * kPieceRows);
    repack(static_cast<const char*>(host.data) + r0 * rs, rs, r1 - r0, k, p + r0 * out_rs);
  });
  *storage = std::move(buf);
  return Tensor{laid, host.cols, host.rows, p};
}

// ---- GetRows -------------------------------------------------------------------------------
absl::Status CpuBackend::GetRows(const Tensor& table, absl::Span<const int32_t> ids, Tensor& out) {
  PD_RETURN_IF_ERROR(CheckTensor(table, "GetRows table"));
  PD_RETURN_IF_ERROR(CheckF32(out, "GetRows out"));
  if (out.rows != static_cast<int64_t>(ids.size()) || out.cols != table.cols) {
    return absl::InvalidArgumentError(absl::StrCat("GetRows: table ", Describe(table), ", ",
                                                   ids.size(), " ids, out ", Describe(out)));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= table.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("GetRows: id ", ids[i], " at ", i, " outside ", table.rows, " rows"));
    }
  }
  if (Overlap(table, out)) return absl::InvalidArgumentError("GetRows: out overlaps table");
  const int64_t cols = table.cols;
  const size_t rb = table.row_bytes();
  const char* base = static_cast<const char*>(table.data);
  pool_.ParallelFor(
      static_cast<int64_t>(ids.size()),
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const char* src = base + static_cast<size_t>(ids[i]) * rb;
          float* dst = RowF32(out, i);
          switch (table.type) {
            case DType::kF32:
              std::memcpy(dst, src, rb);
              break;
            case DType::kF16:
              k_.f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, cols);
              break;
            case DType::kBF16:
              k_.bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, cols);
              break;
            case DType::kQ8_0:
              k_.dequantize_q8_0(reinterpret_cast<const BlockQ8_0*>(src), dst, cols);
              break;
            case DType::kQ8_0x16: {
              thread_local std::vector<BlockQ8_0> row;
              row.resize(static_cast<size_t>(cols / kQ8_0BlockSize));
              UnpackQ8_0x16Row(table.data, table.rows, cols, ids[i], row.data());
              k_.dequantize_q8_0(row.data(), dst, cols);
              break;
            }
            case DType::kQ5_0x16:
              DequantizeX16Row(DType::kQ5_0, &UnpackQ5_0x16Row, table, ids[i], dst);
              break;
            case DType::kQ4_Kx16:
              DequantizeX16Row(DType::kQ4_K, &UnpackQ4_Kx16Row, table, ids[i], dst);
              break;
            case DType::kQ6_Kx16:
              DequantizeX16Row(DType::kQ6_K, &UnpackQ6_Kx16Row, table, ids[i], dst);
              break;
            case DType::kQ4_0:
            case DType::kQ5_0:
            case DType::kQ2_K:
            case DType::kQ3_K:
            case DType::kQ4_K:
            case DType::kQ5_K:
            case DType::kQ6_K:
            case DType::kQ8_K:
            case DType::kW8A8:
            case DType::kW4A16:
              DequantizeRow(table.type, src, dst, cols);  // scalar reference (k_quants.h)
              break;
          }
        }
      },
      /*grain=*/std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)));
  return absl::OkStatus();
}

// ---- RmsNorm -------------------------------------------------------------------------------
// Per row: 3 flops and 8 bytes (12 with a weight) per element.
absl::Status CpuBackend::RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(x, "RmsNorm x"));
  PD_RETURN_IF_ERROR(CheckF32(y, "RmsNorm y"));
  PD_RETURN_IF_ERROR(CheckSameShape(x, y, "RmsNorm"));
  const bool has_weight = w.data != nullptr;
  if (has_weight) {
    PD_RETURN_IF_ERROR(CheckF32(w, "RmsNorm w"));
    if (w.rows != 1 || w.cols != x.cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("RmsNorm: weight ", Describe(w), " for x ", Describe(x)));
    }
  }
  if (!(eps >= 0.f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNorm: eps ", eps));
  }
  const int64_t cols = x.cols;
  if (cols == 0) return absl::OkStatus();
  pool_.ParallelFor(
      x.rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = RowF32(x, r);
          float* yr = RowF32(y, r);
          const float mean = static_cast<float>(k_.sum_squares(xr, cols) / cols);
          const float s = 1.f / std::sqrt(mean + eps);
          if (has_weight) {
            k_.scale_mul(xr, s, static_cast<const float*>(w.data), yr, cols);
          } else {
            k_.scale(xr, s, yr, cols);
          }
        }
      },
      /*grain=*/std::max<int64_t>(1, 16384 / cols));
  return absl::OkStatus();
}

// ---- Rope ----------------------------------------------------------------------------------
// Angles: theta_i = freq_scale * (p * b^i / ff_i) with b = powf(base, -2 / rot_dim), where p * b^i
// is built by repeated F32 multiplication (p, p*b, p*b*b, ...) exactly as ggml does, so angles at
// large positions round like llama.cpp's. Per token rot_dim / 2 cos/sin pairs are computed once
// and applied to every head: 6 flops per rotated pair.
absl::Status CpuBackend::Rope(Tensor& x, int n_heads, absl::Span<const int32_t> pos,
                              const RopeParams& p) {
  PD_RETURN_IF_ERROR(CheckF32(x, "Rope x"));
  if (n_heads <= 0 || p.head_dim <= 0 || p.rot_dim <= 0 || p.rot_dim % 2 != 0 ||
      p.rot_dim > p.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("Rope: n_heads ", n_heads, ", head_dim ",
                                                   p.head_dim, ", rot_dim ", p.rot_dim));
  }
  if (x.cols != static_cast<int64_t>(n_heads) * p.head_dim ||
      x.rows != static_cast<int64_t>(pos.size())) {
    return absl::InvalidArgumentError(absl::StrCat("Rope: x ", Describe(x), " for ", pos.size(),
                                                   " positions of ", n_heads, " heads x ",
                                                   p.head_dim));
  }
  if (!p.freq_factors.empty() && static_cast<int>(p.freq_factors.size()) != p.rot_dim / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: ", p.freq_factors.size(), " freq_factors for rot_dim ", p.rot_dim));
  }
  if (!(p.freq_base > 0.f) || !std::isfinite(p.freq_base) || !std::isfinite(p.freq_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: freq_base ", p.freq_base, ", freq_scale ", p.freq_scale));
  }
  const int half = p.rot_dim / 2;
  const float theta_scale = std::pow(p.freq_base, -2.f / static_cast<float>(p.rot_dim));
  const bool neox = p.mode == RopeMode::kNeox;
  pool_.ParallelFor(
      x.rows,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> cs(2 * static_cast<size_t>(half));  // cosines, then sines
        float* cosv = cs.data();
        float* sinv = cs.data() + half;
        for (int64_t t = t0; t < t1; ++t) {
          float theta_base = static_cast<float>(pos[t]);
          for (int i = 0; i < half; ++i) {
            const float ff = p.freq_factors.empty() ? 1.f : p.freq_factors[i];
            const float theta = p.freq_scale * (theta_base / ff);
            cosv[i] = std::cos(theta);
            sinv[i] = std::sin(theta);
            theta_base *= theta_scale;
          }
          float* row = RowF32(x, t);
          for (int h = 0; h < n_heads; ++h) {
            float* v = row + static_cast<int64_t>(h) * p.head_dim;
            (neox ? k_.rope_neox : k_.rope_normal)(v, cosv, sinv, half);
          }
        }
      },
      /*grain=*/std::max<int64_t>(1, 4096 / x.cols));
  return absl::OkStatus();
}

// ---- elementwise ---------------------------------------------------------------------------
// Add / SwiGlu / GeGlu treat their operands as flat arrays (identical shapes, contiguous rows).
constexpr int64_t kElementwiseGrain = 16384;

// Three F32 operands of one shape (the binary elementwise ops).
absl::Status CheckBinary(const Tensor& a, const Tensor& b, const Tensor& y, const char* op) {
  // Messages name the op only: building "op a" strings would cost an allocation on every call.
  PD_RETURN_IF_ERROR(CheckF32(a, op));
  PD_RETURN_IF_ERROR(CheckF32(b, op));
  PD_RETURN_IF_ERROR(CheckF32(y, op));
  PD_RETURN_IF_ERROR(CheckSameShape(a, b, op));
  return CheckSameShape(a, y, op);
}

absl::Status CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckBinary(a, b, y, "Add"));
  const float* pa = static_cast<const float*>(a.data);
  const float* pb = static_cast<const float*>(b.data);
  float* py = static_cast<float*>(y.data);
  pool_.ParallelFor(
      a.numel(), [&](int64_t i0, int64_t i1) { k_.add(pa + i0, pb + i0, py + i0, i1 - i0); },
      kElementwiseGrain);
  return absl::OkStatus();
}

absl::Status CpuBackend::AddBias(const Tensor& x, const Tensor& bias, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(x, "AddBias x"));
  PD_RETURN_IF_ERROR(CheckF32(bias, "AddBias bias"));
  PD_RETURN_IF_ERROR(CheckF32(y, "AddBias y"));
  PD_RETURN_IF_ERROR(CheckSameShape(x, y, "AddBias"));
  if (bias.rows != 1 || bias.cols != x.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("AddBias: bias ", Describe(bias), " for x ", Describe(x)));
  }
  const int64_t cols = x.cols;
  if (cols == 0) return absl::OkStatus();
  const float* pb = static_cast<const float*>(bias.data);
  pool_.ParallelFor(
      x.rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) k_.add(RowF32(x, r), pb, RowF32(y, r), cols);
      },
      std::max<int64_t>(1, kElementwiseGrain / cols));
  return absl::OkStatus();
}

absl::Status CpuBackend::SwiGlu(const Tensor& gate, const Tensor& up, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckBinary(gate, up, y, "SwiGlu"));
  const float* pg = static_cast<const float*>(gate.data);
  const float* pu = static_cast<const float*>(up.data);
  float* py = static_cast<float*>(y.data);
  // ggml_vec_swiglu_f32 runs each row in vectors of `lanes` (ggml's vector expf), then the row's
  // last cols % lanes elements through libm's expf.
  const int64_t cols = gate.cols, vec_cols = cols - cols % k_.attn().lanes;
  pool_.ParallelFor(
      gate.numel(),
      [&](int64_t i0, int64_t i1) {
        k_.swiglu(pg + i0, pu + i0, py + i0, i1 - i0);
        if (vec_cols == cols) return;
        for (int64_t r = i0 / cols; r * cols < i1; ++r) {
          for (int64_t i = std::max(i0, r * cols + vec_cols); i < std::min(i1, (r + 1) * cols);
               ++i) {
            py[i] = pg[i] / (1.f + std::exp(-pg[i])) * pu[i];
          }
        }
      },
      kElementwiseGrain / 4);
  return absl::OkStatus();
}

namespace {

// gelu(x) for every f16 bit pattern x, rounded to f16 (ggml's table) and stored widened to f32:
// 65536 entries (256 KiB), built once.
const float* GeluTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    constexpr float kSqrt2OverPi = 0.79788456080286535588f;
    for (uint32_t i = 0; i < 65536; ++i) {
      const float x = F16ToF32(static_cast<uint16_t>(i));
      // ggml's gelu with the one product GCC fuses in llama.cpp's build: 1 + (a x) x.
      const float inner = std::fma(0.044715f * x, x, 1.0f);
      const float g = (0.5f * x) * (1.0f + std::tanh((kSqrt2OverPi * x) * inner));
      t[i] = F16ToF32(F32ToF16(g));
    }
    return t;
  }();
  return table.data();
}

}  // namespace

// The gate values are narrowed to f16 by the kernel table (vectorized, round to nearest even
// like F32ToF16) a block at a time and looked up in an f32 table: per element one 2-byte store,
// one table load and the clamps, instead of two branchy software conversions (was 7% of a
// 512-token Gemma 3 prefill).
absl::Status CpuBackend::GeGlu(const Tensor& gate, const Tensor& up, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckBinary(gate, up, y, "GeGlu"));
  const float* pg = static_cast<const float*>(gate.data);
  const float* pu = static_cast<const float*>(up.data);
  float* py = static_cast<float*>(y.data);
  const float* table = GeluTable();
  pool_.ParallelFor(
      gate.numel(),
      [&](int64_t i0, int64_t i1) {
        constexpr int64_t kBlock = 256;
        uint16_t h[kBlock];
        for (int64_t b = i0; b < i1; b += kBlock) {
          const int64_t n = std::min(kBlock, i1 - b);
          k_.f32_to_f16(pg + b, h, n);
          for (int64_t j = 0; j < n; ++j) {
            const float g = pg[b + j];
            // As ggml: +0 below -10 (not 0 times up, which could be -0).
            py[b + j] = g <= -10.0f ? 0.0f : (g >= 10.0f ? g : table[h[j]]) * pu[b + j];
          }
        }
      },
      kElementwiseGrain / 4);
  return absl::OkStatus();
}

absl::Status CpuBackend::Scale(const Tensor& x, float s, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(x, "Scale x"));
  PD_RETURN_IF_ERROR(CheckF32(y, "Scale y"));
  PD_RETURN_IF_ERROR(CheckSameShape(x, y, "Scale"));
  const float* px = static_cast<const float*>(x.data);
  float* py = static_cast<float*>(y.data);
  pool_.ParallelFor(
      x.numel(), [&](int64_t i0, int64_t i1) { k_.scale(px + i0, s, py + i0, i1 - i0); },
      kElementwiseGrain);
  return absl::OkStatus();
}

// Scalar on every CPU: tanhf is libm's, as in ggml's CPU backend, so the results are llama.cpp's.
absl::Status CpuBackend::Softcap(const Tensor& x, float cap, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(x, "Softcap x"));
  PD_RETURN_IF_ERROR(CheckF32(y, "Softcap y"));
  PD_RETURN_IF_ERROR(CheckSameShape(x, y, "Softcap"));
  if (!(cap > 0) || !std::isfinite(cap)) {
    return absl::InvalidArgumentError(StrCat("Softcap: cap ", cap, " must be finite and > 0"));
  }
  const float* px = static_cast<const float*>(x.data);
  float* py = static_cast<float*>(y.data);
  const float inv = 1.0f / cap;
  pool_.ParallelFor(
      x.numel(),
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) py[i] = std::tanh(px[i] * inv) * cap;
      },
      kElementwiseGrain);
  return absl::OkStatus();
}

// Rows of y in parallel; within a row the slots in order, so that the sums are llama.cpp's: a
// product then an add per slot, each rounded to F32 (this file is built without FMA and with
// ISO C++, where GCC does not contract a * b + c).
absl::Status CpuBackend::MoeCombine(const Tensor& rows, absl::Span<const int32_t> index,
                                    absl::Span<const float> weights, int k, Tensor& y) {
  PD_RETURN_IF_ERROR(CheckF32(rows, "MoeCombine rows"));
  PD_RETURN_IF_ERROR(CheckF32(y, "MoeCombine y"));
  if (k < 1 || index.size() != weights.size() ||
      index.size() != static_cast<size_t>(y.rows) * static_cast<size_t>(k) ||
      rows.cols != y.cols) {
    return absl::InvalidArgumentError(StrCat("MoeCombine: rows ", Describe(rows), ", y ",
                                             Describe(y), ", k = ", k, ", ", index.size(),
                                             " indices and ", weights.size(), " weights"));
  }
  if (rows.data == y.data) return absl::InvalidArgumentError("MoeCombine: y aliases rows");
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0 || index[i] >= rows.rows) {
      return absl::InvalidArgumentError(StrCat("MoeCombine: index[", i, "] = ", index[i],
                                               " is outside the ", rows.rows, " rows"));
    }
  }
  const int64_t cols = y.cols;
  pool_.ParallelFor(
      y.rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* out = RowF32(y, r);
          const size_t s0 = static_cast<size_t>(r) * k;
          const float* first = RowF32(rows, index[s0]);
          const float w0 = weights[s0];
          for (int64_t c = 0; c < cols; ++c) out[c] = first[c] * w0;
          for (int j = 1; j < k; ++j) {
            const float* src = RowF32(rows, index[s0 + j]);
            const float w = weights[s0 + j];
            for (int64_t c = 0; c < cols; ++c) out[c] += src[c] * w;
          }
        }
      },
      std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)));
  return absl::OkStatus();
}

// A row of all -inf (everything masked) becomes all zeros rather than NaN.
absl::Status CpuBackend::Softmax(Tensor& x) {
  PD_RETURN_IF_ERROR(CheckF32(x, "Softmax x"));
  const int64_t cols = x.cols;
  if (cols == 0) return absl::OkStatus();
  pool_.ParallelFor(
      x.rows,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          float* row = RowF32(x, r);
          const float m = k_.max(row, cols);
          if (m == -std::numeric_limits<float>::infinity()) {
            std::memset(row, 0, cols * sizeof(float));
            continue;
          }
          const double sum = k_.exp_sub_sum(row, m, row, cols);
          k_.scale(row, static_cast<float>(1.0 / sum), row, cols);
        }
      },
      std::max<int64_t>(1, 4096 / cols));
  return absl::OkStatus();
}

// ---- sampling ------------------------------------------------------------------------------
// Rows in parallel when there are enough of them; otherwise each row is cut into one chunk per
// thread, every chunk keeps its own best k (top_k.h) and one merge of those lists gives the row's:
// a batch-1 decode step's 262k logits take every core, not one.
absl::Status CpuBackend::TopK(const Tensor& x, int k, Tensor& values, int32_t* ids) {
  PD_RETURN_IF_ERROR(CheckF32(x, "TopK x"));
  PD_RETURN_IF_ERROR(CheckF32(values, "TopK values"));
  if (k < 1 || k > kMaxTopK || k > x.cols) {
    return absl::InvalidArgumentError(absl::StrCat("TopK: k = ", k, " is outside [1, min(",
                                                   x.cols, " columns, ", kMaxTopK, ")]"));
  }
  if (values.rows != x.rows || values.cols != k) {
    return absl::InvalidArgumentError(absl::StrCat("TopK: values ", Describe(values), " for x ",
                                                   Describe(x), " and k = ", k));
  }
  if (ids == nullptr && x.rows > 0) return absl::InvalidArgumentError("TopK: null ids");
  const int threads = pool_.num_threads();
  // Chunks shorter than this are not worth a thread (a merge costs about chunks * k entries).
  constexpr int64_t kMinChunk = 16384;
  const int64_t chunks = std::min<int64_t>(threads, x.cols / std::max<int64_t>(kMinChunk, 4 * k));
  if (x.rows >= threads || chunks < 2) {
    pool_.ParallelFor(x.rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        RowTopK(RowF32(x, r), x.cols, k, ids + r * k, RowF32(values, r));
      }
    });
    return absl::OkStatus();
  }
  std::vector<int32_t> cand_ids(static_cast<size_t>(chunks * k));
  std::vector<float> cand_values(cand_ids.size());
  const int64_t per_chunk = (x.cols + chunks - 1) / chunks;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* row = RowF32(x, r);
    pool_.ParallelFor(chunks, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t begin = c * per_chunk;
        const int64_t len = std::min(per_chunk, x.cols - begin);
        int32_t* cid = cand_ids.data() + c * k;
        // Every chunk holds at least 4k columns, so each keeps k entries.
        RowTopK(row + begin, len, k, cid, cand_values.data() + c * k);
        for (int j = 0; j < k; ++j) cid[j] += static_cast<int32_t>(begin);
      }
    });
    MergeTopK(cand_ids.data(), cand_values.data(), chunks * k, k, ids + r * k, RowF32(values, r));
  }
  return absl::OkStatus();
}

// ---- KV cache ------------------------------------------------------------------------------
// Per token: reads 4 * (k.cols + v.cols) bytes, writes that many cache bytes (F32), half (F16) or
// a quarter plus 4 bytes of scale per head (INT8: the head rotated into the stored basis,
// engine/backend/kv_rotation.h, then a max pass and a quantize pass).
absl::Status CpuBackend::StoreKv(const Tensor& k, const Tensor& v, KvTensor& k_cache,
                                 KvTensor& v_cache, const KvBatch& kv) {
  PD_RETURN_IF_ERROR(CheckF32(k, "StoreKv k"));
  PD_RETURN_IF_ERROR(CheckF32(v, "StoreKv v"));
  PD_RETURN_IF_ERROR(CheckCache(k_cache, kv, "StoreKv k_cache"));
  PD_RETURN_IF_ERROR(CheckCache(v_cache, kv, "StoreKv v_cache"));
  if (k.rows != v.rows || k.cols != k_cache.row_elems() || v.cols != v_cache.row_elems()) {
    return absl::InvalidArgumentError(absl::StrCat("StoreKv: k ", Describe(k), ", v ", Describe(v),
                                                   ", k_cache ", Describe(k_cache), ", v_cache ",
                                                   Describe(v_cache)));
  }
  PD_RETURN_IF_ERROR(CheckKvBatch(kv, k.rows));
  for (int64_t t = 0; t < k.rows; ++t) {
    PD_RETURN_IF_ERROR(CheckSlots(kv, kv.seq[t], kv.pos[t], kv.pos[t],
                                  std::min(k_cache.slots(), v_cache.slots())));
  }
  auto store = [&](const Tensor& src, KvTensor& cache, int64_t t) {
    const int64_t slot = SlotOf(kv, kv.seq[t], kv.pos[t]);
    const float* x = RowF32(src, t);
    switch (cache.type) {
      case KvDType::kF32:
        std::memcpy(cache.values(slot, 0), x, src.cols * sizeof(float));
        break;
      case KvDType::kF16:
        k_.f32_to_f16(x, reinterpret_cast<uint16_t*>(cache.values(slot, 0)), src.cols);
        break;
      case KvDType::kI8: {
        thread_local std::vector<float> rotated;
        rotated.resize(static_cast<size_t>(cache.head_dim));
        for (int h = 0; h < cache.n_kv_heads; ++h) {
          std::memcpy(rotated.data(), x + int64_t{h} * cache.head_dim,
                      static_cast<size_t>(cache.head_dim) * sizeof(float));
          const float d = cpu::QuantizeKvRowI8(
              k_, rotated.data(), reinterpret_cast<int8_t*>(cache.values(slot, h)), cache.head_dim);
          std::memcpy(cache.scale(slot, h), &d, sizeof(float));
        }
        break;
      }
    }
  };
  pool_.ParallelFor(
      k.rows,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          store(k, k_cache, t);
          store(v, v_cache, t);
        }
      },
      /*grain=*/std::max<int64_t>(1, 8192 / std::max<int64_t>(1, k.cols + v.cols)));
  return absl::OkStatus();
}

}  // namespace cpu

std::unique_ptr<Backend> CreateCpuBackend(const CpuBackendOptions& options) {
  int threads = options.threads;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<cpu::CpuBackend>(cpu::SelectKernels(options.force_scalar), threads,
                                           options.copy_weights, options.copy_weights_max_bytes);
}

absl::StatusOr<bool> CpuCopyWeightsFromEnv() {
  const char* v = std::getenv("PDSERVE_CPU_WEIGHTS");
  const std::string_view s = v == nullptr ? "" : v;
  if (s.empty() || s == "copy") return true;
  if (s == "mmap") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("PDSERVE_CPU_WEIGHTS='", std::string(s), "': expected copy or mmap (or unset)"));
}

absl::StatusOr<bool> CpuAttnGgmlOrderFromEnv() {
  const char* v = std::getenv("PDSERVE_ATTN_ORDER");
  const std::string_view s = v == nullptr ? "" : v;
  if (s.empty()) return false;
  if (s == "ggml") return true;
  return absl::InvalidArgumentError(
      absl::StrCat("PDSERVE_ATTN_ORDER='", std::string(s), "': expected ggml (or unset)"));
}

}  // namespace pd::engine
