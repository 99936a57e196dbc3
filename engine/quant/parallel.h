// A minimal parallel loop for the quantizers (offline tools, not the serving path, which has the
// backend's thread pool): spawns up to `threads` std::threads per call and hands out index ranges
// through an atomic counter. Thread-safe as long as `fn` is for disjoint ranges.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace pd::engine {

// Threads to use when the caller says 0: every online core.
inline int DefaultThreads() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Calls fn(begin, end) over [0, n) in ranges of at most `grain` indices, on up to `threads`
// threads (0 = DefaultThreads()). Returns when every range is done. `fn` must not throw.
template <typename Fn>
void ParallelFor(int64_t n, int threads, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (threads <= 0) threads = DefaultThreads();
  const int64_t chunks = (n + grain - 1) / grain;
  const int workers = static_cast<int>(std::min<int64_t>(threads, chunks));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (;;) {
      const int64_t c = next.fetch_add(1);
      if (c >= chunks) return;
      fn(c * grain, std::min(n, (c + 1) * grain));
    }
  };
  if (workers <= 1) {
    work();
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int i = 0; i < workers - 1; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace pd::engine
