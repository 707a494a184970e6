// The server's engine loop. One thread (the engine thread) owns the scheduler, the block
// manager and every sequence; front-end threads talk to it only through a thread-safe inbox
// (submit, abort) and read results from their RequestStream. step() reads like a checklist
// (LMDeploy TurboMind), one private function per stage:
//
//   drain inbox -> accept (fan out n choices) -> cancel -> schedule -> build batch
//   -> execute (ModelRunner) -> process outputs (OutputProcessor: sample, stop checks,
//   detokenize, logprobs, depth weights) -> deliver -> retire finished requests
//   -> publish stats
//
// Async scheduling (EngineConfig::async_scheduling, with a runner whose launch() returns
// while the step runs): execute is split into launch and collect, and in the gap between them
// the host hands the previous step's outputs to their streams, retires its finished requests,
// publishes stats and accepts the requests that arrived since. The tokens are the same.
//
// Fault isolation: a failure in one sequence's output path (sampling, detokenizing, stop
// checks, logprobs, depth weights, non-finite logits) ends that sequence with its error and
// nothing else; only a failure of the step itself (building the batch, the forward) stops the
// engine.
//
// Ownership and threading rules: docs/ENGINE_CONTRACT.md.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/sample/constraint_compiler.h"
#include "engine/sched/output_processor.h"
#include "engine/sched/request_stream.h"
#include "engine/sched/scheduler.h"
#include "engine/sched/sequence_output.h"

namespace attnres {

struct EngineConfig {
  SchedulerConfig scheduler;
  int num_kv_blocks = 0;  // the runner's cache size, in blocks
  int block_size = 16;
  // Automatic prefix caching (block_manager.h): off here, on by default in `attnres serve`.
  bool enable_prefix_caching = false;
  // Requests submitted but not yet scheduled once; more are rejected (HTTP 503 with
  // Retry-After, gRPC RESOURCE_EXHAUSTED).
  int max_queued_requests = 1024;
  int max_choices = 128;  // largest n per request
  std::vector<int32_t> eos_ids;
  TextDecoderFactory make_decoder;  // empty: outputs carry token ids only, no text
  // The ids requests may name and sequences may produce: the runner's rows, of which the
  // tokenizer decodes the first `decodable` (rows 0: every row of the runner's vocabulary).
  Vocabulary vocabulary;
  // Sample on the device where the runner can (ModelRunner::samples_on_device) and the
  // sequence allows (can_sample_on_device, engine/sample/sample_row.h); false: every row's
  // logits come back and are sampled on the host. Same tokens either way.
  bool device_sampling = true;
  // Overlap the host's delivery of step n-1 with the device running step n (vLLM's async
  // scheduling; docs/ENGINE_CONTRACT.md, "One step, in order"). Takes effect only when the
  // runner launches asynchronously (ModelRunner::launches_asynchronously: CUDA); with a
  // synchronous runner it would only deliver each token one step later. Same tokens either way.
  bool async_scheduling = true;
  // Structured output (SamplingParams::constraint): the model's constraint compiler, shared
  // with whoever else compiles for the same model. Null: constrained requests are refused
  // (a model served without a tokenizer).
  std::shared_ptr<const ConstraintCompiler> constraints;
  // Tests only: injects a failure into one sequence's output path (sequence_output.h).
  OutputFaultHook output_fault_hook;
};

struct EngineRequest {
  std::string request_id;  // unique among unfinished requests (the abort key)
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  int n = 1;  // choices; choice i samples with seed + i when a seed is given (vLLM)
  // Called on the engine thread whenever the request's stream has news (request_stream.h).
  StreamListener listener;
};

enum class SubmitStatus {
  Accepted,
  InvalidRequest,  // 400 / INVALID_ARGUMENT: message names the field
  QueueFull,       // 503 + Retry-After / RESOURCE_EXHAUSTED
  Unavailable,     // 503 / UNAVAILABLE: shutting down, or the engine died
};

struct SubmitResult {
  SubmitStatus status = SubmitStatus::Accepted;
  std::string message;                    // why, when not accepted
  std::unique_ptr<RequestStream> stream;  // set when accepted
  bool accepted() const { return status == SubmitStatus::Accepted; }
};

// A snapshot for /metrics and /health (vLLM's names in comments).
struct EngineStats {
  int num_running = 0;          // sequences running (num_requests_running)
  int num_waiting = 0;          // sequences waiting, preempted ones included (num_requests_waiting)
  int num_queued_requests = 0;  // requests not yet scheduled (what max_queued_requests bounds)
  double kv_cache_usage = 0;    // used / total blocks (kv_cache_usage_perc)
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  // Prompt tokens the forward computed (prefix-cache hits excluded; a preempted sequence's
  // count again when recomputed): a step that raises it did prefill work (bench latency).
  int64_t prompt_tokens_computed_total = 0;
  int64_t preemptions_total = 0;
  int64_t prefix_cache_queries_total = 0;  // tokens looked up (prefix_cache_queries)
  int64_t prefix_cache_hits_total = 0;     // of which the cache had (prefix_cache_hits)
  int64_t finished_stop = 0;               // request_success_total{finished_reason=...}, per choice
  int64_t finished_length = 0;
  int64_t finished_abort = 0;
  int64_t steps = 0;
  bool alive = true;  // false once the forward threw: /health must answer 503
  std::string error;  // why it died
};

class EngineCore {
 public:
  // `runner` must outlive the engine; block ids handed out are in [0, num_kv_blocks).
  EngineCore(EngineConfig config, ModelRunner& runner);
  // Aborts whatever is left and joins the engine thread.
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // --- any thread ---
  // Validates (400-class problems come back at once, before any streaming starts), then
  // queues the request for the engine thread.
  SubmitResult submit(EngineRequest request);
  // Ends the request's unfinished choices with Abort; no-op for unknown or finished ids.
  void abort(const std::string& request_id);
  // Throws attnres::Error for a request the engine would refuse (the server's 400 message).
  void validate(const EngineRequest& request) const;
  // The request's compiled constraint (null when it has none); throws attnres::Error naming
  // the constraint's field when it does not compile. Any thread.
  std::shared_ptr<const CompiledConstraint> compile_constraint(const SamplingParams& params) const;
  EngineStats stats() const;
  // The rows and columns of the depth-attention matrices in RequestOutput (fixed at
  // construction, so any thread may read it); empty when the model cannot report them.
  const DepthAttentionLayout& depth_attention_layout() const { return depth_layout_; }
  // Whether rows that allow it are sampled on the device (EngineConfig::device_sampling and
  // ModelRunner::samples_on_device; fixed at construction, so any thread may read it).
  bool samples_on_device() const { return device_sampling_; }
  // Whether steps overlap the host's delivery with the device (EngineConfig::async_scheduling
  // and ModelRunner::launches_asynchronously; fixed at construction).
  bool async_scheduling() const { return async_; }

  // --- lifecycle (the owning thread) ---
  // Runs the loop on a new engine thread.
  void start();
  // Graceful shutdown: stops accepting, lets accepted requests run for up to `grace`, then
  // aborts the rest and stops the engine thread. Returns true when nothing had to be aborted.
  // Without start(), the caller's thread runs the steps.
  bool shutdown(std::chrono::milliseconds grace);

  // One iteration of the loop on the caller's thread, for tests and offline drivers that do
  // not start() the engine thread. Returns false once there is nothing left to do.
  bool step();

 private:
  struct ActiveRequest;
  struct Inbox;
  // An output on its way to a request's stream (the outbox, flush_outbox).
  struct Outgoing {
    ActiveRequest* request = nullptr;
    RequestOutput output;
  };
  struct Submitted {
    EngineRequest request;
    std::shared_ptr<const CompiledConstraint> constraint;  // compiled at submit
    std::shared_ptr<StreamChannel> channel;
    EngineClock::time_point arrival;
  };
  // What drain_inbox() took from the inbox for this step.
  struct Drained {
    std::deque<Submitted> requests;
    std::vector<std::string> aborts;
    bool abort_all = false;  // the shutdown grace period is over
    bool empty() const { return requests.empty() && aborts.empty(); }
  };

  void loop();

  // --- the stages of step(), in order (docs/ENGINE_CONTRACT.md, "One step, in order")
  Drained drain_inbox();
  // The gap's share of the inbox: new requests only; aborts wait for the next step's cancel
  // stage (the step in flight still holds the sequences they would end).
  Drained drain_new_requests();
  // Fans each request out into its n sequences and queues them in the scheduler.
  void accept_requests(Drained& drained);
  // Ends aborted requests' unfinished sequences; their blocks are free before scheduling.
  void cancel_requests(const Drained& drained);
  // Ends sequences that can never fit with their error.
  ScheduleOutput schedule();
  // Commits the step (add_to_batch advances computed counts). Null when nothing is
  // scheduled, or when building failed (the engine is then dead).
  std::optional<StepPlan> build_batch(const ScheduleOutput& scheduled);
  // Queues the forward (ModelRunner::launch). False when it failed (the engine is then dead).
  bool launch(const StepPlan& plan);
  // Waits for it (ModelRunner::collect) and checks step_result_; registers the newly full
  // blocks in the prefix cache. False when it failed (the engine is then dead).
  bool collect(const ScheduleOutput& scheduled, const StepPlan& plan);
  StepOutputs process_outputs(const StepPlan& plan);
  // Counts usage and queues each sequence's output for its stream; finishes the sequences that
  // ended (their blocks are free for the next schedule).
  void deliver(StepOutputs& outputs);
  // Pushes the queued outputs to their streams, in order, then retires and publishes: at the
  // end of the step, or with async scheduling in the next step's gap.
  void flush_outbox();
  // Closes the streams of requests whose choices all finished and forgets them.
  void retire_finished_requests();
  void publish_stats();
  // Outputs or retirements not yet handed to the front ends.
  bool has_undelivered() const { return !outbox_.empty() || !finished_requests_.empty(); }

  // --- helpers
  ActiveRequest& request_of(const Sequence& seq);
  // A sequence ended (the scheduler has already finished it): counts it, queues its last
  // output and queues its request for retiring when it was the last choice.
  void end_sequence(const Sequence& seq, RequestOutput last);
  // The step itself failed: the KV cache is in an unknown state, so every request ends with
  // the error and new ones are refused (/health then reports 503, and the server exits).
  void fail_engine(const std::exception& error);
  void abort_everything(const std::string& error);

  const EngineConfig config_;
  ModelRunner& runner_;
  const int vocab_size_;
  const DepthAttentionLayout depth_layout_;
  const Vocabulary vocabulary_;  // what requests may name (immutable: any thread reads it)
  const bool device_sampling_;   // config_.device_sampling and the runner samples on the device
  const bool async_;             // config_.async_scheduling and the runner launches asynchronously

  // Shared with front-end threads (guarded by inbox_->mutex).
  std::shared_ptr<Inbox> inbox_;

  // Engine-thread state.
  Scheduler scheduler_;
  OutputProcessor output_processor_;
  std::unordered_map<std::string, std::unique_ptr<ActiveRequest>> requests_;
  std::vector<std::string> finished_requests_;  // ids whose choices all ended: retire them
  std::vector<Outgoing> outbox_;                // outputs not yet pushed, in order
  bool dead_ = false;                           // a step failed (fail_engine)
  uint64_t next_arrival_order_ = 0;
  StepResult step_result_;  // the forward's output, its buffers reused from step to step
  EngineStats counters_;    // the engine thread's running totals

  mutable std::mutex stats_mutex_;
  EngineStats published_;  // what stats() returns

  std::thread thread_;
};

}  // namespace attnres
