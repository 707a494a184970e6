// Tensor parallelism with one rank per process (a job started by mpirun: process_group.h).
//
// Rank 0 runs the command. Its ModelRunner, ProcessGroupRunner, sends every other rank a Load
// message (they build their shards of the same model), then for each step a Step message with
// the batch, and runs its own shard of the step; the logits come back to it through the shards'
// all-gather, as in the in-process runner (shard_rank.h). The other ranks run
// run_process_worker(): a loop that obeys the control messages (process_control.h) until Exit.
//
// Failure: a rank whose forward throws reports it to the group; a rank that dies or hangs stops
// answering its heartbeats. Either way the group fails within its timeout, naming the rank, and
// rank 0's runner aborts its communicator (a collective waiting on the dead rank throws), so
// the step fails, the engine fails its requests with that error, and the server exits non-zero.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/parallel/process_group.h"
#include "engine/runner/model_runner.h"
#include "engine/runner/process_control.h"
#include "engine/runner/shard_rank.h"

namespace attnres {

class ProcessGroupRunner : public ModelRunner {
 public:
  // Sends `load` to the other ranks, builds rank 0's shard of `config` / `weights` on `backend`
  // with `make_communicator`, then waits until every rank has built its own (a rank that could
  // not fails the group, and this throws its reason).
  ProcessGroupRunner(ProcessGroup& group, const LoadMessage& load, const ModelConfig& config,
                     const ModelWeights& weights, std::unique_ptr<Backend> backend,
                     const ShardRank::CommunicatorFactory& make_communicator);
  // Tells the other ranks to drop their shards (unless the group failed).
  ~ProcessGroupRunner() override;

  int vocab_size() const override { return vocab_size_; }
  void execute(const StepBatch& batch, StepResult& result) override;
  DepthAttentionLayout depth_attention_layout() const override;

  const ShardRank& shard() const { return *shard_; }
  std::string description() const;

 private:
  // What the group's failure listener aborts (on the watchdog's thread): the shard's
  // communicator while it exists. The mutex makes "unset, then destroy" safe against a call in
  // flight.
  struct AbortTarget {
    std::mutex mutex;
    Communicator* comm = nullptr;
  };
  void stop_listening();

  ProcessGroup& group_;
  const int vocab_size_;
  std::shared_ptr<AbortTarget> abort_target_ = std::make_shared<AbortTarget>();
  std::unique_ptr<ShardRank> shard_;
  std::string message_;  // the step's encoding, its capacity reused
};

// Builds a rank's shard from a Load message (model loading, the backend and the communicator
// come from engine/sched: this library knows none of them).
using ShardLoader = std::function<std::unique_ptr<ShardRank>(const LoadMessage&)>;

// The loop of every rank but 0: obeys rank 0's control messages until Exit. Returns 0 after
// Exit, 1 when the group failed (the reason is logged to stderr, naming the rank).
int run_process_worker(ProcessGroup& group, const ShardLoader& load);

}  // namespace attnres
