#include "kvtransfer/checksum.h"

#include <cstdlib>
#include <new>

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
  static const internal::ChecksumImpl& impl = __builtin_cpu_supports("avx2")
                                                   ? internal::ChecksumAvx2()
                                                   : internal::ChecksumGeneric();
#else
  static const internal::ChecksumImpl& impl = internal::ChecksumGeneric();
#endif
  return impl;
}
}  // namespace

uint64_t Checksum64(const void* data, size_t n) { return Impl().oneshot(data, n); }

// XXH3_state_t wants 64-byte alignment.
struct Checksum64Stream::State {
  void* mem = nullptr;
  ~State() { ::operator delete(mem, std::align_val_t{64}); }
};

Checksum64Stream::Checksum64Stream() : s_(std::make_unique<State>()) {
  s_->mem = ::operator new(Impl().state_bytes, std::align_val_t{64});
  Impl().reset(s_->mem);
}
Checksum64Stream::~Checksum64Stream() = default;
void Checksum64Stream::Update(const void* data, size_t n) { Impl().update(s_->mem, data, n); }
uint64_t Checksum64Stream::Digest() const { return Impl().digest(s_->mem); }

}  // namespace pd::kvtransfer
