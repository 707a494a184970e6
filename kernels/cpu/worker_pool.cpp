// cpu::WorkerPool (worker_pool.h).
//
// The spin budget, kDefaultSpin = 50 us. Each wait first polls (with a pause instruction)
// and then blocks in std::atomic::wait (a futex on Linux):
// - Workers wait for the next region. Inside one forward the engine thread's serial work
//   between two ops (shape checks, small allocations) takes a few microseconds and a decode
//   op on two threads 10 us to 1 ms, so a worker that blocked after every op would pay a
//   futex wake-up (5-50 us, more when its core idles into a deep C-state) on most ops of the
//   step. 50 us keeps the workers polling across those gaps and lets them sleep between
//   steps (sampling, scheduling, an idle server) and whenever the caller is held up.
// - The caller waits for the tasks workers are running once no task is left to take. They
//   normally finish within a few microseconds of it (static schedules split the work
//   evenly); when one of them lost its core to another process the caller blocks after 50 us
//   and gives the core away instead of burning it for a scheduler time slice. (A worker that
//   has not started yet is not waited for: its task is taken by the caller; worker_pool.h.)
// So each wait wastes at most 50 us of a core someone else wants (libgomp's default spins
// about 300,000 polls, up to milliseconds, at every barrier and between regions).
// The budget is measured with steady_clock (vDSO, ~20 ns; read every 32 polls), not as a poll
// count: one pause instruction takes about 10 cycles on some x86 cores and 140 on others, so
// a fixed count would mean 10x different times across machines.
#include "kernels/cpu/worker_pool.h"

#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <string>

namespace attnres::cpu {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Returns the first value of `a` for which done(value) holds: polls for up to `spin`, then
// blocks until `a` changes (a notify from the writer), as often as needed.
template <class T, class Done>
T spin_then_block(const std::atomic<T>& a, Done done, std::chrono::microseconds spin) {
  T v = a.load(std::memory_order_acquire);
  if (done(v)) return v;
  if (spin.count() > 0) {
    const auto deadline = std::chrono::steady_clock::now() + spin;
    for (int polls = 1;; ++polls) {
      cpu_relax();
      v = a.load(std::memory_order_acquire);
      if (done(v)) return v;
      if (polls % 32 == 0 && std::chrono::steady_clock::now() >= deadline) break;
    }
  }
  for (;;) {
    a.wait(v, std::memory_order_acquire);  // returns once a no longer holds v
    v = a.load(std::memory_order_acquire);
    if (done(v)) return v;
  }
}

}  // namespace

int default_thread_count() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    // OpenMP's syntax: a comma-separated list per nesting level; the first level counts.
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && n > 0 && (*end == '\0' || *end == ','))
      return static_cast<int>(std::min(n, 4096L));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

IndexRange static_block(int64_t n, int tid, int team) {
  if (n <= 0 || team <= 1) return {0, std::max<int64_t>(n, 0)};
  int64_t q = n / team, t = n % team;
  if (tid < t) {
    t = 0;
    ++q;
  }
  const int64_t begin = q * tid + t;
  return {begin, begin + q};
}

WorkerPool::WorkerPool(int threads, std::chrono::microseconds spin)
    : size_(std::min(threads > 0 ? threads : default_thread_count(), 4096)),
      spin_(spin),
      slots_(new Slot[static_cast<size_t>(size_ > 1 ? size_ - 1 : 0)]) {
  try {
    workers_.reserve(static_cast<size_t>(size_ - 1));
    for (int w = 0; w < size_ - 1; ++w) workers_.emplace_back([this, w] { worker_main(w); });
  } catch (...) {
    stop_workers();  // the ones started so far
    throw;
  }
}

WorkerPool::~WorkerPool() { stop_workers(); }

void WorkerPool::stop_workers() {
  stop_.store(true, std::memory_order_relaxed);  // published by the release below
  for (size_t w = 0; w < workers_.size(); ++w) {
    slots_[w].generation.store(generation_ + 1, std::memory_order_release);
    slots_[w].generation.notify_one();
  }
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void WorkerPool::invoke(int tid, int team) noexcept {
  try {
    call_(ctx_, tid, team);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

int WorkerPool::claim(uint32_t generation, int* team) {
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(c >> 32) != generation) return -1;
    const int t = static_cast<int>((c >> 16) & 0xffff), next = static_cast<int>(c & 0xffff);
    if (next >= t) return -1;
    if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      *team = t;
      return next;
    }
  }
}

void WorkerPool::worker_main(int index) {
  {
    const std::string name = "attnres-cpu-" + std::to_string(index + 1);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  }
  Slot& slot = slots_[static_cast<size_t>(index)];
  uint32_t seen = 0;
  for (;;) {
    seen = spin_then_block(
        slot.generation, [seen](uint32_t v) { return v != seen; }, spin_);
    if (stop_.load(std::memory_order_relaxed)) return;
    // Take tasks of that region while there are any; none left (the caller or other workers
    // took them, or the region is over) is fine. After done_ is bumped the region may be over,
    // so nothing of it is touched again.
    int team = 0;
    for (int tid; (tid = claim(seen, &team)) >= 0;) {
      invoke(tid, team);
      done_.fetch_add(1, std::memory_order_acq_rel);
      done_.notify_one();  // a no-op unless the caller blocked
    }
  }
}

void WorkerPool::run_erased(int team, Call call, void* ctx) {
  team = std::min(team, size_);
  // A team of one, or a region inside a running one (nested, or another thread's): inline.
  if (team <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
    call(ctx, 0, 1);
    return;
  }
  const uint32_t generation = ++generation_;
  call_ = call;
  ctx_ = ctx;
  error_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  // Task 0 is the caller's; tasks 1 .. team - 1 go to whoever claims them first.
  claim_.store(uint64_t{generation} << 32 | static_cast<uint64_t>(team) << 16 | 1,
               std::memory_order_release);
  for (int w = 0; w < team - 1; ++w) {
    slots_[w].generation.store(generation, std::memory_order_release);
    slots_[w].generation.notify_one();  // a no-op unless that worker blocked
  }
  invoke(0, team);
  int mine = 1, claimed_team = 0;
  for (int tid; (tid = claim(generation, &claimed_team)) >= 0; ++mine) invoke(tid, team);
  // Every task is taken; wait for those the workers are running.
  spin_then_block(
      done_, [want = team - mine](int32_t v) { return v == want; }, spin_);
  std::exception_ptr error = std::exchange(error_, nullptr);
  busy_.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
}

}  // namespace attnres::cpu
