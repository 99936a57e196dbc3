// Large host allocations backed by transparent huge pages where the kernel allows them.
//
// Most Linux distributions ship THP in "madvise" mode: a plain malloc of a KV cache or a transfer
// buffer gets 4 KiB pages. Every 4 KiB page costs a TLB entry when attention or a copy walks it,
// and a page-table walk when another process reads it with process_vm_readv (UCX's CMA path for
// KV transfer): on a 2-core machine that walk made the copy run at about half of memory speed.
// AllocHost asks for 2 MiB pages (MADV_HUGEPAGE) on allocations of at least 2 MiB; a kernel
// without THP simply keeps small pages.
#pragma once

#include <cstddef>

namespace pd {

// At least `bytes` bytes (one aligned block for 0) aligned to `alignment` (a power of two
// <= 4096), or nullptr when out of memory. Allocations of 2 MiB or more are 2 MiB-aligned and
// advised as huge pages. Free with std::free.
void* AllocHost(size_t bytes, size_t alignment = 64);

}  // namespace pd
