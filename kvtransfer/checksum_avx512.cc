// XXH3 with its AVX-512 loop (this file is compiled with -mavx512f; used only when CPUID has
// AVX512F). Same results as the other builds; about 1.5x the AVX2 loop's speed on data in L2.
#include <cstddef>
#include <cstdint>

#include "kvtransfer/checksum.h"
#include "kvtransfer/checksum_impl.inc"

namespace pd::kvtransfer::internal {
const ChecksumImpl& ChecksumAvx512() {
  static const ChecksumImpl impl{&OneShot, kStateBytes, &Reset, &Update, &Digest};
  return impl;
}
}  // namespace pd::kvtransfer::internal
