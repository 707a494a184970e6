// The continuous-batching scheduler: pure logic, no threads, no model. Each step it decides
// which sequences compute how many tokens, in the spirit of vLLM v1 / nano-vllm:
//
//   1. running sequences that decode (one token each), oldest first;
//   2. running sequences still prefilling (possibly after a preemption), a chunk each;
//   3. waiting sequences in arrival order (the front may be a preempted one), a chunk each,
//      while fewer than max_num_seqs run — and only if nothing was preempted this step. With
//      prefix caching, the chunk starts after the longest cached prefix of its tokens.
//
// Two separate questions gate every sequence, as in TensorRT-LLM's batch manager:
//   - the token budget (max_num_batched_tokens): how many tokens this step may compute.
//     With chunked prefill, a long prompt is split across steps to fit it.
//   - KV memory (BlockManager): whether the blocks for those tokens exist. When a running
//     sequence cannot grow, the most recently arrived running sequence not yet scheduled
//     this step (possibly itself) is preempted by recompute: its blocks are freed and it
//     returns to the front of the waiting queue with nothing computed; its output so far is
//     kept and re-run as prefill later. A waiting sequence that does not fit waits (FCFS:
//     nobody overtakes it).
// Nothing fails because other requests filled the cache; only a sequence that could not fit
// even in an empty cache is finished with an error.
#pragma once

#include <cstddef>
#include <deque>
#include <string_view>
#include <vector>

#include "engine/sched/block_manager.h"
#include "engine/sched/sequence.h"

namespace attnres {

struct SchedulerConfig {
  int max_num_seqs = 256;             // sequences running at once (decoding or prefilling)
  int max_num_batched_tokens = 2048;  // tokens computed per step, all sequences together
  int max_model_len = 4096;           // prompt + generated tokens of one sequence
  bool enable_chunked_prefill = true;

  // Throws attnres::Error naming the first invalid field.
  void validate() const;
};

// One sequence's share of a step: compute tokens [num_computed, num_computed + num_new_tokens)
// of seq->token_ids.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int num_new_tokens = 0;
  // The chunk ends at the sequence's last token, so the step yields its next-token logits
  // (a decode, or the last chunk of a prefill). Earlier prefill chunks only fill the cache.
  bool produces_logits = false;
};

struct ScheduleOutput {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<Sequence*> preempted;    // sent back to waiting during this schedule()
  std::vector<Sequence*> failed;       // finished with an error: can never fit in the cache
  int num_batched_tokens = 0;
  // Prefix cache (vLLM's prefix_cache_queries / _hits): tokens looked up for sequences
  // scheduled from waiting this step, and how many of them the cache had.
  int prefix_cache_queried_tokens = 0;
  int prefix_cache_hit_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager blocks);

  // Queues a new sequence (status Waiting, nothing computed) behind the others. The caller
  // owns it and keeps it alive until it is finished and no longer referenced here.
  void add(Sequence* seq);

  // Decides this step. Block tables are grown for the scheduled chunks; the caller then
  // builds the batch (add_to_batch advances each sequence's computed-token count). A
  // sequence scheduled from waiting with nothing computed first takes what the prefix cache
  // holds of its tokens.
  ScheduleOutput schedule();
  // After the step's forward computed them: registers the scheduled sequences' newly full
  // blocks in the prefix cache.
  void cache_computed_blocks(const ScheduleOutput& schedule);

  // Ends a sequence (a stop condition, or an abort): frees its blocks, drops it from the
  // queues, sets its status and reason. Idempotent for finished sequences.
  void finish(Sequence* seq, FinishReason reason, std::string error = {});
  // Finishes every unfinished sequence of a request with FinishReason::Abort; their blocks
  // are free when this returns. Returns them (empty when the id is unknown or done).
  std::vector<Sequence*> abort(std::string_view request_id);
  std::vector<Sequence*> abort_all();

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const BlockManager& block_manager() const { return blocks_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  // Schedules (part of) a running sequence, preempting others when blocks run out. Returns
  // false when the sequence itself was preempted or failed.
  bool schedule_running(Sequence* seq, int num_new_tokens, ScheduleOutput& out);
  // The running sequence to preempt: the most recently arrived one not yet scheduled.
  Sequence* pick_victim(const ScheduleOutput& out) const;
  void preempt(Sequence* seq, ScheduleOutput& out);
  // Cannot hold its tokens after this chunk even with every block free.
  bool can_never_fit(const Sequence& seq, int num_new_tokens) const;
  void fail(Sequence* seq, ScheduleOutput& out);
  void add_chunk(Sequence* seq, int num_new_tokens, ScheduleOutput& out);
  void insert_running(Sequence* seq);  // keeps running_ in arrival order

  SchedulerConfig config_;
  BlockManager blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // sorted by arrival_order
  int64_t num_preemptions_ = 0;
};

}  // namespace attnres
