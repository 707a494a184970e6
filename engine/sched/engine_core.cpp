#include "engine/sched/engine_core.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <utility>

#include "engine/core/error.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/sample_row.h"
#include "engine/sample/sampler.h"
#include "engine/sched/step_batch.h"

namespace attnres {

// Everything front-end threads may touch, behind one mutex. Streams hold it weakly (their
// cancel() must be harmless after the engine is gone).
struct EngineCore::Inbox {
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
  std::vector<std::unique_ptr<Sequence>> choices;
};

namespace {

Vocabulary engine_vocabulary(const EngineConfig& config, int runner_vocab) {
  return config.vocabulary.rows == 0 ? Vocabulary::all_rows(runner_vocab) : config.vocabulary;
}

OutputContext make_output_context(const EngineConfig& config, const Vocabulary& vocabulary) {
  OutputContext context;
  context.vocabulary = vocabulary;
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
      vocabulary_(engine_vocabulary(config_, vocab_size_)),
      device_sampling_(config_.device_sampling && runner.samples_on_device()),
      async_(config_.async_scheduling && runner.launches_asynchronously()),
      masked_sampling_(device_sampling_ && runner.samples_masked_rows()),
      inbox_(std::make_shared<Inbox>()),
      scheduler_(config_.scheduler, BlockManager(config_.num_kv_blocks, config_.block_size,
                                                 config_.enable_prefix_caching)),
      output_processor_(make_output_context(config_, vocabulary_), depth_layout_,
                        config_.make_decoder) {
  if (config_.max_queued_requests < 1) throw Error("engine max_queued_requests must be >= 1");
  if (config_.max_choices < 1) throw Error("engine max_choices must be >= 1");
  if (vocabulary_.rows != vocab_size_) {
    throw Error("engine vocabulary has " + std::to_string(vocabulary_.rows) +
                " rows, the model runner's logits " + std::to_string(vocab_size_));
  }
  publish_stats();
}

EngineCore::~EngineCore() { shutdown(std::chrono::milliseconds(0)); }

// ---------------------------------------------------------------- front-end threads

void EngineCore::validate(const EngineRequest& request) const {
  if (request.request_id.empty()) throw Error("request_id: must not be empty");
  if (request.prompt_ids.empty()) throw Error("prompt: is empty, at least one token is needed");
  const Vocabulary& vocabulary = vocabulary_;
  for (size_t i = 0; i < request.prompt_ids.size(); ++i) {
    vocabulary.check("prompt[" + std::to_string(i) + "]", request.prompt_ids[i]);
  }
  if (request.n < 1 || request.n > config_.max_choices) {
    throw Error("n: got " + std::to_string(request.n) + ", expected 1 to " +
                std::to_string(config_.max_choices));
  }
  request.params.validate(vocabulary);
  compile_constraint(request.params);
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
  // The KV cache's size is fixed at construction (config_): no engine-thread state is read here.
  const int64_t block_size = config_.block_size;
  const int64_t capacity = static_cast<int64_t>(config_.num_kv_blocks) * block_size;
  if ((total + block_size - 1) / block_size > config_.num_kv_blocks) {
    throw Error("prompt (" + std::to_string(prompt) + " tokens) plus max_tokens (" +
                std::to_string(request.params.max_tokens) + ") needs more KV cache than the " +
                "server has (" + std::to_string(capacity) + " tokens); lower max_tokens");
  }
}

std::shared_ptr<const CompiledConstraint> EngineCore::compile_constraint(
    const SamplingParams& params) const {
  if (!params.constraint) return nullptr;
  const OutputConstraint& constraint = *params.constraint;
  if (!config_.constraints) {
    throw Error(constraint.field +
                ": structured output needs the model's tokenizer, and this model has none");
  }
  if (constraint.enforce_after_token) {
    vocabulary_.check(constraint.field + ".enforce_after_token", *constraint.enforce_after_token);
  }
  return config_.constraints->compile(constraint);  // a cache hit after validate()
}

SubmitResult EngineCore::submit(EngineRequest request) {
  SubmitResult result;
  std::shared_ptr<const CompiledConstraint> constraint;
  try {
    validate(request);
    constraint = compile_constraint(request.params);
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
    inbox_->requests.push_back(
        Submitted{std::move(request), std::move(constraint), channel, EngineClock::now()});
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
               scheduler_.has_unfinished() || has_undelivered();
      });
      if (inbox_->stop && inbox_->requests.empty() && !scheduler_.has_unfinished() &&
          requests_.empty() && !has_undelivered()) {
        return;
      }
    }
    step();
  }
}

// ---------------------------------------------------------------- the engine thread

bool EngineCore::step() {
  Drained drained = drain_inbox();
  accept_requests(drained);
  cancel_requests(drained);
  const ScheduleOutput scheduled = schedule();
  std::optional<StepPlan> plan = build_batch(scheduled);
  bool launched = plan && launch(*plan);
  // While the forward runs: the constrained rows' token masks (structured output); the device
  // rows' go to the sample op, queued now.
  if (launched) output_processor_.prepare_constraints(*plan);
  if (launched && has_masked_rows(plan->batch)) launched = launch_masked_sampling(*plan);
  bool accepted_in_gap = false;
  if (async_) {
    // The gap: the device runs this step while the host delivers the last one's outputs and
    // takes in the requests that arrived since (they join the next schedule).
    flush_outbox();
    if (launched) {
      Drained arrived = drain_new_requests();
      accepted_in_gap = !arrived.empty();
      accept_requests(arrived);
    }
  }
  StepOutputs outputs;
  if (launched && collect(scheduled, *plan)) outputs = process_outputs(*plan);
  deliver(outputs);
  // With async scheduling this step's outputs go out in the next step's gap, unless there is
  // no next step to hide them behind (nothing launched, or the engine died).
  if (!async_ || !launched || dead_) flush_outbox();
  return !drained.empty() || accepted_in_gap || !scheduled.empty() || !scheduled.failed.empty() ||
         scheduler_.has_unfinished() || has_undelivered();
}

EngineCore::Drained EngineCore::drain_inbox() {
  Drained drained;
  std::lock_guard lock(inbox_->mutex);
  drained.requests.swap(inbox_->requests);
  drained.aborts.swap(inbox_->aborts);
  drained.abort_all = inbox_->abort_all;
  return drained;
}

EngineCore::Drained EngineCore::drain_new_requests() {
  Drained drained;
  std::lock_guard lock(inbox_->mutex);
  drained.requests.swap(inbox_->requests);
  return drained;
}

void EngineCore::accept_requests(Drained& drained) {
  // Validated at submit, on the caller's thread.
  std::random_device entropy;
  for (Submitted& submitted : drained.requests) {
    const EngineRequest& request = submitted.request;
    auto active = std::make_unique<ActiveRequest>();
    active->id = request.request_id;
    active->channel = std::move(submitted.channel);
    active->timings.arrival = submitted.arrival;
    active->usage.prompt_tokens = static_cast<int>(request.prompt_ids.size());
    active->num_unfinished = request.n;
    for (int choice = 0; choice < request.n; ++choice) {
      SamplingParams params = request.params;
      if (params.seed) params.seed = *params.seed + static_cast<uint64_t>(choice);
      // Prompt logprobs come with every choice's first output, so each choice computes them:
      // a front end never waits on a sibling choice (which may fail, or be scheduled later)
      // for them. The price, n LM-head passes over the prompt, falls only on requests that
      // ask for prompt logprobs with n > 1.
      if (params.depth_attention_per_token) params.depth_attention = true;
      const uint64_t fallback_seed = (static_cast<uint64_t>(entropy()) << 32) | entropy();
      auto seq =
          std::make_unique<Sequence>(request.request_id, choice, request.prompt_ids,
                                     std::move(params), next_arrival_order_++, submitted.arrival);
      output_processor_.add(*seq, fallback_seed, submitted.constraint);
      active->choices.push_back(std::move(seq));
    }
    counters_.prompt_tokens_total += active->usage.prompt_tokens;
    for (auto& seq : active->choices) scheduler_.add(seq.get());
    requests_[active->id] = std::move(active);
  }
}

void EngineCore::cancel_requests(const Drained& drained) {
  for (const std::string& id : drained.aborts) {
    for (Sequence* seq : scheduler_.abort(id)) {
      RequestOutput out;
      out.finish_reason = FinishReason::Abort;
      end_sequence(*seq, std::move(out));
    }
  }
  if (drained.abort_all) abort_everything({});
}

ScheduleOutput EngineCore::schedule() {
  ScheduleOutput scheduled = scheduler_.schedule();
  for (Sequence* seq : scheduled.failed) {
    RequestOutput out;
    out.finish_reason = FinishReason::Abort;
    out.error = seq->error;
    end_sequence(*seq, std::move(out));
  }
  return scheduled;
}

std::optional<StepPlan> EngineCore::build_batch(const ScheduleOutput& scheduled) {
  if (scheduled.empty()) return std::nullopt;
  counters_.steps += 1;
  counters_.prefix_cache_queries_total += scheduled.prefix_cache_queried_tokens;
  counters_.prefix_cache_hits_total += scheduled.prefix_cache_hit_tokens;
  const EngineClock::time_point now = EngineClock::now();
  int newly_scheduled = 0;
  for (const ScheduledChunk& chunk : scheduled.chunks) {
    const Sequence& seq = *chunk.seq;
    const int computed = seq.num_computed_tokens();
    counters_.prompt_tokens_computed_total +=
        std::max(0, std::min(computed + chunk.num_new_tokens, seq.num_prompt_tokens) - computed);
    ActiveRequest& request = request_of(seq);
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
  try {
    auto on_device = [masks = masked_sampling_](const Sequence& seq) {
      return can_sample_on_device(seq.params, masks);
    };
    StepPlan plan =
        build_step_batch(scheduled, config_.block_size,
                         device_sampling_ ? on_device : std::function<bool(const Sequence&)>{});
    output_processor_.add_device_rows(plan);
    return plan;
  } catch (const std::exception& e) {
    fail_engine(e);
    return std::nullopt;
  }
}

bool EngineCore::launch(const StepPlan& plan) {
  try {
    runner_.launch(plan.batch, step_result_);
  } catch (const std::exception& e) {
    fail_engine(e);
    return false;
  }
  return true;
}

bool EngineCore::launch_masked_sampling(StepPlan& plan) {
  try {
    runner_.launch_sampling(plan.batch, step_result_);
  } catch (const std::exception& e) {
    fail_engine(e);
    return false;
  }
  return true;
}

bool EngineCore::collect(const ScheduleOutput& scheduled, const StepPlan& plan) {
  try {
    runner_.collect(step_result_);
    const size_t depth_cells = static_cast<size_t>(depth_layout_.rows() * depth_layout_.cols());
    ATTNRES_CHECK(
        !plan.batch.wants_depth_weights() ||
            step_result_.depth_weights.size() == plan.batch.depth_rows.size() * depth_cells,
        "the model runner returned the wrong number of depth weights");
    ATTNRES_CHECK(step_result_.logits.size() ==
                      plan.batch.logit_rows.size() * static_cast<size_t>(vocab_size_),
                  "the model runner returned the wrong number of logits");
    ATTNRES_CHECK(step_result_.sampled_ids.size() == plan.batch.sample_rows.size(),
                  "the model runner returned the wrong number of sampled token ids");
  } catch (const std::exception& e) {
    fail_engine(e);
    return false;
  }
  // Before the outputs are processed: a sequence that finishes now still holds its blocks.
  scheduler_.cache_computed_blocks(scheduled);
  return true;
}

StepOutputs EngineCore::process_outputs(const StepPlan& plan) {
  return output_processor_.process(plan, step_result_);
}

void EngineCore::deliver(StepOutputs& outputs) {
  outbox_.reserve(outbox_.size() + outputs.sequences.size());
  for (SequenceStepOutput& step : outputs.sequences) {
    Sequence& seq = *step.seq;
    ActiveRequest& request = request_of(seq);
    if (step.sampled) {
      request.usage.completion_tokens += 1;
      counters_.generation_tokens_total += 1;
      if (!request.timings.first_token) request.timings.first_token = outputs.time;
    }
    if (step.failed) {
      scheduler_.finish(&seq, FinishReason::Abort, step.output.error);
    } else if (step.output.finished()) {
      scheduler_.finish(&seq, step.output.finish_reason);
    } else {
      outbox_.push_back(Outgoing{&request, std::move(step.output)});
      continue;
    }
    end_sequence(seq, std::move(step.output));
  }
}

void EngineCore::flush_outbox() {
  // Published before the outputs go out too, so a client that reads /metrics once it has its
  // tokens finds them counted (the counters moved in deliver()).
  if (!outbox_.empty()) publish_stats();
  for (Outgoing& out : outbox_) out.request->channel->push(std::move(out.output));
  outbox_.clear();
  retire_finished_requests();
  publish_stats();
}

void EngineCore::retire_finished_requests() {
  for (const std::string& id : finished_requests_) {
    // Only finished sequences get here, and the scheduler dropped every finished sequence
    // from its queues, so nothing references the request's sequences any more.
    ActiveRequest& request = *requests_.at(id);
    request.timings.finished = EngineClock::now();
    request.channel->close(request.usage, request.timings);
    {
      std::lock_guard lock(inbox_->mutex);
      inbox_->live.erase(request.id);
      if (request.queued) inbox_->queued -= 1;
    }
    inbox_->idle.notify_all();
    for (const auto& seq : request.choices) output_processor_.remove(*seq);
    requests_.erase(id);
  }
  finished_requests_.clear();
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

EngineCore::ActiveRequest& EngineCore::request_of(const Sequence& seq) {
  auto it = requests_.find(seq.request_id);
  ATTNRES_CHECK(it != requests_.end(), "a sequence of an unknown request");
  return *it->second;
}

void EngineCore::end_sequence(const Sequence& seq, RequestOutput last) {
  switch (last.finish_reason) {
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
  last.choice_index = seq.choice_index;
  last.time = EngineClock::now();
  ActiveRequest& request = request_of(seq);
  outbox_.push_back(Outgoing{&request, std::move(last)});
  request.num_unfinished -= 1;
  if (request.num_unfinished == 0) finished_requests_.push_back(request.id);
}

void EngineCore::fail_engine(const std::exception& error) {
  dead_ = true;
  {
    std::lock_guard lock(inbox_->mutex);
    inbox_->dead = true;
    inbox_->dead_reason = error.what();
  }
  abort_everything(std::string("the engine stopped after an error: ") + error.what());
}

void EngineCore::abort_everything(const std::string& error) {
  for (Sequence* seq : scheduler_.abort_all()) {
    RequestOutput out;
    out.finish_reason = FinishReason::Abort;
    out.error = error;
    end_sequence(*seq, std::move(out));
  }
}

}  // namespace attnres
