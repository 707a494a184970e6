#include "clients/bench/runner.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "clients/bench/arrival_schedule.h"
#include "clients/bench/progress_bar.h"
#include "clients/bench/stream_recorder.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

// Request indices in arrival order; pop() blocks until one arrives or the queue is closed.
class ArrivalQueue {
 public:
  void push(int index) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(index);
    }
    ready_.notify_one();
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }
  std::optional<int> pop() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return std::nullopt;
    const int index = items_.front();
    items_.pop_front();
    return index;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<int> items_;
  bool closed_ = false;
};

// send() must not throw; if a backend does anyway (a bug), the request fails, not the run.
RequestOutput send_guarded(ServingBackend& backend, const BenchPrompt& prompt,
                           const RequestSettings& settings, const std::string& request_id) {
  const double sent = steady_seconds();
  RequestOutput out;
  try {
    out = backend.send(prompt, settings, request_id);
  } catch (const std::exception& e) {
    out = RequestOutput{};
    out.start_time = sent;
    out.prompt_len = prompt.prompt_len;
    out.error = std::string("client error: ") + e.what();
  }
  check_lengths(prompt, settings.ignore_eos, out);
  return out;
}

int worker_count(const RunOptions& options, int requests) {
  return options.max_concurrency ? std::min(*options.max_concurrency, requests) : requests;
}

void warm_up(ServingBackend& backend, const BenchPrompt& prompt, const RequestSettings& settings,
             const RunOptions& options, RunResult& result) {
  const int n = options.num_warmups;
  ProgressBar bar("warm-up", n, options.progress);
  std::atomic<int> next{0}, failures{0};
  std::mutex error_mutex;
  auto work = [&] {
    for (int i = next++; i < n; i = next++) {
      RequestOutput out = send_guarded(backend, prompt, settings,
                                       settings.request_id_prefix + "warmup-" + std::to_string(i));
      if (!out.success) {
        ++failures;
        std::lock_guard<std::mutex> lock(error_mutex);
        if (result.first_warmup_error.empty()) result.first_warmup_error = out.error;
      }
      bar.update();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < worker_count(options, n); ++t) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  bar.close();
  result.warmup_failures = failures;
}

}  // namespace

void check_run_options(const RunOptions& options) {
  if (options.max_concurrency && *options.max_concurrency < 1) {
    throw Error("--max-concurrency must be > 0");
  }
  if (options.num_warmups < 0) throw Error("--num-warmups must be >= 0");
  if (options.turns < 1) throw Error("--multi-turn must be >= 1");
  check_arrival_process(options.request_rate, options.burstiness);
}

RunResult run_benchmark(ServingBackend& backend, const std::vector<BenchPrompt>& prompts,
                        const RequestSettings& settings, const RunOptions& options) {
  if (prompts.empty()) throw Error("no prompts to send");
  check_run_options(options);
  const int n = static_cast<int>(prompts.size());
  if (n % options.turns != 0) throw Error("the prompts are not whole conversations of --multi-turn");

  RunResult result;
  if (options.num_warmups > 0) warm_up(backend, prompts[0], settings, options, result);

  result.outputs.resize(n);
  const int turns = options.turns;
  const int conversations = n / turns;
  const std::vector<double> arrivals =
      arrival_times(conversations, options.request_rate, options.burstiness, options.seed);
  std::vector<double> arrived_at(conversations, 0);
  ArrivalQueue queue;
  ProgressBar bar("", n, options.progress);
  const auto start_point = std::chrono::steady_clock::now();
  const double start =
      std::chrono::duration<double>(start_point.time_since_epoch()).count();  // steady_seconds()
  auto run_conversation = [&](int c) {
    std::vector<std::string> history;
    for (int k = 0; k < turns; ++k) {
      const int i = c * turns + k;
      RequestOutput out;
      if (k > 0 && !result.outputs[i - 1].success) {
        out.start_time = steady_seconds();
        out.error = "turn " + std::to_string(k - 1) + " of this conversation failed";
      } else {
        BenchPrompt prompt = prompts[i];
        if (k > 0) {
          prompt.history = history;
          prompt.prompt_len = 0;  // history includes the answers: the total is not known
        }
        out = send_guarded(backend, prompt, settings,
                           settings.request_id_prefix + std::to_string(i));
        history.push_back(prompts[i].text);
        history.push_back(out.generated_text);
      }
      // A conversation waits for its slot once, before turn 0; later turns never queue.
      out.queue_time = k == 0 ? std::max(0.0, out.start_time - arrived_at[c]) : 0.0;
      out.start_time -= start;
      out.turn = k;
      result.outputs[i] = std::move(out);
      bar.update();
    }
  };
  auto work = [&] {
    while (std::optional<int> c = queue.pop()) run_conversation(*c);
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < worker_count(options, conversations); ++t) workers.emplace_back(work);
  for (int c = 0; c < conversations; ++c) {
    if (arrivals[c] > 0) {
      std::this_thread::sleep_until(start_point +
                                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(arrivals[c])));
    }
    arrived_at[c] = steady_seconds();
    queue.push(c);
  }
  queue.close();
  for (std::thread& t : workers) t.join();
  result.duration_s = steady_seconds() - start;
  bar.close();
  return result;
}

}  // namespace attnres::bench
