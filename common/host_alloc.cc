#include "common/host_alloc.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

namespace pd {

void* AllocHost(size_t bytes, size_t alignment) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : std::max<size_t>(alignment, 16);
  if (bytes > std::numeric_limits<size_t>::max() - align) return nullptr;
  const size_t rounded = std::max(align, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(align, rounded);
#ifdef MADV_HUGEPAGE
  if (p != nullptr && bytes >= kHuge) (void)::madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

}  // namespace pd
