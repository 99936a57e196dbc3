#include "engine/backend/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PD_CPU_RELAX() _mm_pause()
#else
#define PD_CPU_RELAX() ((void)0)
#endif

namespace pd::engine::cpu {
namespace {
// Spin iterations before sleeping. _mm_pause is 10-140 cycles depending on the core, so this is
// tens of microseconds: long enough to bridge the gap between the ops of one forward pass.
constexpr int kSpinIterations = 1 << 11;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(1, num_threads) - 1;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  const int64_t num_chunks = (job_n_ + job_chunk_ - 1) / job_chunk_;
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= num_chunks) return;
    const int64_t begin = c * job_chunk_;
    (*job_fn_)(begin, std::min(job_n_, begin + job_chunk_));
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations; ++i) {
      PD_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    while (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_relaxed)) return;
    RunChunks();
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn,
                             int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  // About 4 chunks per thread so that a slow thread (another process on its core) is absorbed.
  const int64_t target_chunks = 4 * static_cast<int64_t>(num_threads());
  job_fn_ = &fn;
  job_n_ = n;
  job_chunk_ = std::max(grain, (n + target_chunks - 1) / target_chunks);
  next_chunk_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  RunChunks();
  // Wait for the workers: they may still be running their last chunk.
  int busy = busy_workers_.load(std::memory_order_acquire);
  for (int i = 0; busy != 0 && i < kSpinIterations; ++i) {
    PD_CPU_RELAX();
    busy = busy_workers_.load(std::memory_order_acquire);
  }
  while (busy != 0) {
    busy_workers_.wait(busy, std::memory_order_acquire);
    busy = busy_workers_.load(std::memory_order_acquire);
  }
  job_fn_ = nullptr;
}

}  // namespace pd::engine::cpu
