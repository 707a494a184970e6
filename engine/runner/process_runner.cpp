#include "engine/runner/process_runner.h"

#include <iostream>

#include "engine/core/error.h"

namespace attnres {

ProcessGroupRunner::ProcessGroupRunner(ProcessGroup& group, const LoadMessage& load,
                                       const ModelConfig& config, const ModelWeights& weights,
                                       std::unique_ptr<Backend> backend,
                                       const ShardRank::CommunicatorFactory& make_communicator)
    : group_(group), vocab_size_(config.vocab_size) {
  ATTNRES_CHECK(group_.rank() == 0, "ProcessGroupRunner runs on rank 0");
  ShardRankOptions options;
  options.rank = 0;
  options.size = group_.size();
  options.num_kv_blocks = load.num_kv_blocks;
  options.block_size = load.block_size;
  options.kv_cache_dtype = load.args.kv_cache_dtype;
  options.depth_bank_dtype = load.args.depth_bank_dtype;
  options.sequence_parallel_min_tokens = load.args.sequence_parallel_min_tokens;
  std::string message = encode_load(load);
  group_.broadcast_control(message);
  try {
    shard_ = std::make_unique<ShardRank>(config, weights, options, std::move(backend),
                                         make_communicator);
  } catch (const std::exception& e) {
    // The others are building theirs and will wait for this rank at the barrier: fail the group
    // so that they stop waiting (the job cannot go on without rank 0's shard).
    group_.report_failure("rank 0 could not build its shard: " + std::string(e.what()));
    throw;
  }
  // A collective waiting for a rank that died throws once the group has failed.
  abort_target_->comm = &shard_->communicator();
  group_.set_failure_listener([target = abort_target_](const std::string& why) {
    std::lock_guard lock(target->mutex);
    if (target->comm) target->comm->abort(why);
  });
  try {
    group_.barrier();
  } catch (...) {
    stop_listening();
    throw;
  }
}

void ProcessGroupRunner::stop_listening() {
  group_.set_failure_listener({});
  std::lock_guard lock(abort_target_->mutex);  // waits for a call in flight
  abort_target_->comm = nullptr;
}

ProcessGroupRunner::~ProcessGroupRunner() {
  stop_listening();
  if (!group_.failure().empty()) return;
  try {
    std::string unload = encode_simple(ControlKind::Unload);
    group_.broadcast_control(unload);
  } catch (const std::exception&) {
    // The group failed meanwhile: nothing is listening.
  }
}

std::string ProcessGroupRunner::description() const {
  return shard_->backend().name() + " x" + std::to_string(group_.size()) + " processes (" +
         shard_->communicator().name() + ")";
}

void ProcessGroupRunner::execute(const StepBatch& batch, StepResult& result) {
  if (const std::string why = group_.failure(); !why.empty()) {
    throw Error("tensor parallelism: " + why);
  }
  result.sampled_ids.clear();  // sampled on the host
  result.depth_weights.clear();
  message_ = encode_step(batch);
  try {
    group_.broadcast_control(message_);
    shard_->step(batch.meta, batch.logit_rows, batch.depth_rows, &result.logits,
                 batch.wants_depth_weights() ? &result.depth_weights : nullptr);
  } catch (const std::exception& e) {
    // The group's failure names the rank that caused it; a local error is ours.
    const std::string why = group_.failure();
    if (why.empty()) group_.report_failure(std::string("rank 0 failed: ") + e.what());
    throw Error("tensor parallelism: " + (why.empty() ? std::string(e.what()) : why));
  }
}

DepthAttentionLayout ProcessGroupRunner::depth_attention_layout() const {
  return shard_->model().depth_attention_layout();
}

int run_process_worker(ProcessGroup& group, const ShardLoader& load) {
  const std::string me = group.describe(group.rank());
  std::unique_ptr<ShardRank> shard;
  StepBatch step;
  std::string message;
  // After this rank failed it computes nothing more: it keeps its heartbeat (which carries the
  // failure to rank 0) until rank 0 ends the job, instead of leaving first (an MPI job that
  // loses a process may be torn down before rank 0 has told its clients why).
  bool failed = false;
  try {
    for (;;) {
      group.broadcast_control(message);
      switch (control_kind(message)) {
        case ControlKind::Load:
          shard.reset();
          try {
            shard = load(decode_load(message));
          } catch (const std::exception& e) {
            // Rank 0's barrier fails with this reason.
            group.report_failure(me + " could not load its shard: " + e.what());
            failed = true;
            continue;
          }
          group.barrier();
          break;
        case ControlKind::Step:
          if (failed) continue;
          decode_step(message, step);
          try {
            if (!shard) throw Error("a step before any Load");
            shard->step(step.meta, step.logit_rows, step.depth_rows, nullptr, nullptr);
          } catch (const std::exception& e) {
            // Rank 0's collectives fail with this reason once the group has it.
            group.report_failure(me + " failed: " + e.what());
            failed = true;
          }
          break;
        case ControlKind::Unload:
          shard.reset();
          break;
        case ControlKind::Exit:
          return failed ? 1 : 0;
      }
    }
  } catch (const std::exception& e) {
    const std::string why = group.failure();
    std::cerr << "attnres: " << me << ": " << (why.empty() ? e.what() : why) << "\n";
    return 1;
  }
}

}  // namespace attnres
