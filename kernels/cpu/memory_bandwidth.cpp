// measure_copy_bandwidth_gbps: the STREAM-copy-like bandwidth of this machine. Buffers are
// 256 MiB each (far beyond any last-level cache) and first-touched by the threads that copy
// them, so pages land on the right NUMA node. Each thread memcpy's its own contiguous slice;
// the figure counts bytes read + bytes written (2 x 256 MiB per rep), best of several reps,
// after one warm-up rep. The threads: a cpu::WorkerPool of cpu::default_thread_count(), the
// CPU backend's default (slice tid is usually touched and copied by the same thread: with the
// cores idle every worker takes its region's task at once).
#include "kernels/cpu/memory_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/cpu/worker_pool.h"

namespace attnres {

double measure_copy_bandwidth_gbps() {
  constexpr size_t kBytes = size_t{256} << 20;
  constexpr int kReps = 6;
  char* src = static_cast<char*>(std::aligned_alloc(4096, kBytes));
  char* dst = static_cast<char*>(std::aligned_alloc(4096, kBytes));
  if (!src || !dst) {
    std::free(src);
    std::free(dst);
    throw std::bad_alloc();
  }
  cpu::WorkerPool pool;
  auto slice = [&](int tid, int nt, size_t* begin, size_t* len) {
    const size_t per = (kBytes / nt + 4095) / 4096 * 4096;
    *begin = std::min(kBytes, per * tid);
    *len = std::min(kBytes, *begin + per) - *begin;
  };
  pool.run(pool.size(), [&](int tid, int team) {
    size_t begin, len;
    slice(tid, team, &begin, &len);
    std::memset(src + begin, 1, len);
    std::memset(dst + begin, 0, len);
  });
  double best = 1e30;
  for (int rep = 0; rep <= kReps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run(pool.size(), [&](int tid, int team) {
      size_t begin, len;
      slice(tid, team, &begin, &len);
      std::memcpy(dst + begin, src + begin, len);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && s < best) best = s;  // rep 0 is the warm-up
  }
  std::free(src);
  std::free(dst);
  return 2.0 * static_cast<double>(kBytes) / best / 1e9;
}

}  // namespace attnres
