#include "kvtransfer/checksum.h"

#include <new>

#include "engine/backend/cpu/kernels.h"

// The generic build (SSE2 on x86-64) of the same functions.
#include "kvtransfer/checksum_impl.inc"

namespace pd::kvtransfer {
namespace internal {
const ChecksumImpl& ChecksumGeneric() {
  static const ChecksumImpl impl{&OneShot, kStateBytes, &Reset, &Update, &Digest};
  return impl;
}
}  // namespace internal

namespace {
const internal::ChecksumImpl& Impl() {
#if defined(__x86_64__)
  // The same digests on every path; PDSERVE_CPU_ISA (engine/backend/cpu/kernels.h) caps the
  // instruction set here too, so that a capped run uses no AVX-512 code anywhere.
  using engine::cpu::CpuIsa;
  const CpuIsa cap = engine::cpu::CpuIsaCap();
  static const internal::ChecksumImpl& impl =
      cap >= CpuIsa::kAvx512 && __builtin_cpu_supports("avx512f") ? internal::ChecksumAvx512()
      : cap >= CpuIsa::kAvx2 && __builtin_cpu_supports("avx2")    ? internal::ChecksumAvx2()
                                                                  : internal::ChecksumGeneric();
#else
  static const internal::ChecksumImpl& impl = internal::ChecksumGeneric();
#endif
  return impl;
}
}  // namespace

uint64_t Checksum64(const void* data, size_t n) { return Impl().oneshot(data, n); }

// XXH3_state_t wants 64-byte alignment.
Checksum64Stream::Checksum64Stream()
    : state_(::operator new(Impl().state_bytes, std::align_val_t{64})) {
  Impl().reset(state_);
}
Checksum64Stream::~Checksum64Stream() { ::operator delete(state_, std::align_val_t{64}); }
void Checksum64Stream::Update(const void* data, size_t n) { Impl().update(state_, data, n); }
uint64_t Checksum64Stream::Digest() const { return Impl().digest(state_); }

}  // namespace pd::kvtransfer
