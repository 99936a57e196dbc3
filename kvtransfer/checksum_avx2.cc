// XXH3 with its AVX2 loop (this file is compiled with -mavx2; used only when CPUID has AVX2).
#include <cstddef>
#include <cstdint>

#include "kvtransfer/checksum.h"
#include "kvtransfer/checksum_impl.inc"

namespace pd::kvtransfer::internal {
const ChecksumImpl& ChecksumAvx2() {
  static const ChecksumImpl impl{&OneShot, kStateBytes, &Reset, &Update, &Digest};
  return impl;
}
}  // namespace pd::kvtransfer::internal
