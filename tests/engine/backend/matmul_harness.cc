// One CPU-backend MatMul on data from files, for tests that compare it with another engine's
// matmul on the same bytes (tests/python/test_matmul_sweep.py against llama.cpp's ggml_mul_mat):
//
//   pd_matmul_harness TYPE K M N W X Y [THREADS] [ROPE]
//
// TYPE: a ggml type number (DType: 0 f32, 1 f16, 2 q4_0, 6 q5_0, 8 q8_0, 10..14 q2_K..q6_K,
// 30 bf16). W: M rows of K weights in that type (ggml's row layout, M * RowBytes bytes). X: N rows
// of K F32 activations. Y (written): N rows of M F32 outputs, y[n][m] = dot(x[n], w[m]), the N
// rows being one batch of one sequence (Backend::MatMul: llama.cpp's kernels for a mul_mat of N
// rows). The kernel set follows PDSERVE_CPU_ISA like every pdserve binary.
//
// With TYPE "rope-normal" or "rope-neox" it instead applies RoPE the way the CPU backend does
// (Kernels::rope_normal / rope_neox on the backend's angle cache) to N tokens of M heads of K
// values at positions 0..N-1, base 10000: X in, Y out ([N][M][K] F32), for the RoPE half of the
// same comparison. With TYPE "swiglu", Backend::SwiGlu on N rows of K values: X holds the gate
// rows then the up rows (2 * N * K F32), Y gets N * K. Exit status 2 on bad arguments, 1 on an
// engine error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace {

using pd::engine::Backend;
using pd::engine::DType;
using pd::engine::Tensor;

bool ReadFile(const char* path, std::vector<char>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

bool WriteFile(const char* path, const void* data, size_t n) {
  std::FILE* f = std::fopen(path, "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, 1, n, f) == n;
  return std::fclose(f) == 0 && ok;
}

int Fail(const char* what) {
  std::fprintf(stderr, "pd_matmul_harness: %s\n", what);
  return 2;
}

int Rope(bool neox, int64_t k, int64_t m, int64_t n, const std::vector<char>& x_bytes,
         const char* y_path, int threads) {
  if (x_bytes.size() != static_cast<size_t>(n * m * k) * sizeof(float)) return Fail("X size");
  std::unique_ptr<Backend> be = pd::engine::CreateCpuBackend({.threads = threads});
  std::vector<float> v(n * m * k);
  std::memcpy(v.data(), x_bytes.data(), x_bytes.size());
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i);
  Tensor t{DType::kF32, m * k, n, v.data()};  // [n_tokens, n_heads * head_dim]
  pd::engine::RopeParams p;
  p.mode = neox ? pd::engine::RopeMode::kNeox : pd::engine::RopeMode::kNormal;
  p.head_dim = static_cast<int>(k);
  p.rot_dim = static_cast<int>(k);
  if (absl::Status s = be->Rope(t, static_cast<int>(m), pos, p); !s.ok()) {
    std::fprintf(stderr, "pd_matmul_harness: %s\n", s.ToString().c_str());
    return 1;
  }
  return WriteFile(y_path, v.data(), v.size() * sizeof(float)) ? 0 : Fail("cannot write Y");
}

int SwiGlu(int64_t k, int64_t n, std::vector<char>& x_bytes, const char* y_path, int threads) {
  if (x_bytes.size() != static_cast<size_t>(2 * n * k) * sizeof(float)) return Fail("X size");
  std::unique_ptr<Backend> be = pd::engine::CreateCpuBackend({.threads = threads});
  float* g = reinterpret_cast<float*>(x_bytes.data());
  std::vector<float> y(n * k);
  const Tensor gate{DType::kF32, k, n, g}, up{DType::kF32, k, n, g + n * k};
  Tensor out{DType::kF32, k, n, y.data()};
  if (absl::Status s = be->SwiGlu(gate, up, out); !s.ok()) {
    std::fprintf(stderr, "pd_matmul_harness: %s\n", s.ToString().c_str());
    return 1;
  }
  return WriteFile(y_path, y.data(), y.size() * sizeof(float)) ? 0 : Fail("cannot write Y");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8 || argc > 9) {
    return Fail("usage: pd_matmul_harness TYPE|rope-normal|rope-neox|swiglu K M N W X Y [THREADS]");
  }
  const std::string type = argv[1];
  const int64_t k = std::atoll(argv[2]), m = std::atoll(argv[3]), n = std::atoll(argv[4]);
  const int threads = argc > 8 ? std::atoi(argv[8]) : 2;
  if (k <= 0 || m <= 0 || n <= 0 || threads <= 0) return Fail("K, M, N, THREADS must be > 0");
  std::vector<char> w_bytes, x_bytes;
  if (!ReadFile(argv[6], &x_bytes)) return Fail("cannot read X");
  if (type == "swiglu") return SwiGlu(k, n, x_bytes, argv[7], threads);
  if (type == "rope-normal" || type == "rope-neox") {
    return Rope(type == "rope-neox", k, m, n, x_bytes, argv[7], threads);
  }
  const std::optional<DType> dt = pd::engine::DTypeFromGgml(std::atoi(argv[1]));
  if (!dt) return Fail("unknown TYPE");
  if (k % pd::engine::Traits(*dt).block_size != 0) return Fail("K is not a multiple of the block");
  if (!ReadFile(argv[5], &w_bytes)) return Fail("cannot read W");
  if (w_bytes.size() != pd::engine::RowBytes(*dt, k) * static_cast<size_t>(m)) {
    return Fail("W size does not match TYPE, K, M");
  }
  if (x_bytes.size() != static_cast<size_t>(n * k) * sizeof(float)) return Fail("X size");
  std::unique_ptr<Backend> be = pd::engine::CreateCpuBackend({.threads = threads});
  const Tensor w{*dt, k, m, w_bytes.data()};
  const Tensor x{DType::kF32, k, n, x_bytes.data()};
  std::vector<float> y_data(n * m);
  Tensor y{DType::kF32, m, n, y_data.data()};
  if (absl::Status s = be->MatMul(w, x, y); !s.ok()) {
    std::fprintf(stderr, "pd_matmul_harness: %s\n", s.ToString().c_str());
    return 1;
  }
  return WriteFile(argv[7], y_data.data(), y_data.size() * sizeof(float)) ? 0
                                                                           : Fail("cannot write Y");
}
