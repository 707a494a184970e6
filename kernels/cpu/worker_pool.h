// cpu::WorkerPool: the CPU backend's threads (replaces OpenMP; issue #19). size() - 1
// persistent workers plus the calling thread run one parallel region at a time.
//
// Why not OpenMP: libgomp's idle threads and barriers spin for a long time (up to about
// 300,000 polls), so whenever another process wants the same cores (a benchmark client, a
// build, a neighbour) the spinning threads and the work they wait for fight over them and a
// forward slows down 5-10x. Here every wait (a worker waiting for work, the caller waiting
// for the workers) spins for at most kDefaultSpin, then blocks in the kernel (a futex through
// std::atomic::wait) until it is woken.
//
// Threading contract: a pool is driven by one thread at a time, the thread that owns its
// CpuBackend (the engine thread, or a tensor-parallel rank's thread: every backend has its
// own pool). A region opened while another region of the same pool is running (nested: a
// task that calls run / parallel_for, or, against the contract, a second thread) does not
// wait for workers: it runs inline on the calling thread as a team of one, so it cannot
// deadlock. Destroy a pool only while no region is running.
//
// Tasks, not threads: a region of `team` is team tasks fn(tid, team). The caller runs task 0,
// then takes any task no worker has started yet; a worker woken for the region takes the
// next task left, if any. So a region never waits for a worker that has not started (its
// core taken by another process): the caller does that worker's share instead, and the
// region ends when every task has finished, whoever ran it. What a task computes depends
// only on its tid (static_block, per-task scratch), never on the OS thread, so results do
// not change with who ran what.
//
// Exceptions: an exception thrown by a task does not stop the others; run() returns only
// after every task of the region has finished, then rethrows the first exception caught
// (the others are dropped).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace attnres::cpu {

// The CPU backend's default thread count: OMP_NUM_THREADS when it holds a positive integer
// (kept from the OpenMP days: tests and mpirun launches set it to 1), else the number of CPUs
// in this process's affinity mask (sched_getaffinity: a container's cpuset, taskset), else
// std::thread::hardware_concurrency(); at least 1.
int default_thread_count();

// [begin, end) as a range of int64_t indices (`for (int64_t i : range)`).
struct IndexRange {
  int64_t begin_, end_;
  struct iterator {
    int64_t i;
    int64_t operator*() const { return i; }
    iterator& operator++() {
      ++i;
      return *this;
    }
    bool operator!=(const iterator& o) const { return i != o.i; }
  };
  iterator begin() const { return {begin_}; }
  iterator end() const { return {end_}; }
  int64_t size() const { return end_ - begin_; }
};

// The iterations of [0, n) that thread tid of a team of `team` runs under OpenMP's
// schedule(static) with no chunk size, as libgomp splits them: one contiguous block per
// thread, the first n % team threads one iteration more than the rest.
IndexRange static_block(int64_t n, int tid, int team);

// OpenMP's schedule(dynamic, chunk): threads claim chunks of `chunk` consecutive iterations
// of [0, n) in order, each as soon as it is done with its previous one. Make one per loop
// (shared by the team) and iterate `for (int64_t i : schedule.claims())` in each task.
class DynamicSchedule {
 public:
  DynamicSchedule(int64_t n, int64_t chunk) : n_(n), chunk_(chunk < 1 ? 1 : chunk) {}

  struct Sentinel {};
  class Iterator {
   public:
    explicit Iterator(DynamicSchedule* s) : s_(s) { claim(); }
    int64_t operator*() const { return i_; }
    Iterator& operator++() {
      if (++i_ == end_) claim();
      return *this;
    }
    bool operator!=(Sentinel) const { return i_ < end_; }

   private:
    void claim() {
      i_ = s_->next_.fetch_add(s_->chunk_, std::memory_order_relaxed);
      end_ = i_ < s_->n_ ? std::min(s_->n_, i_ + s_->chunk_) : i_;
    }
    DynamicSchedule* s_;
    int64_t i_ = 0, end_ = 0;
  };
  struct Claims {
    DynamicSchedule* s;
    Iterator begin() const { return Iterator(s); }
    Sentinel end() const { return {}; }
  };
  Claims claims() { return Claims{this}; }

 private:
  const int64_t n_, chunk_;
  std::atomic<int64_t> next_{0};
};

class WorkerPool {
 public:
  // How long a wait spins before it blocks (see worker_pool.cpp for the choice).
  static constexpr std::chrono::microseconds kDefaultSpin{50};

  // threads <= 0: default_thread_count(). Starts threads - 1 workers.
  explicit WorkerPool(int threads = 0, std::chrono::microseconds spin = kDefaultSpin);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Threads in a full team: the workers and the caller.
  int size() const { return size_; }

  // A parallel region (OpenMP's `#pragma omp parallel num_threads(team)`): fn(tid, team) once
  // for every tid in [0, team), concurrently on up to team threads, tid 0 on the calling
  // thread; returns when all returned. Tasks must not wait for each other (no barriers): one
  // thread may run several of them in turn. team is clamped to [1, size()]; a team of 1 (or a
  // nested region) is a plain call fn(0, 1).
  template <class F>
  void run(int team, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_erased(
        team, [](void* ctx, int tid, int n) { (*static_cast<Fn*>(ctx))(tid, n); },
        const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
  }

  // `#pragma omp parallel for schedule(static) num_threads(size()) if (parallel)` over
  // [0, n): fn(i) for each i, task tid running static_block(n, tid, team).
  template <class F>
  void parallel_for(int64_t n, bool parallel, F&& fn) {
    run(parallel ? size_ : 1, [&](int tid, int team) {
      for (int64_t i : static_block(n, tid, team)) fn(i);
    });
  }

 private:
  struct alignas(64) Slot {
    std::atomic<uint32_t> generation{0};  // set by the caller to wake this worker for a region
  };
  using Call = void (*)(void* ctx, int tid, int team);

  void run_erased(int team, Call call, void* ctx);
  void worker_main(int index);
  void stop_workers();
  // The next task of region `generation` nobody has taken, or -1 (the region is over or
  // every task is taken). On success *team is the region's team.
  int claim(uint32_t generation, int* team);
  void invoke(int tid, int team) noexcept;  // call_(ctx_, tid, team), keeping the first exception

  const int size_;
  const std::chrono::microseconds spin_;
  std::unique_ptr<Slot[]> slots_;  // one per worker
  std::vector<std::thread> workers_;
  uint32_t generation_ = 0;  // the caller's count of regions
  // The region being run: written by the caller before it publishes claim_ (release), read
  // only by whoever then claims one of its tasks (acquire).
  Call call_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};  // a region is running: another one runs inline
  // generation << 32 | team << 16 | next task to take.
  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<int32_t> done_{0};  // tasks finished by workers in this region
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace attnres::cpu
