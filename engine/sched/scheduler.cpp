#include "engine/sched/scheduler.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/core/error.h"

namespace attnres {
namespace {

void erase_value(std::vector<Sequence*>& list, const Sequence* seq) {
  list.erase(std::remove(list.begin(), list.end(), seq), list.end());
}

void erase_value(std::deque<Sequence*>& list, const Sequence* seq) {
  list.erase(std::remove(list.begin(), list.end(), seq), list.end());
}

bool is_scheduled(const ScheduleOutput& out, const Sequence* seq) {
  return std::any_of(out.chunks.begin(), out.chunks.end(),
                     [seq](const ScheduledChunk& c) { return c.seq == seq; });
}

}  // namespace

void SchedulerConfig::validate() const {
  auto fail = [](const std::string& field, int value, const std::string& expected) {
    throw Error("scheduler " + field + ": got " + std::to_string(value) + ", expected " + expected);
  };
  if (max_num_seqs < 1) fail("max_num_seqs", max_num_seqs, ">= 1");
  if (max_num_batched_tokens < 1) fail("max_num_batched_tokens", max_num_batched_tokens, ">= 1");
  if (max_model_len < 1) fail("max_model_len", max_model_len, ">= 1");
  // Without chunking a whole prompt must fit in one step's budget.
  if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
    fail("max_num_batched_tokens", max_num_batched_tokens,
         ">= max_model_len (" + std::to_string(max_model_len) + ") when chunked prefill is off");
  }
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager blocks)
    : config_(config), blocks_(std::move(blocks)) {
  config_.validate();
}

void Scheduler::add(Sequence* seq) {
  ATTNRES_CHECK(seq->num_tokens() > 0, "a sequence needs at least one prompt token");
  ATTNRES_CHECK(seq->blocks.table.empty(), "a new sequence already holds blocks");
  seq->status = SequenceStatus::Waiting;
  waiting_.push_back(seq);
}

ScheduleOutput Scheduler::schedule() {
  ScheduleOutput out;
  int budget = config_.max_num_batched_tokens;

  // 1. Decodes: one token each, never starved by prefills. Iterate over a snapshot because
  // preemption removes sequences from running_.
  const std::vector<Sequence*> snapshot = running_;
  for (Sequence* seq : snapshot) {
    if (budget == 0) break;
    if (seq->status != SequenceStatus::Running || !seq->is_decoding()) continue;
    if (schedule_running(seq, 1, out)) budget -= 1;
  }
  // 2. Running sequences that are still prefilling: the next chunk each.
  for (Sequence* seq : snapshot) {
    if (budget == 0) break;
    if (seq->status != SequenceStatus::Running || seq->is_decoding()) continue;
    const int n = std::min(seq->num_uncomputed_tokens(), budget);
    if (schedule_running(seq, n, out)) budget -= n;
  }
  // 3. Waiting sequences, first come first served. Admitting new work in a step that had
  // to preempt would only evict it again.
  while (out.preempted.empty() && budget > 0 && !waiting_.empty() &&
         num_running() < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    // The last token is always computed: its logits are the point of the step.
    PrefixHit hit;
    const bool fresh = seq->num_computed_tokens() == 0;
    if (fresh) {
      hit = blocks_.find_cached_prefix(
          seq->token_ids, std::min(seq->num_tokens() - 1, seq->first_position_needing_rows()));
    }
    const int remaining = seq->num_uncomputed_tokens() - hit.num_tokens;
    const int n = std::min(remaining, budget);
    if (!config_.enable_chunked_prefill && n < remaining) break;  // token budget: next step
    if (blocks_.blocks_for(hit.num_tokens + n) > blocks_.num_blocks()) {
      waiting_.pop_front();
      fail(seq, out);
      continue;
    }
    const bool fits =
        fresh ? blocks_.can_allocate(hit, n) : blocks_.can_append(seq->blocks, n);
    if (!fits) break;  // KV memory: wait for blocks to free up
    waiting_.pop_front();
    seq->status = SequenceStatus::Running;
    insert_running(seq);
    if (fresh) {
      blocks_.allocate(seq->blocks, hit, n);
      if (blocks_.prefix_caching()) {
        out.prefix_cache_queried_tokens += seq->num_tokens();
        out.prefix_cache_hit_tokens += hit.num_tokens;
      }
      if (seq->prefix_cache_hit_tokens < 0) seq->prefix_cache_hit_tokens = hit.num_tokens;
    } else {
      blocks_.append(seq->blocks, n);
    }
    add_chunk(seq, n, out);
    budget -= n;
  }
  return out;
}

bool Scheduler::schedule_running(Sequence* seq, int num_new_tokens, ScheduleOutput& out) {
  if (can_never_fit(*seq, num_new_tokens)) {
    erase_value(running_, seq);
    fail(seq, out);
    return false;
  }
  while (!blocks_.can_append(seq->blocks, num_new_tokens)) {
    Sequence* victim = pick_victim(out);
    preempt(victim, out);
    if (victim == seq) return false;
  }
  blocks_.append(seq->blocks, num_new_tokens);
  add_chunk(seq, num_new_tokens, out);
  return true;
}

Sequence* Scheduler::pick_victim(const ScheduleOutput& out) const {
  // running_ is in arrival order, so the last unscheduled entry arrived most recently. The
  // sequence asking for blocks is itself unscheduled, so there always is one.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (!is_scheduled(out, *it)) return *it;
  }
  internal_error(__FILE__, __LINE__, "no preemption victim among running sequences");
}

void Scheduler::preempt(Sequence* seq, ScheduleOutput& out) {
  erase_value(running_, seq);
  blocks_.free(seq->blocks);  // also resets the computed-token count: recompute from 0
  seq->status = SequenceStatus::Waiting;
  seq->num_preemptions += 1;
  num_preemptions_ += 1;
  // Victims are taken latest-arrival first, so pushing each to the front leaves the
  // earliest-arrived victim first in line.
  waiting_.push_front(seq);
  out.preempted.push_back(seq);
}

bool Scheduler::can_never_fit(const Sequence& seq, int num_new_tokens) const {
  return blocks_.blocks_for(seq.num_computed_tokens() + num_new_tokens) > blocks_.num_blocks();
}

void Scheduler::fail(Sequence* seq, ScheduleOutput& out) {
  const int needed = blocks_.blocks_for(seq->num_tokens());
  finish(seq, FinishReason::Abort,
         "sequence of " + std::to_string(seq->num_tokens()) + " tokens needs " +
             std::to_string(needed) + " KV blocks but the cache has " +
             std::to_string(blocks_.num_blocks()) +
             "; lower max_tokens or start the server with more KV cache memory");
  out.failed.push_back(seq);
}

void Scheduler::add_chunk(Sequence* seq, int num_new_tokens, ScheduleOutput& out) {
  const bool last = seq->num_computed_tokens() + num_new_tokens == seq->num_tokens();
  out.chunks.push_back(ScheduledChunk{seq, num_new_tokens, last});
  out.num_batched_tokens += num_new_tokens;
}

void Scheduler::cache_computed_blocks(const ScheduleOutput& schedule) {
  for (const ScheduledChunk& chunk : schedule.chunks) {
    Sequence* seq = chunk.seq;
    if (!seq->finished()) blocks_.cache_full_blocks(seq->blocks, seq->token_ids);
  }
}

void Scheduler::insert_running(Sequence* seq) {
  auto pos = std::upper_bound(
      running_.begin(), running_.end(), seq,
      [](const Sequence* a, const Sequence* b) { return a->arrival_order < b->arrival_order; });
  running_.insert(pos, seq);
}

void Scheduler::finish(Sequence* seq, FinishReason reason, std::string error) {
  if (seq->finished()) return;
  erase_value(running_, seq);
  erase_value(waiting_, seq);
  blocks_.free(seq->blocks);
  seq->status = SequenceStatus::Finished;
  seq->finish_reason = reason;
  seq->error = std::move(error);
}

std::vector<Sequence*> Scheduler::abort(std::string_view request_id) {
  std::vector<Sequence*> matches;
  for (Sequence* seq : running_) {
    if (seq->request_id == request_id) matches.push_back(seq);
  }
  for (Sequence* seq : waiting_) {
    if (seq->request_id == request_id) matches.push_back(seq);
  }
  for (Sequence* seq : matches) finish(seq, FinishReason::Abort);
  return matches;
}

std::vector<Sequence*> Scheduler::abort_all() {
  std::vector<Sequence*> all(running_.begin(), running_.end());
  all.insert(all.end(), waiting_.begin(), waiting_.end());
  for (Sequence* seq : all) finish(seq, FinishReason::Abort);
  return all;
}

}  // namespace attnres
