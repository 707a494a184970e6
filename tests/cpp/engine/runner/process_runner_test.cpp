// The multi-process runner (engine/runner/process_runner.h) without MPI: a FakeJob plays the
// launcher, its "processes" are threads, its control messages a queue per rank, its host
// collectives the in-process group. What is checked is the protocol: rank 0's ProcessGroupRunner
// and the workers' run_process_worker() give the same logits as the in-process tensor-parallel
// runner (the same ShardRank step, the same collectives: bit for bit), a worker that cannot load
// fails rank 0's construction with its reason, a group failure fails the next step with the
// rank's name, and Exit ends the workers with status 0. (mpirun itself: tests/python/test_mpi.py.)
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "engine/model/random_weights.h"
#include "engine/parallel/in_process_communicator.h"
#include "engine/runner/process_runner.h"
#include "engine/runner/tensor_parallel_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

// What the ranks of one fake job share.
struct FakeJob {
  explicit FakeJob(int size) : size(size), inbox(size), comms(InProcessGroup::create(size)) {}

  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::deque<std::string>> inbox;  // control messages per rank
  int arrived = 0;
  uint64_t barrier_generation = 0;
  std::string failure;
  std::vector<std::function<void(const std::string&)>> listeners;
  std::shared_ptr<InProcessGroup> comms;

  // What a rank's heartbeat would deliver: every rank learns it, waits throw.
  void fail(const std::string& why) {
    std::vector<std::function<void(const std::string&)>> to_tell;
    {
      std::lock_guard lock(mutex);
      if (!failure.empty()) return;
      failure = why;
      to_tell = listeners;
    }
    changed.notify_all();
    comms->abort(why);
    for (auto& listener : to_tell) {
      if (listener) listener(why);
    }
  }
};

class FakeProcessGroup : public ProcessGroup {
 public:
  FakeProcessGroup(FakeJob& job, int rank) : job_(job), rank_(rank) {
    std::lock_guard lock(job_.mutex);
    if (static_cast<int>(job_.listeners.size()) < job_.size) job_.listeners.resize(job_.size);
  }
  int rank() const override { return rank_; }
  int size() const override { return job_.size; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return job_.size; }
  std::string describe(int rank) const override {
    return "rank " + std::to_string(rank) + " (thread " + std::to_string(rank) + ")";
  }
  void broadcast_control(std::string& message) override {
    std::unique_lock lock(job_.mutex);
    if (!job_.failure.empty()) throw Error(job_.failure);
    if (rank_ == 0) {
      for (int r = 1; r < job_.size; ++r) job_.inbox[r].push_back(message);
      job_.changed.notify_all();
      return;
    }
    job_.changed.wait(lock, [&] { return !job_.inbox[rank_].empty() || !job_.failure.empty(); });
    if (job_.inbox[rank_].empty()) throw Error(job_.failure);
    message = std::move(job_.inbox[rank_].front());
    job_.inbox[rank_].pop_front();
  }
  void broadcast_bytes(void*, size_t, int) override { FAIL() << "not used on the CPU"; }
  void barrier() override {
    std::unique_lock lock(job_.mutex);
    if (!job_.failure.empty()) throw Error(job_.failure);
    const uint64_t generation = job_.barrier_generation;
    if (++job_.arrived == job_.size) {
      job_.arrived = 0;
      ++job_.barrier_generation;
      job_.changed.notify_all();
      return;
    }
    job_.changed.wait(
        lock, [&] { return job_.barrier_generation != generation || !job_.failure.empty(); });
    if (job_.barrier_generation == generation) throw Error(job_.failure);
  }
  std::unique_ptr<Communicator> host_communicator() override {
    return job_.comms->communicator(rank_);
  }
  void report_failure(const std::string& why) override { job_.fail(why); }
  void set_failure_listener(std::function<void(const std::string&)> listener) override {
    std::lock_guard lock(job_.mutex);
    job_.listeners[rank_] = std::move(listener);
  }
  std::string failure() const override {
    std::lock_guard lock(job_.mutex);
    return job_.failure;
  }

 private:
  FakeJob& job_;
  const int rank_;
};

const ModelConfig& config() {
  static const ModelConfig c = test::tp_test_config("block");
  return c;
}
const ModelWeights& weights() {
  static const ModelWeights w = make_random_weights(config(), {DType::F32, 21, false});
  return w;
}

constexpr int kBlockSize = 16, kTokens = 40, kPrefill = 33;
constexpr int kBlocks = (kTokens + kBlockSize - 1) / kBlockSize;

LoadMessage load_message(int size, int sp_min_tokens) {
  LoadMessage load;
  load.args.tensor_parallel_size = size;
  load.args.sequence_parallel_min_tokens = sp_min_tokens;
  load.args.kv_cache_dtype = DType::F32;  // rank 0 sends the resolved dtypes
  load.args.depth_bank_dtype = DType::F32;
  load.num_kv_blocks = kBlocks;
  load.block_size = kBlockSize;
  return load;
}

// Rank r's loader, as runner_factory's run_process_rank builds one: the shard of the same
// model on a CPU backend, with the job's host communicator.
ShardLoader loader_of_rank(FakeJob& job, int rank, int num_kv_blocks = 0) {
  return [&job, rank, num_kv_blocks](const LoadMessage& load) {
    ShardRankOptions options;
    options.rank = rank;
    options.size = job.size;
    options.num_kv_blocks = num_kv_blocks > 0 ? num_kv_blocks : load.num_kv_blocks;
    options.block_size = load.block_size;
    options.sequence_parallel_min_tokens = load.args.sequence_parallel_min_tokens;
    return std::make_unique<ShardRank>(
        config(), weights(), options, make_cpu_backend(1),
        [&job, rank](Backend&) { return job.comms->communicator(rank); });
  };
}

// Every rank but 0 on its own thread, each with its rank's loader; each records its exit status.
struct RankedWorkers {
  RankedWorkers(FakeJob& job, const std::function<ShardLoader(int)>& loader_for_rank)
      : status(job.size, -1) {
    for (int r = 1; r < job.size; ++r) {
      groups.push_back(std::make_unique<FakeProcessGroup>(job, r));
      threads.emplace_back([this, r, load = loader_for_rank(r), group = groups.back().get()] {
        status[r] = run_process_worker(*group, load);
      });
    }
  }
  void join() {
    for (std::thread& t : threads) t.join();
    threads.clear();
  }
  ~RankedWorkers() { join(); }
  std::vector<std::unique_ptr<FakeProcessGroup>> groups;
  std::vector<std::thread> threads;
  std::vector<int> status;
};

std::unique_ptr<ProcessGroupRunner> rank0_runner(FakeJob& job, FakeProcessGroup& group,
                                                 int sp_min_tokens) {
  return std::make_unique<ProcessGroupRunner>(
      group, load_message(job.size, sp_min_tokens), config(), weights(), make_cpu_backend(1),
      [&job](Backend&) { return job.comms->communicator(0); });
}

void say_exit(FakeProcessGroup& group) {
  std::string exit = encode_simple(ControlKind::Exit);
  group.broadcast_control(exit);
}

TEST(ProcessGroupRunner, GivesTheInProcessRunnersLogitsBitForBit) {
  const std::vector<int32_t> ids = test::random_ids(kTokens, config().vocab_size, 9);
  for (int P : {2, 4}) {
    for (int sp : {0, 1}) {
      TensorParallelRunner threads(config(), weights(),
                                   test::cpu_tensor_parallel_options(P, kBlocks, kBlockSize, sp));
      const std::vector<float> want =
          test::run_prefill_then_decode(threads, ids, kPrefill, kBlockSize);

      FakeJob job(P);
      FakeProcessGroup rank0(job, 0);
      RankedWorkers workers(job, [&job](int r) { return loader_of_rank(job, r); });
      {
        auto runner = rank0_runner(job, rank0, sp);
        const std::vector<float> got =
            test::run_prefill_then_decode(*runner, ids, kPrefill, kBlockSize);
        EXPECT_EQ(got, want) << "P=" << P << " sequence-parallel=" << sp;
      }  // Unload
      say_exit(rank0);
      workers.join();
      for (int r = 1; r < P; ++r) EXPECT_EQ(workers.status[r], 0) << "rank " << r;
    }
  }
}

TEST(ProcessGroupRunner, AWorkerThatCannotLoadFailsConstructionWithItsReason) {
  FakeJob job(2);
  FakeProcessGroup rank0(job, 0);
  RankedWorkers workers(job, [](int) -> ShardLoader {
    return [](const LoadMessage&) -> std::unique_ptr<ShardRank> {
      throw Error("config.json: no such file");
    };
  });
  try {
    rank0_runner(job, rank0, 0);
    FAIL() << "expected the worker's load failure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "rank 1 (thread 1) could not load its shard: config.json: no such file"),
              std::string::npos)
        << e.what();
  }
  workers.join();
  EXPECT_EQ(workers.status[1], 1);  // the group failed: the worker leaves with status 1
}

TEST(ProcessGroupRunner, AGroupFailureFailsTheNextStepNamingTheRank) {
  FakeJob job(2);
  FakeProcessGroup rank0(job, 0);
  RankedWorkers workers(job, [&job](int r) { return loader_of_rank(job, r); });
  auto runner = rank0_runner(job, rank0, 0);
  const std::vector<int32_t> ids = test::random_ids(8, config().vocab_size, 3);
  test::run_prefill_then_decode(*runner, ids, 8, kBlockSize);  // healthy
  // What the watchdog does when rank 1 stops answering.
  job.fail("rank 1 (thread 1) has not answered for 5 s: it died or hangs");
  try {
    test::run_prefill_then_decode(*runner, ids, 8, kBlockSize);
    FAIL() << "expected the group's failure";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "tensor parallelism: rank 1 (thread 1) has not answered for 5 s: it died or hangs");
  }
  runner.reset();  // sends nothing: the group failed
  workers.join();
  EXPECT_EQ(workers.status[1], 1);
}

TEST(ProcessGroupRunner, AWorkerWhoseStepFailsFailsRankZerosStepWithItsReason) {
  FakeJob job(2);
  FakeProcessGroup rank0(job, 0);
  // Rank 1's cache is one block: the 40-token prefill's KV slots overflow it there only.
  RankedWorkers workers(job, [&job](int r) { return loader_of_rank(job, r, 1); });
  auto runner = rank0_runner(job, rank0, 0);
  const std::vector<int32_t> ids = test::random_ids(kTokens, config().vocab_size, 4);
  try {
    test::run_prefill_then_decode(*runner, ids, kPrefill, kBlockSize);
    FAIL() << "expected rank 1's failure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor parallelism: rank 1 (thread 1) failed: "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
  runner.reset();
  workers.join();
  EXPECT_EQ(workers.status[1], 1);
}

TEST(ProcessGroupRunner, RankZeroThatCannotBuildItsShardReleasesTheWaitingWorkers) {
  FakeJob job(2);
  FakeProcessGroup rank0(job, 0);
  RankedWorkers workers(job, [&job](int r) { return loader_of_rank(job, r); });
  EXPECT_THROW(
      ProcessGroupRunner(
          rank0, load_message(2, 0), config(), weights(), make_cpu_backend(1),
          [](Backend&) -> std::unique_ptr<Communicator> { throw Error("no communicator"); }),
      Error);
  workers.join();  // must not hang in the barrier
  EXPECT_EQ(workers.status[1], 1);
  EXPECT_NE(job.failure.find("rank 0 could not build its shard: no communicator"),
            std::string::npos)
      << job.failure;
}

}  // namespace
}  // namespace attnres
