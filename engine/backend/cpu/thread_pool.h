// A fixed pool of worker threads for data-parallel loops inside one backend op.
//
// ParallelFor splits [0, n) into chunks that the calling thread and the workers claim from a
// shared atomic counter, so uneven chunks balance themselves. Dispatch is a generation counter
// that idle workers spin on briefly (an op follows the previous one within microseconds during
// decode) before sleeping in std::atomic::wait, so back-to-back ops cost well under 10 us each to
// dispatch while an idle pool burns no CPU.
//
// Ownership: the pool owns its threads; the destructor stops and joins them.
// Thread safety: ParallelFor may be called by one thread at a time (the backend's engine thread);
// it is not reentrant (fn must not call ParallelFor on the same pool).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace pd::engine::cpu {

class ThreadPool {
 public:
  // `num_threads` participants in total, the calling thread included (so num_threads - 1 workers
  // are started). Values < 1 mean 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges that together cover [0, n), each at least `grain`
  // long (except the last), on the caller and the workers; returns when all calls finished.
  // Runs inline when n <= grain or the pool has one thread.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn, int64_t grain = 1);

 private:
  void WorkerLoop();
  // Claims and runs chunks of the current job until none are left.
  void RunChunks();

  std::vector<std::thread> workers_;

  // The current job; written by the caller before `generation_` is bumped (release) and read by
  // workers after they observe the bump (acquire).
  const absl::FunctionRef<void(int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 1;
  alignas(64) std::atomic<int64_t> next_chunk_{0};
  alignas(64) std::atomic<uint64_t> generation_{0};  // bumped once per job; stop_ makes it final
  alignas(64) std::atomic<int> busy_workers_{0};     // workers still inside the current job
  std::atomic<bool> stop_{false};
};

}  // namespace pd::engine::cpu
