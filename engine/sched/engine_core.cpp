#include "engine/sched/engine_core.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <utility>

#include "engine/core/error.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/sampler.h"
#include "engine/sched/step_batch.h"

namespace attnres {

// Everything front-end threads may touch, behind one mutex. Streams hold it weakly (their
// cancel() must be harmless after the engine is gone).
struct EngineCore::Inbox {
  struct Submitted {
    EngineRequest request;
    std::shared_ptr<StreamChannel> channel;
    EngineClock::time_point arrival;
  };

  std::mutex mutex;
  std::condition_variable wake;  // the engine thread sleeps here when it has nothing to run
  std::condition_variable idle;  // shutdown() waits here for live requests to end
  std::deque<Submitted> requests;
  std::vector<std::string> aborts;
  std::unordered_set<std::string> live;  // submitted and not yet ended
  int queued = 0;                        // submitted and not yet scheduled once
  bool accepting = true;
  bool abort_all = false;  // the grace period is over: abort whatever is left
  bool stop = false;       // the engine thread exits once nothing is left
  bool dead = false;       // the forward threw; no new requests
  std::string dead_reason;

  void post_abort(const std::string& request_id) {
    {
      std::lock_guard lock(mutex);
      aborts.push_back(request_id);
    }
    wake.notify_one();
  }
};

struct EngineCore::ActiveRequest {
  std::string id;
  std::shared_ptr<StreamChannel> channel;
  Usage usage;
  RequestTimings timings;
  bool queued = true;  // still counted in Inbox::queued
  int num_unfinished = 0;
  std::vector<std::unique_ptr<EngineSequence>> choices;
};

// The scheduler's Sequence plus what only the engine needs per choice. The engine creates
// every Sequence the scheduler sees, so the downcast in run_forward is safe.
struct EngineCore::EngineSequence : Sequence {
  EngineSequence(const EngineRequest& request, int choice, SamplingParams choice_params,
                 uint64_t order, EngineClock::time_point arrival, ActiveRequest* owner,
                 uint64_t fallback_seed, const EngineConfig& config)
      : Sequence(request.request_id, choice, request.prompt_ids, choice_params, order, arrival),
        request(owner),
        output(choice_params, fallback_seed, config.eos_ids,
               config.make_decoder ? config.make_decoder(choice_params) : nullptr) {}

  ActiveRequest* request;
  SequenceOutput output;  // sampler, stop checker, detokenizer
  // Prompt logprobs collected so far (positions [0, prompt_logprobs_end)); sent with the first
  // output, once.
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // Depth-attention weights: the sum over prompt positions [0, depth_prompt_end) (double, so
  // the mean of a long prompt does not depend on how it was chunked), sent once.
  std::vector<double> depth_prompt_sum;
  bool depth_prompt_sent = false;
  // Set when this step's output path failed for the sequence: it ends with this error once
  // the step's outputs are processed.
  std::string failure;
};

namespace {

OutputContext make_output_context(const EngineConfig& config, int runner_vocab) {
  OutputContext context;
  context.vocabulary =
      config.vocabulary.rows == 0 ? Vocabulary::all_rows(runner_vocab) : config.vocabulary;
  context.eos_ids = config.eos_ids;
  context.fault_hook = config.output_fault_hook;
  return context;
}

}  // namespace

EngineCore::EngineCore(EngineConfig config, ModelRunner& runner)
    : config_(std::move(config)),
      runner_(runner),
      vocab_size_(runner.vocab_size()),
      depth_layout_(runner.depth_attention_layout()),
      output_context_(make_output_context(config_, vocab_size_)),
      inbox_(std::make_shared<Inbox>()),
      scheduler_(config_.scheduler, BlockManager(config_.num_kv_blocks, config_.block_size,
                                                 config_.enable_prefix_caching)) {
  if (config_.max_queued_requests < 1) throw Error("engine max_queued_requests must be >= 1");
  if (config_.max_choices < 1) throw Error("engine max_choices must be >= 1");
  if (output_context_.vocabulary.rows != vocab_size_) {
    throw Error("engine vocabulary has " + std::to_string(output_context_.vocabulary.rows) +
                " rows, the model runner's logits " + std::to_string(vocab_size_));
  }
  publish_stats();
}

EngineCore::~EngineCore() { shutdown(std::chrono::milliseconds(0)); }

// ---------------------------------------------------------------- front-end threads

void EngineCore::validate(const EngineRequest& request) const {
  if (request.request_id.empty()) throw Error("request_id: must not be empty");
  if (request.prompt_ids.empty()) throw Error("prompt: is empty, at least one token is needed");
  const Vocabulary& vocabulary = output_context_.vocabulary;
  for (size_t i = 0; i < request.prompt_ids.size(); ++i) {
    vocabulary.check("prompt[" + std::to_string(i) + "]", request.prompt_ids[i]);
  }
  if (request.n < 1 || request.n > config_.max_choices) {
    throw Error("n: got " + std::to_string(request.n) + ", expected 1 to " +
                std::to_string(config_.max_choices));
  }
  request.params.validate(vocabulary);
  if (request.params.wants_depth_attention() && depth_layout_.empty()) {
    throw Error(
        "depth_attention: this model has no depth attention (it is not an AttnRes model), so "
        "there are no depth-attention weights to return");
  }
  const int64_t prompt = static_cast<int64_t>(request.prompt_ids.size());
  const int64_t total = prompt + request.params.max_tokens;
  if (total > config_.scheduler.max_model_len) {
    throw Error("This model's maximum context length is " +
                std::to_string(config_.scheduler.max_model_len) +
                " tokens. However, you requested " + std::to_string(total) + " tokens (" +
                std::to_string(prompt) + " in the messages, " +
                std::to_string(request.params.max_tokens) +
                " in the completion). Please reduce the length of the messages or completion.");
  }
  const BlockManager& blocks = scheduler_.block_manager();  // immutable geometry only
  if (blocks.blocks_for(static_cast<int>(total)) > blocks.num_blocks()) {
    throw Error("prompt (" + std::to_string(prompt) + " tokens) plus max_tokens (" +
                std::to_string(request.params.max_tokens) + ") needs more KV cache than the " +
                "server has (" + std::to_string(blocks.num_blocks() * blocks.block_size()) +
                " tokens); lower max_tokens");
  }
}

SubmitResult EngineCore::submit(EngineRequest request) {
  SubmitResult result;
  try {
    validate(request);
  } catch (const Error& e) {
    result.status = SubmitStatus::InvalidRequest;
    result.message = e.what();
    return result;
  }
  const std::string id = request.request_id;
  auto channel = std::make_shared<StreamChannel>(std::move(request.listener));
  {
    std::lock_guard lock(inbox_->mutex);
    if (inbox_->dead) {
      result.status = SubmitStatus::Unavailable;
      result.message = "the engine stopped after an error: " + inbox_->dead_reason;
    } else if (!inbox_->accepting) {
      result.status = SubmitStatus::Unavailable;
      result.message = "the server is shutting down";
    } else if (inbox_->live.count(id) != 0) {
      result.status = SubmitStatus::InvalidRequest;
      result.message = "request_id: '" + id + "' is already in use by an unfinished request";
    } else if (inbox_->queued >= config_.max_queued_requests) {
      result.status = SubmitStatus::QueueFull;
      result.message = "the waiting queue is full (" + std::to_string(config_.max_queued_requests) +
                       " requests); retry later";
    }
    if (result.status != SubmitStatus::Accepted) return result;
    inbox_->live.insert(id);
    inbox_->queued += 1;
    inbox_->requests.push_back(Inbox::Submitted{std::move(request), channel, EngineClock::now()});
  }
  inbox_->wake.notify_one();
  std::weak_ptr<Inbox> weak_inbox = inbox_;
  result.stream = std::make_unique<RequestStream>(id, channel, [weak_inbox](const std::string& r) {
    if (auto inbox = weak_inbox.lock()) inbox->post_abort(r);
  });
  return result;
}

void EngineCore::abort(const std::string& request_id) { inbox_->post_abort(request_id); }

EngineStats EngineCore::stats() const {
  EngineStats snapshot;
  {
    std::lock_guard lock(stats_mutex_);
    snapshot = published_;
  }
  std::lock_guard lock(inbox_->mutex);
  snapshot.num_queued_requests = inbox_->queued;
  snapshot.alive = !inbox_->dead;
  snapshot.error = inbox_->dead_reason;
  return snapshot;
}

// ---------------------------------------------------------------- lifecycle

void EngineCore::start() {
  ATTNRES_CHECK(!thread_.joinable(), "engine started twice");
  thread_ = std::thread([this] { loop(); });
}

bool EngineCore::shutdown(std::chrono::milliseconds grace) {
  const EngineClock::time_point deadline = EngineClock::now() + grace;
  bool drained = false;
  if (thread_.joinable()) {
    std::unique_lock lock(inbox_->mutex);
    inbox_->accepting = false;
    drained = inbox_->idle.wait_until(lock, deadline, [&] { return inbox_->live.empty(); });
    inbox_->abort_all = true;
    inbox_->stop = true;
    lock.unlock();
    inbox_->wake.notify_all();
    thread_.join();
    return drained;
  }
  // No engine thread: the caller's thread drives the remaining steps.
  auto live_requests = [&] {
    std::lock_guard lock(inbox_->mutex);
    inbox_->accepting = false;
    return !inbox_->live.empty();
  };
  while (live_requests() && EngineClock::now() < deadline) step();
  drained = !live_requests();
  {
    std::lock_guard lock(inbox_->mutex);
    inbox_->abort_all = true;
    inbox_->stop = true;
  }
  step();
  return drained;
}

void EngineCore::loop() {
  for (;;) {
    {
      std::unique_lock lock(inbox_->mutex);
      inbox_->wake.wait(lock, [&] {
        return inbox_->stop || !inbox_->requests.empty() || !inbox_->aborts.empty() ||
               scheduler_.has_unfinished();
      });
      if (inbox_->stop && inbox_->requests.empty() && !scheduler_.has_unfinished() &&
          requests_.empty()) {
        return;
      }
    }
    step();
  }
}

// ---------------------------------------------------------------- the engine thread

bool EngineCore::step() {
  // 1. Pop the inbox.
  std::deque<Inbox::Submitted> submitted;
  std::vector<std::string> aborts;
  bool abort_all = false;
  {
    std::lock_guard lock(inbox_->mutex);
    submitted.swap(inbox_->requests);
    aborts.swap(inbox_->aborts);
    abort_all = inbox_->abort_all;
  }
  // 2. Accept (validated at submit), then apply cancellations: their blocks are free before
  // this step is scheduled.
  for (Inbox::Submitted& s : submitted)
    accept(std::move(s.request), std::move(s.channel), s.arrival);
  for (const std::string& id : aborts) apply_abort(id);
  if (abort_all) abort_everything({});

  // 3. Schedule; sequences that can never fit end here with an error.
  ScheduleOutput schedule = scheduler_.schedule();
  for (Sequence* seq : schedule.failed) {
    RequestOutput out;
    out.finish_reason = FinishReason::Abort;
    out.error = seq->error;
    on_finished(static_cast<EngineSequence&>(*seq), std::move(out));
  }

  // 4. Run the forward; 5. sample, stop-check, detokenize, push.
  if (!schedule.empty()) {
    mark_scheduled(schedule, EngineClock::now());
    std::optional<StepBatch> batch;
    try {
      batch = run_forward(schedule);
    } catch (const std::exception& e) {
      // A failed forward leaves the cache in an unknown state: end every request with the
      // error and refuse new ones (/health then reports 503, and the server exits).
      {
        std::lock_guard lock(inbox_->mutex);
        inbox_->dead = true;
        inbox_->dead_reason = e.what();
      }
      abort_everything(std::string("the engine stopped after an error: ") + e.what());
    }
    if (batch) {
      // Before the outputs are processed: a sequence that finishes now still holds its blocks.
      scheduler_.cache_computed_blocks(schedule);
      process_outputs(*batch);
    }
  }
  const bool worked = !submitted.empty() || !aborts.empty() || !schedule.empty() ||
                      !schedule.failed.empty() || scheduler_.has_unfinished();
  counters_.steps += schedule.empty() ? 0 : 1;
  // 6. Publish.
  publish_stats();
  return worked;
}

void EngineCore::accept(EngineRequest request, std::shared_ptr<StreamChannel> channel,
                        EngineClock::time_point arrival) {
  auto active = std::make_unique<ActiveRequest>();
  active->id = request.request_id;
  active->channel = std::move(channel);
  active->timings.arrival = arrival;
  active->usage.prompt_tokens = static_cast<int>(request.prompt_ids.size());
  active->num_unfinished = request.n;
  std::random_device entropy;
  for (int choice = 0; choice < request.n; ++choice) {
    SamplingParams params = request.params;
    if (params.seed) params.seed = *params.seed + static_cast<uint64_t>(choice);
    // Prompt logprobs come with every choice's first output, so each choice computes them:
    // a front end never waits on a sibling choice (which may fail, or be scheduled later)
    // for them. The price, n LM-head passes over the prompt, falls only on requests that
    // ask for prompt logprobs with n > 1.
    if (params.depth_attention_per_token) params.depth_attention = true;
    const uint64_t fallback_seed = (static_cast<uint64_t>(entropy()) << 32) | entropy();
    active->choices.push_back(
        std::make_unique<EngineSequence>(request, choice, std::move(params), next_arrival_order_++,
                                         arrival, active.get(), fallback_seed, config_));
  }
  counters_.prompt_tokens_total += active->usage.prompt_tokens;
  for (auto& seq : active->choices) scheduler_.add(seq.get());
  requests_[active->id] = std::move(active);
}

void EngineCore::apply_abort(const std::string& request_id) {
  for (Sequence* seq : scheduler_.abort(request_id)) {
    RequestOutput out;
    out.finish_reason = FinishReason::Abort;
    on_finished(static_cast<EngineSequence&>(*seq), std::move(out));
  }
}

void EngineCore::abort_everything(const std::string& error) {
  for (Sequence* seq : scheduler_.abort_all()) {
    RequestOutput out;
    out.finish_reason = FinishReason::Abort;
    out.error = error;
    on_finished(static_cast<EngineSequence&>(*seq), std::move(out));
  }
}

void EngineCore::mark_scheduled(const ScheduleOutput& schedule, EngineClock::time_point now) {
  counters_.prefix_cache_queries_total += schedule.prefix_cache_queried_tokens;
  counters_.prefix_cache_hits_total += schedule.prefix_cache_hit_tokens;
  int newly_scheduled = 0;
  for (const ScheduledChunk& chunk : schedule.chunks) {
    auto& seq = static_cast<EngineSequence&>(*chunk.seq);
    ActiveRequest& request = *seq.request;
    if (seq.choice_index == 0 && seq.prefix_cache_hit_tokens > 0 && request.queued) {
      request.usage.cached_tokens = seq.prefix_cache_hit_tokens;
    }
    if (!request.timings.first_scheduled) request.timings.first_scheduled = now;
    if (request.queued) {
      request.queued = false;
      newly_scheduled += 1;
    }
  }
  if (newly_scheduled > 0) {
    std::lock_guard lock(inbox_->mutex);
    inbox_->queued -= newly_scheduled;
  }
}

StepBatch EngineCore::run_forward(const ScheduleOutput& schedule) {
  StepBatch batch = build_step_batch(schedule, config_.block_size);
  const size_t depth_cells = static_cast<size_t>(depth_layout_.rows() * depth_layout_.cols());
  if (batch.depth_rows.empty()) {
    runner_.execute(batch.meta, batch.logit_rows, logits_);
  } else {
    runner_.execute_with_depth_weights(batch.meta, batch.logit_rows, logits_, batch.depth_rows,
                                       depth_weights_);
    ATTNRES_CHECK(depth_weights_.size() == batch.depth_rows.size() * depth_cells,
                  "the model runner returned the wrong number of depth weights");
  }
  ATTNRES_CHECK(logits_.size() == batch.logit_rows.size() * static_cast<size_t>(vocab_size_),
                "the model runner returned the wrong number of logits");
  return batch;
}

void EngineCore::process_outputs(const StepBatch& batch) {
  // A sequence whose path fails is remembered and skipped by the later stages of this step,
  // then ended with its error at the end, once nothing of the step refers to it any more.
  std::vector<EngineSequence*> failed;
  auto guarded = [&](EngineSequence& seq, auto&& fn) {
    if (!seq.failure.empty()) return false;
    try {
      fn();
      return true;
    } catch (const std::exception& e) {
      seq.failure = e.what();
      failed.push_back(&seq);
      return false;
    }
  };
  for (const PromptLogprobRows& rows : batch.prompt_rows) {
    auto& seq = static_cast<EngineSequence&>(*rows.seq);
    guarded(seq, [&] { add_prompt_logprobs(seq, rows); });
  }
  for (const DepthPromptRows& rows : batch.depth_prompt_rows) {
    auto& seq = static_cast<EngineSequence&>(*rows.seq);
    guarded(seq, [&] { add_depth_prompt_rows(seq, rows); });
  }
  const size_t vocab = static_cast<size_t>(vocab_size_);
  const size_t depth_cells = static_cast<size_t>(depth_layout_.rows() * depth_layout_.cols());
  const EngineClock::time_point now = EngineClock::now();
  for (size_t i = 0; i < batch.samplers.size(); ++i) {
    auto& seq = static_cast<EngineSequence&>(*batch.samplers[i]);
    const int32_t depth_row = batch.sampler_depth_row[i];
    const float* depth = depth_row < 0 ? nullptr : depth_weights_.data() + depth_row * depth_cells;
    RequestOutput out;
    const std::span<float> logits(logits_.data() + i * vocab, vocab);
    if (guarded(seq, [&] { out = sample_output(seq, logits, depth, now); })) {
      emit(seq, std::move(out));  // may retire the request: seq is gone after this
    }
  }
  for (EngineSequence* seq : failed) {
    RequestOutput out;
    out.finish_reason = FinishReason::Abort;
    out.error = seq->failure;
    scheduler_.finish(seq, FinishReason::Abort, seq->failure);
    on_finished(*seq, std::move(out));
  }
}

void EngineCore::add_prompt_logprobs(EngineSequence& seq, const PromptLogprobRows& rows) {
  const size_t vocab = static_cast<size_t>(vocab_size_);
  run_output_stage(OutputStage::PromptLogprobs, seq.request_id, output_context_.fault_hook, [&] {
    ATTNRES_CHECK(rows.first_position == seq.prompt_logprobs_end,
                  "prompt logprob rows out of order");
    if (seq.prompt_logprobs.empty()) seq.prompt_logprobs.emplace_back();  // position 0: none
    for (int j = 0; j < rows.count; ++j) {
      const std::span<float> row(logits_.data() + (rows.first_logit + j) * vocab, vocab);
      check_logits_row(row, output_context_.vocabulary);
      const int position = rows.first_position + j;
      seq.prompt_logprobs.emplace_back(compute_logprobs(row, seq.token_ids[position],
                                                        seq.params.prompt_logprobs,
                                                        output_context_.vocabulary.decodable));
    }
    seq.prompt_logprobs_end += rows.count;
  });
}

void EngineCore::add_depth_prompt_rows(EngineSequence& seq, const DepthPromptRows& rows) {
  const size_t cells = static_cast<size_t>(depth_layout_.rows() * depth_layout_.cols());
  run_output_stage(OutputStage::DepthAttention, seq.request_id, output_context_.fault_hook, [&] {
    ATTNRES_CHECK(rows.first_position == seq.depth_prompt_end, "depth prompt rows out of order");
    seq.depth_prompt_sum.resize(cells, 0.0);
    for (int j = 0; j < rows.count; ++j) {
      const float* w = depth_weights_.data() + (rows.first_depth_row + j) * cells;
      // Cells a sublayer does not have are NaN in every row, so they stay NaN in the mean.
      for (size_t c = 0; c < cells; ++c) seq.depth_prompt_sum[c] += w[c];
    }
    seq.depth_prompt_end += rows.count;
  });
}

RequestOutput EngineCore::sample_output(EngineSequence& seq, std::span<float> logits,
                                        const float* depth_row, EngineClock::time_point now) {
  SampledToken token =
      seq.output.next(logits, seq.token_ids, seq.num_prompt_tokens, output_context_, seq.request_id);
  ActiveRequest& request = *seq.request;
  request.usage.completion_tokens += 1;
  counters_.generation_tokens_total += 1;
  if (!request.timings.first_token) request.timings.first_token = now;

  RequestOutput out;
  out.choice_index = seq.choice_index;
  out.token_ids.push_back(token.id);
  if (token.logprob) out.logprobs.push_back(std::move(*token.logprob));
  out.text = std::move(token.text);
  out.finish_reason = token.finish;
  out.time = now;
  if (seq.num_output_tokens() == 1) out.cached_prompt_tokens = std::max(0, seq.prefix_cache_hit_tokens);
  if (seq.params.prompt_logprobs >= 0 && !seq.prompt_logprobs_sent) {
    // The first output: the whole prompt has been computed, so every position is in.
    if (seq.prompt_logprobs.empty()) seq.prompt_logprobs.emplace_back();  // a 1-token prompt
    ATTNRES_CHECK(static_cast<int>(seq.prompt_logprobs.size()) == seq.num_prompt_tokens,
                  "prompt logprobs incomplete at the first output");
    out.prompt_logprobs = std::move(seq.prompt_logprobs);
    seq.prompt_logprobs.clear();
    seq.prompt_logprobs_sent = true;
  }
  run_output_stage(OutputStage::DepthAttention, seq.request_id, output_context_.fault_hook, [&] {
    if (seq.params.depth_attention && !seq.depth_prompt_sent) {
      // The first output: every prompt position is in the sum.
      ATTNRES_CHECK(seq.depth_prompt_end == seq.num_prompt_tokens,
                    "depth-attention prompt rows incomplete at the first output");
      DepthAttentionMatrix mean{depth_layout_.rows(), depth_layout_.cols(), {}};
      mean.values.reserve(seq.depth_prompt_sum.size());
      for (double sum : seq.depth_prompt_sum) {
        mean.values.push_back(static_cast<float>(sum / seq.num_prompt_tokens));
      }
      out.depth_prompt_mean = std::move(mean);
      seq.depth_prompt_sum = {};
      seq.depth_prompt_sent = true;
    }
    if (depth_row) {
      const size_t cells = static_cast<size_t>(depth_layout_.rows() * depth_layout_.cols());
      out.depth_per_token.push_back(
          DepthAttentionMatrix{depth_layout_.rows(), depth_layout_.cols(),
                               std::vector<float>(depth_row, depth_row + cells)});
    }
  });
  if (out.finished()) {
    out.stop_string = seq.output.stop().matched_stop_string();
    out.stop_token = seq.output.stop().stop_token();
  }
  return out;
}

void EngineCore::emit(EngineSequence& seq, RequestOutput out) {
  if (!out.finished()) {
    seq.request->channel->push(std::move(out));
    return;
  }
  scheduler_.finish(&seq, out.finish_reason);
  on_finished(seq, std::move(out));
}

void EngineCore::on_finished(EngineSequence& seq, RequestOutput output) {
  switch (output.finish_reason) {
    case FinishReason::Stop:
      counters_.finished_stop += 1;
      break;
    case FinishReason::Length:
      counters_.finished_length += 1;
      break;
    default:
      counters_.finished_abort += 1;
      break;
  }
  output.choice_index = seq.choice_index;
  output.time = EngineClock::now();
  ActiveRequest& request = *seq.request;
  request.channel->push(std::move(output));
  request.num_unfinished -= 1;
  if (request.num_unfinished == 0) retire(request);  // destroys seq: nothing may follow
}

void EngineCore::retire(ActiveRequest& request) {
  // Only finished sequences get here, and the scheduler dropped every finished sequence from
  // its queues, so nothing references the request's sequences any more.
  request.timings.finished = EngineClock::now();
  request.channel->close(request.usage, request.timings);
  {
    std::lock_guard lock(inbox_->mutex);
    inbox_->live.erase(request.id);
    if (request.queued) inbox_->queued -= 1;
  }
  inbox_->idle.notify_all();
  requests_.erase(request.id);
}

void EngineCore::publish_stats() {
  const BlockManager& blocks = scheduler_.block_manager();
  counters_.num_running = scheduler_.num_running();
  counters_.num_waiting = scheduler_.num_waiting();
  counters_.kv_cache_usage =
      1.0 - static_cast<double>(blocks.num_free_blocks()) / blocks.num_blocks();
  counters_.preemptions_total = scheduler_.num_preemptions();
  std::lock_guard lock(stats_mutex_);
  published_ = counters_;
}

}  // namespace attnres
