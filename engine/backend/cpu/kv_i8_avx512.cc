// F16 K/V rows into the INT8 KV scheme (kv_layout.h) and back, each in a single pass over 512-bit
// registers. Into it: F16 -> F32, the Hadamard rotation into the stored basis (kv_rotation.h) and
// the per-row INT8 quantization, bit-exact with F16ToF32 + RotateKvRow + QuantizeKvI8. Out of it:
// q * scale, the rotation back and F32 -> F16, bit-exact with those three steps
// (cpu_kernels_test compares both). The KV-transfer codec runs through them (kernels.h,
// quantize_kv_i8_f16 / dequantize_kv_i8_f16: the INT8 wire, and its import into an F16 cache):
// over 32 MiB of blocks the separate kernels cost ~200 and ~260 ns per 256-value row here, these
// ~105 and ~87.
//
// This file alone is compiled with -mavx512f -mavx512bw; its kernel runs only when CPUID reports
// both and the OS saves ZMM state.
#include "engine/backend/cpu/kernels.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)

#include <cpuid.h>
#include <immintrin.h>

#include <cstdint>

namespace pd::engine::cpu {
namespace {

// +1 in the lanes of `minus` cleared, -1 in those set.
inline __m512 Signs(__mmask16 minus) {
  return _mm512_mask_blend_ps(minus, _mm512_set1_ps(1.f), _mm512_set1_ps(-1.f));
}

// The butterfly stages of span 1, 2, 4 and 8 inside one register. With w = the lane-swapped copy
// (each lane holds its partner), a lower lane takes v + w and an upper one w - v: one FMA by +-1
// each (the product is exact, so the FMA rounds exactly as the addition or subtraction would).
inline __m512 StagesInRegister(__m512 v, const __m512* sign) {
  v = _mm512_fmadd_ps(v, sign[0], _mm512_permute_ps(v, 0xb1));       // lanes [1 0 3 2 ...]
  v = _mm512_fmadd_ps(v, sign[1], _mm512_permute_ps(v, 0x4e));       // lanes [2 3 0 1 ...]
  v = _mm512_fmadd_ps(v, sign[2], _mm512_shuffle_f32x4(v, v, 0xb1));  // 128-bit quarters 1 0 3 2
  return _mm512_fmadd_ps(v, sign[3], _mm512_shuffle_f32x4(v, v, 0x4e));  // quarters 2 3 0 1
}

// One stage across registers: r[j] and r[j + kLen] for each pair in blocks of 2 kLen.
template <int kRegs, int kLen>
inline void StageAcrossRegisters(__m512* r) {
#pragma GCC unroll 16
  for (int k = 0; k < kRegs / 2; ++k) {
    const int j = (k / kLen) * 2 * kLen + k % kLen;
    const __m512 u = r[j], v = r[j + kLen];
    r[j] = _mm512_add_ps(u, v);
    r[j + kLen] = _mm512_sub_ps(u, v);
  }
}

// head_dim = 16 kRegs, a power of two (so the rotation block is the whole row).
template <int kRegs>
float RowF16ToI8(const uint16_t* x, int8_t* q) {
  static_assert(kRegs >= 4 && kRegs <= 16 && (kRegs & (kRegs - 1)) == 0);
  const __m512 sign[4] = {Signs(0xaaaa), Signs(0xcccc), Signs(0xf0f0), Signs(0xff00)};
  __m512 r[kRegs];
#pragma GCC unroll 16
  for (int i = 0; i < kRegs; ++i) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16 * i));
    r[i] = StagesInRegister(_mm512_cvtph_ps(h), sign);
  }
  if constexpr (kRegs >= 2) StageAcrossRegisters<kRegs, 1>(r);
  if constexpr (kRegs >= 4) StageAcrossRegisters<kRegs, 2>(r);
  if constexpr (kRegs >= 8) StageAcrossRegisters<kRegs, 4>(r);
  if constexpr (kRegs >= 16) StageAcrossRegisters<kRegs, 8>(r);
  // Into the stored basis (x 1 / b, exact), then max |x| as a tree (max is exact in any order).
  const __m512 inv_b = _mm512_set1_ps(1.f / static_cast<float>(16 * kRegs));
  __m512 a[kRegs];
#pragma GCC unroll 16
  for (int i = 0; i < kRegs; ++i) {
    r[i] = _mm512_mul_ps(r[i], inv_b);
    a[i] = _mm512_abs_ps(r[i]);
  }
#pragma GCC unroll 16
  for (int w = kRegs / 2; w >= 1; w /= 2) {
#pragma GCC unroll 16
    for (int i = 0; i < w; ++i) a[i] = _mm512_max_ps(a[i], a[i + w]);
  }
  const float amax = _mm512_reduce_max_ps(a[0]);
  // QuantizeKvI8's arithmetic: scale = max / 127, q = round half to even (cvtps2dq under the
  // default MXCSR) of x * (1 / scale), in [-127, 127].
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i lowest = _mm512_set1_epi8(-127);
  // packs work within 128-bit lanes: after them dword 4k + j holds values 4k..4k+3 of register
  // j; the permutation puts each register's 16 bytes back in order.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
#pragma GCC unroll 4
  for (int i = 0; i < kRegs; i += 4) {
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(r[i], vid));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(r[i + 1], vid));
    const __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(r[i + 2], vid));
    const __m512i q3 = _mm512_cvtps_epi32(_mm512_mul_ps(r[i + 3], vid));
    const __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(q0, q1), _mm512_packs_epi32(q2, q3));
    _mm512_storeu_si512(q + 16 * i, _mm512_max_epi8(_mm512_permutexvar_epi32(order, p), lowest));
  }
  return d;
}

// The inverse: an INT8 row (head_dim = 16 kRegs values, `scale`) back to F16, H (q * scale).
template <int kRegs>
void RowI8ToF16(const int8_t* q, float scale, uint16_t* y) {
  static_assert(kRegs >= 4 && kRegs <= 16 && (kRegs & (kRegs - 1)) == 0);
  const __m512 sign[4] = {Signs(0xaaaa), Signs(0xcccc), Signs(0xf0f0), Signs(0xff00)};
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 r[kRegs];
#pragma GCC unroll 16
  for (int i = 0; i < kRegs; ++i) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * i));
    const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), vs);
    r[i] = StagesInRegister(x, sign);
  }
  if constexpr (kRegs >= 2) StageAcrossRegisters<kRegs, 1>(r);
  if constexpr (kRegs >= 4) StageAcrossRegisters<kRegs, 2>(r);
  if constexpr (kRegs >= 8) StageAcrossRegisters<kRegs, 4>(r);
  if constexpr (kRegs >= 16) StageAcrossRegisters<kRegs, 8>(r);
#pragma GCC unroll 16
  for (int i = 0; i < kRegs; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 16 * i),
                        _mm512_cvtps_ph(r[i], _MM_FROUND_TO_NEAREST_INT));
  }
}

// Of the three instantiations, the one for head_dim (64, 128 or 256); nullptr for other head
// dims, or on a CPU without AVX512F + BW and the OS's ZMM state.
template <typename Fn>
PD_NO_AVX512 Fn ForHeadDim(int head_dim, Fn for64, Fn for128, Fn for256) {
  static const bool ok = CpuHasAvx512(bit_AVX512F | bit_AVX512BW);
  if (!ok) return nullptr;
  return head_dim == 64 ? for64 : head_dim == 128 ? for128 : head_dim == 256 ? for256 : nullptr;
}

}  // namespace

PD_NO_AVX512 KvRowF16ToI8Fn Avx512KvRowF16ToI8(int head_dim) {
  return ForHeadDim<KvRowF16ToI8Fn>(head_dim, &RowF16ToI8<4>, &RowF16ToI8<8>, &RowF16ToI8<16>);
}

PD_NO_AVX512 KvRowI8ToF16Fn Avx512KvRowI8ToF16(int head_dim) {
  return ForHeadDim<KvRowI8ToF16Fn>(head_dim, &RowI8ToF16<4>, &RowI8ToF16<8>, &RowI8ToF16<16>);
}

}  // namespace pd::engine::cpu

#else  // built without AVX-512

namespace pd::engine::cpu {
KvRowF16ToI8Fn Avx512KvRowF16ToI8(int) { return nullptr; }
KvRowI8ToF16Fn Avx512KvRowI8ToF16(int) { return nullptr; }
}  // namespace pd::engine::cpu

#endif
