// cpu::WorkerPool (kernels/cpu/worker_pool.h): every index visited exactly once for many
// sizes and thread counts (n = 0, n < threads, both wait paths: spinning and blocked),
// libgomp's static partition, the dynamic schedule, a worker taking a task while the caller
// is busy, exceptions (the first reaches the caller
// after every task finished), nested regions (inline), reuse over many calls, destruction
// while idle, and the default thread count.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/worker_pool.h"

namespace attnres::cpu {
namespace {

using std::chrono::microseconds;

const int64_t kSizes[] = {0, 1, 2, 3, 5, 7, 8, 9, 16, 17, 100, 1000, 12345};
const int kThreads[] = {1, 2, 3, 4, 8};
const microseconds kSpins[] = {microseconds(0), WorkerPool::kDefaultSpin};

void expect_each_once(const std::vector<std::atomic<int>>& visits, const std::string& what) {
  for (size_t i = 0; i < visits.size(); ++i)
    ASSERT_EQ(visits[i].load(), 1) << what << " index " << i;
}

TEST(WorkerPoolTest, StaticBlockIsLibgompsPartition) {
  for (int64_t n = 0; n <= 40; ++n) {
    for (int team = 1; team <= 9; ++team) {
      int64_t next = 0;
      for (int tid = 0; tid < team; ++tid) {
        const IndexRange r = static_block(n, tid, team);
        // Contiguous, in thread order, the first n % team threads one iteration more.
        const int64_t want = n / team + (tid < n % team ? 1 : 0);
        ASSERT_EQ(r.begin_, next) << "n " << n << " team " << team << " tid " << tid;
        ASSERT_EQ(r.size(), want) << "n " << n << " team " << team << " tid " << tid;
        next = r.end_;
      }
      ASSERT_EQ(next, n);
    }
  }
}

TEST(WorkerPoolTest, ParallelForVisitsEveryIndexOnce) {
  for (microseconds spin : kSpins) {
    for (int threads : kThreads) {
      WorkerPool pool(threads, spin);
      ASSERT_EQ(pool.size(), threads);
      for (int64_t n : kSizes) {
        for (bool parallel : {true, false}) {
          std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
          pool.parallel_for(n, parallel, [&](int64_t i) { visits[static_cast<size_t>(i)]++; });
          expect_each_once(visits, "threads " + std::to_string(threads) + " n " +
                                       std::to_string(n) + " spin " + std::to_string(spin.count()));
        }
      }
    }
  }
}

TEST(WorkerPoolTest, RunGivesEachTidOnce) {
  for (microseconds spin : kSpins) {
    for (int threads : kThreads) {
      WorkerPool pool(threads, spin);
      for (int team = 0; team <= threads + 2; ++team) {
        const int want = std::max(1, std::min(team, threads));
        std::vector<std::atomic<int>> seen(static_cast<size_t>(want));
        std::thread::id first;
        pool.run(team, [&](int tid, int n) {
          ASSERT_EQ(n, want);
          seen[static_cast<size_t>(tid)]++;
          if (tid == 0) first = std::this_thread::get_id();
        });
        expect_each_once(seen, "team " + std::to_string(team));
        EXPECT_EQ(first, std::this_thread::get_id());  // tid 0 is the caller
      }
    }
  }
}

TEST(WorkerPoolTest, DynamicScheduleVisitsEveryIndexOnce) {
  for (int threads : kThreads) {
    WorkerPool pool(threads);
    for (int64_t n : kSizes) {
      for (int64_t chunk : {1, 4, 7, 1000}) {
        std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
        DynamicSchedule schedule(n, chunk);
        pool.run(threads, [&](int, int) {
          for (int64_t i : schedule.claims()) visits[static_cast<size_t>(i)]++;
        });
        expect_each_once(visits, "threads " + std::to_string(threads) + " n " + std::to_string(n) +
                                     " chunk " + std::to_string(chunk));
      }
    }
  }
}

TEST(WorkerPoolTest, FirstExceptionReachesCallerAfterAllTasksFinish) {
  for (microseconds spin : kSpins) {
    for (int threads : {2, 3, 4}) {
      WorkerPool pool(threads, spin);
      for (int thrower = 0; thrower < threads; ++thrower) {
        std::atomic<int> finished{0};
        try {
          pool.run(threads, [&](int tid, int) {
            if (tid == thrower) {
              finished++;
              throw std::runtime_error("task " + std::to_string(tid));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));  // finishes last
            finished++;
          });
          FAIL() << "no exception";
        } catch (const std::runtime_error& e) {
          EXPECT_EQ(std::string(e.what()), "task " + std::to_string(thrower));
          EXPECT_EQ(finished.load(), threads);  // rethrown only after every task finished
        }
      }
      // Every task throws: exactly one exception comes out; the pool still works after.
      EXPECT_THROW(pool.run(threads, [](int, int) { throw std::logic_error("all"); }),
                   std::logic_error);
      std::vector<std::atomic<int>> visits(1000);
      pool.parallel_for(1000, true, [&](int64_t i) { visits[static_cast<size_t>(i)]++; });
      expect_each_once(visits, "after exceptions");
    }
  }
}

TEST(WorkerPoolTest, NestedRegionsRunInline) {
  WorkerPool pool(4);
  std::vector<std::atomic<int>> visits(4 * 100);
  pool.run(4, [&](int tid, int team) {
    ASSERT_EQ(team, 4);
    // A region inside a region: a team of one on this thread, no deadlock.
    pool.run(4, [&](int inner_tid, int inner_team) {
      EXPECT_EQ(inner_tid, 0);
      EXPECT_EQ(inner_team, 1);
    });
    pool.parallel_for(100, true, [&](int64_t i) { visits[static_cast<size_t>(tid * 100 + i)]++; });
  });
  expect_each_once(visits, "nested");
}

TEST(WorkerPoolTest, ReuseOverManyCalls) {
  for (microseconds spin : kSpins) {
    WorkerPool pool(3, spin);
    std::vector<int64_t> out(64);
    for (int call = 0; call < 2000; ++call) {
      const int64_t n = call % 65;
      pool.parallel_for(n, true, [&](int64_t i) { out[static_cast<size_t>(i)] = call + i; });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], call + i);
    }
  }
}

TEST(WorkerPoolTest, WakesBlockedWorkers) {
  WorkerPool pool(4, microseconds(20));
  for (int call = 0; call < 20; ++call) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // workers block meanwhile
    std::vector<std::atomic<int>> visits(1000);
    pool.parallel_for(1000, true, [&](int64_t i) { visits[static_cast<size_t>(i)]++; });
    expect_each_once(visits, "after a sleep");
  }
}

TEST(WorkerPoolTest, DestructionWhileIdle) {
  for (int round = 0; round < 50; ++round) {
    WorkerPool fresh(4);  // destroyed before its workers may even have started waiting
  }
  for (microseconds spin : kSpins) {
    WorkerPool used(4, spin);
    used.parallel_for(100, true, [](int64_t) {});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // workers blocked
  }
  WorkerPool spinning(4, std::chrono::seconds(10));
  spinning.parallel_for(100, true, [](int64_t) {});  // destroyed while its workers spin
}

TEST(WorkerPoolTest, ConcurrentCallersDoNotDeadlock) {
  // Against the contract (one driving thread), but safe: a region that finds the pool busy
  // runs inline.
  WorkerPool pool(2);
  auto hammer = [&] {
    for (int call = 0; call < 2000; ++call) {
      std::vector<std::atomic<int>> visits(50);
      pool.parallel_for(50, true, [&](int64_t i) { visits[static_cast<size_t>(i)]++; });
      expect_each_once(visits, "concurrent");
    }
  };
  std::thread other(hammer);
  hammer();
  other.join();
}

TEST(WorkerPoolTest, RunsInParallelWhenWorkersAreFree) {
  // Task 0 (the caller's) waits for task 1 to start (the contract forbids tasks waiting for
  // each other; here only to see that a worker does take task 1 while the caller is busy).
  WorkerPool pool(2);
  std::atomic<int> arrived{0};
  std::atomic<bool> together{false};
  pool.run(2, [&](int, int) {
    arrived++;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (arrived.load() == 2) together = true;
  });
  EXPECT_TRUE(together.load());
}

TEST(WorkerPoolTest, DefaultThreadCount) {
  const char* old = std::getenv("OMP_NUM_THREADS");
  const std::string saved = old ? old : "";
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(default_thread_count(), 3);
  setenv("OMP_NUM_THREADS", "2,1", 1);
  EXPECT_EQ(default_thread_count(), 2);
  unsetenv("OMP_NUM_THREADS");
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(default_thread_count(), CPU_COUNT(&set));
  setenv("OMP_NUM_THREADS", "zero", 1);  // not a positive integer: ignored
  EXPECT_EQ(default_thread_count(), CPU_COUNT(&set));
  if (old)
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(WorkerPool(0).size(), default_thread_count());
}

}  // namespace
}  // namespace attnres::cpu
