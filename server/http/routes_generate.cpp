// POST /v1/completions and POST /v1/chat/completions: parse and submit on a request worker
// (every 4xx / 503 is sent before a stream starts), then hand the connection an AsyncBody
// that either streams the outputs as SSE or collects the whole answer; the connection pumps
// it whenever the engine has news.
#include <chrono>
#include <memory>

#include "server/common/generation.h"
#include "server/http/api_error.h"
#include "server/http/chat_answer_json.h"
#include "server/http/openai_requests.h"
#include "server/http/openai_responses.h"
#include "server/http/router.h"
#include "server/http/routes.h"
#include "server/http/sse_stream.h"

namespace attnres::server::http {
namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Json ids_json(const std::vector<int32_t>& ids) { return Json(ids); }

// A streamed output's depth-attention weights: the labels and the prompt mean with the
// choice's first output, the per-token matrices with the chunk that carries their tokens.
Json chunk_depth_json(const ServerState& state, const RequestOutput& o) {
  return depth_attention_json(state.engine().depth_attention_layout(),
                              o.depth_prompt_mean ? &*o.depth_prompt_mean : nullptr,
                              o.depth_per_token.empty() ? nullptr : &o.depth_per_token);
}

// A whole choice's (non-streamed): the prompt mean, plus per_token when asked for.
Json choice_depth_json(const DepthAttentionLayout& layout, const SamplingParams& params,
                       const ChoiceResult& r) {
  return depth_attention_json(layout, r.depth_prompt_mean ? &*r.depth_prompt_mean : nullptr,
                              params.depth_attention_per_token ? &r.depth_per_token : nullptr);
}

// An engine error ended a choice (not a client mistake): 500, or 503 once the engine died.
int engine_error_status(const ServerState& state) {
  return state.engine().stats().alive ? 500 : 503;
}

Json engine_error_envelope(const ServerState& state, const std::string& error) {
  return error_body(engine_error_status(state), "generation failed: " + error);
}

// Turns a request's outputs into SSE events, one formatter per API shape.
class StreamFormatter {
 public:
  // continuous_usage: every chunk carries its choice's usage so far (vLLM's
  // stream_options.continuous_usage_stats); choice_prompt_tokens[i]: choice i's prompt length.
  StreamFormatter(const ServerState& state, ResponseHead head, bool continuous_usage,
                  std::vector<int> choice_prompt_tokens)
      : state_(state),
        tokenizer_(*state.model().tokenizer),
        head_(std::move(head)),
        continuous_usage_(continuous_usage),
        choice_prompt_tokens_(std::move(choice_prompt_tokens)),
        choice_tokens_(choice_prompt_tokens_.size(), 0) {}
  virtual ~StreamFormatter() = default;
  // Counts the output's tokens, then formats it.
  bool add(const RequestOutput& o, SseWriter& out) {
    choice_tokens_[static_cast<size_t>(o.choice_index)] += static_cast<int>(o.token_ids.size());
    return on_output(o, out);
  }

 protected:
  // Appends the events for one output; false ends the stream (an engine error went in-band).
  virtual bool on_output(const RequestOutput& o, SseWriter& out) = 0;

  // A chunk: the head's fields and one choice (its usage so far when asked for).
  Json chunk_json(Json choice) const {
    const size_t i = choice["index"].get<size_t>();
    Json j = head_json(head_);
    j["choices"] = Json::array({std::move(choice)});
    if (continuous_usage_) {
      Usage usage;
      usage.prompt_tokens = choice_prompt_tokens_[i];
      usage.completion_tokens = choice_tokens_[i];
      j["usage"] = usage_json(usage);
    }
    return j;
  }

  const ServerState& state_;
  const Tokenizer& tokenizer_;
  const ResponseHead head_;

 private:
  const bool continuous_usage_;
  const std::vector<int> choice_prompt_tokens_;
  std::vector<int> choice_tokens_;
};

// Builds a non-streamed body from every choice's accumulated result.
using BodyBuilder = std::function<Json(const std::vector<ChoiceResult>&, const Usage&)>;

// The stream of a streamed request: its events as the engine produces them, then the usage
// chunk when asked for (choices: []) and [DONE].
class StreamedGeneration : public AsyncBody {
 public:
  StreamedGeneration(ResponseHead head, bool include_usage, std::unique_ptr<Generation> generation,
                     std::unique_ptr<StreamFormatter> formatter)
      : head_(std::move(head)),
        include_usage_(include_usage),
        generation_(std::move(generation)),
        formatter_(std::move(formatter)) {}

  bool streamed() const override { return true; }
  void set_wake(std::function<void()> wake) override { generation_->set_listener(std::move(wake)); }
  void cancel() override { generation_->cancel(); }

  bool pump(std::string& chunk, HttpResponse&) override {
    SseWriter out(chunk);
    RequestOutput o;
    while (generation_->next(o)) {
      if (!formatter_->add(o, out)) {
        generation_->cancel();
        return true;
      }
    }
    if (!generation_->ended()) return false;
    if (include_usage_) {
      Json j = head_json(head_);
      j["choices"] = Json::array();
      j["usage"] = usage_json(generation_->usage());
      out.event(j);
    }
    out.done();
    return true;
  }

 private:
  const ResponseHead head_;
  const bool include_usage_;
  std::unique_ptr<Generation> generation_;
  std::unique_ptr<StreamFormatter> formatter_;
};

// A non-streamed request: every choice accumulated, then one body (or the engine's error).
class CollectedGeneration : public AsyncBody {
 public:
  CollectedGeneration(const ServerState& state, std::unique_ptr<Generation> generation,
                      BodyBuilder build)
      : state_(state),
        generation_(std::move(generation)),
        results_(static_cast<size_t>(generation_->num_choices())),
        build_(std::move(build)) {}

  bool streamed() const override { return false; }
  void set_wake(std::function<void()> wake) override { generation_->set_listener(std::move(wake)); }
  void cancel() override { generation_->cancel(); }

  bool pump(std::string&, HttpResponse& whole) override {
    RequestOutput o;
    while (generation_->next(o)) results_[static_cast<size_t>(o.choice_index)].add(o);
    if (!generation_->ended()) return false;
    for (const ChoiceResult& r : results_) {
      if (!r.error.empty()) {
        send_error(whole, engine_error_status(state_), "generation failed: " + r.error);
        return true;
      }
    }
    send_json(whole, 200, build_(results_, generation_->usage()));
    return true;
  }

 private:
  const ServerState& state_;
  std::unique_ptr<Generation> generation_;
  std::vector<ChoiceResult> results_;
  BodyBuilder build_;
};

// ---- /v1/completions ----

Json completion_choice(int index, std::string text, Json logprobs, FinishReason reason,
                       Json stop_reason) {
  Json choice;
  choice["index"] = index;
  choice["text"] = std::move(text);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason_json(reason);
  choice["stop_reason"] = std::move(stop_reason);
  return choice;
}

class CompletionStream : public StreamFormatter {
 public:
  CompletionStream(const ServerState& state, ResponseHead head,
                   std::shared_ptr<const CompletionRequest> request, int choices,
                   std::vector<int> choice_prompt_tokens)
      : StreamFormatter(state, std::move(head), request->options.continuous_usage,
                        std::move(choice_prompt_tokens)),
        request_(std::move(request)),
        started_(static_cast<size_t>(choices), false),
        text_offset_(static_cast<size_t>(choices), 0) {}

  bool on_output(const RequestOutput& o, SseWriter& out) override {
    const GenerationOptions& options = request_->options;
    const size_t i = static_cast<size_t>(o.choice_index);
    const PromptInput& prompt = request_->prompts[i / static_cast<size_t>(options.n)];
    if (!o.error.empty()) {
      out.error(engine_error_envelope(state_, o.error));
      return false;
    }
    std::string text = o.text;
    const bool first = !started_[i];
    if (first && request_->echo) text = prompt.text + text;
    started_[i] = true;
    // With return_token_ids every id is sent, even one whose text is still held back.
    const bool ids_to_send = options.return_token_ids && (first || !o.token_ids.empty());
    // echo with logprobs: each choice's first chunk starts with its prompt's logprobs (the
    // engine sends them with every choice's first output).
    const bool prompt_part = first && request_->echo && options.params.prompt_logprobs >= 0 &&
                             !o.prompt_logprobs.empty();
    const bool depth = has_depth_attention(o);
    // A step that generated tokens gets a chunk even when its text is held back (an
    // incomplete UTF-8 character, a possible stop string): one chunk per engine step, as
    // vLLM streams, so benchmarks time every step.
    if (!text.empty() || !o.token_ids.empty() || !o.logprobs.empty() || ids_to_send ||
        prompt_part || depth) {
      Json logprobs = nullptr;
      if (options.params.logprobs >= 0) {
        logprobs = prompt_part ? completion_logprobs_json(tokenizer_, prompt.ids, o.prompt_logprobs,
                                                          o.logprobs, text_offset_[i])
                               : completion_logprobs_json(tokenizer_, o.logprobs, text_offset_[i]);
      }
      // The last output's chunk carries the finish reason, as vLLM's do: a separate empty
      // chunk would count as one more token chunk in vLLM's benchmark (an ITL of ~0).
      Json c = completion_choice(
          o.choice_index, std::move(text), std::move(logprobs),
          o.finished() ? o.finish_reason : FinishReason::None,
          o.finished() ? stop_reason_json(o.stop_string, o.stop_token) : Json(nullptr));
      if (options.return_token_ids) {
        c["token_ids"] = ids_json(o.token_ids);
        if (first) c["prompt_token_ids"] = ids_json(prompt.ids);
      }
      if (depth) c["depth_attention"] = chunk_depth_json(state_, o);
      chunk(out, std::move(c));
    } else if (o.finished()) {  // nothing else to send with it (e.g. a stop string ended it)
      chunk(out, completion_choice(o.choice_index, "", nullptr, o.finish_reason,
                                   stop_reason_json(o.stop_string, o.stop_token)));
    }
    return true;
  }

 private:
  void chunk(SseWriter& out, Json choice) const { out.event(chunk_json(std::move(choice))); }

  const std::shared_ptr<const CompletionRequest> request_;
  std::vector<bool> started_;
  std::vector<size_t> text_offset_;
};

Json completion_body(const ResponseHead& head, const CompletionRequest& request,
                     const std::vector<ChoiceResult>& results, const Usage& usage,
                     const Tokenizer& tokenizer, const DepthAttentionLayout& depth_layout) {
  Json body = head_json(head);
  Json choices = Json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const ChoiceResult& r = results[i];
    const PromptInput& prompt = request.prompts[i / static_cast<size_t>(request.options.n)];
    Json logprobs = nullptr;
    if (request.options.params.logprobs >= 0) {
      size_t offset = 0;
      logprobs = request.echo && request.options.params.prompt_logprobs >= 0
                     ? completion_logprobs_json(tokenizer, prompt.ids, r.prompt_logprobs,
                                                r.logprobs, offset)
                     : completion_logprobs_json(tokenizer, r.logprobs, offset);
    }
    Json c = completion_choice(static_cast<int>(i), request.echo ? prompt.text + r.text : r.text,
                               std::move(logprobs), r.finish_reason,
                               stop_reason_json(r.stop_string, r.stop_token));
    if (request.options.return_token_ids) {
      c["token_ids"] = ids_json(r.token_ids);
      c["prompt_token_ids"] = ids_json(prompt.ids);
    }
    if (request.options.params.prompt_logprobs >= 0) {
      c["prompt_logprobs"] = prompt_logprobs_json(tokenizer, prompt.ids, r.prompt_logprobs);
    }
    if (request.options.params.depth_attention) {
      c["depth_attention"] = choice_depth_json(depth_layout, request.options.params, r);
    }
    choices.push_back(std::move(c));
  }
  body["choices"] = std::move(choices);
  body["usage"] = usage_json(usage);
  return body;
}

// ---- /v1/chat/completions ----

Json chat_chunk_choice(int index, Json delta, Json logprobs, FinishReason reason,
                       Json stop_reason) {
  Json choice;
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason_json(reason);
  if (reason != FinishReason::None) choice["stop_reason"] = std::move(stop_reason);
  return choice;
}

class ChatStream : public StreamFormatter {
 public:
  ChatStream(const ServerState& state, ResponseHead head,
             std::shared_ptr<const ChatRequest> request, int choices,
             std::vector<int> choice_prompt_tokens)
      : StreamFormatter(state, std::move(head), request->options.continuous_usage,
                        std::move(choice_prompt_tokens)),
        request_(std::move(request)),
        role_sent_(static_cast<size_t>(choices), false) {
    if (request_->answer_format.parses()) {
      for (int i = 0; i < choices; ++i) answers_.emplace_back(request_->answer_format);
    }
  }

  bool on_output(const RequestOutput& o, SseWriter& out) override {
    const size_t i = static_cast<size_t>(o.choice_index);
    if (!o.error.empty()) {
      out.error(engine_error_envelope(state_, o.error));
      return false;
    }
    if (!role_sent_[i]) {  // sent with the first output: after prefill, an honest TTFT
      role_sent_[i] = true;
      Json delta;
      delta["role"] = "assistant";
      delta["content"] = "";
      chunk(out, chat_chunk_choice(o.choice_index, std::move(delta), nullptr, FinishReason::None,
                                   nullptr));
    }
    const bool depth = has_depth_attention(o);
    if (!answers_.empty()) return on_parsed_output(o, out, depth);
    // One chunk per step that generated tokens, even if its text is held back (vLLM).
    if (!o.text.empty() || !o.token_ids.empty() || !o.logprobs.empty() || depth) {
      Json delta;
      delta["content"] = o.text;
      Json logprobs = request_->logprobs ? chat_logprobs_json(tokenizer_, o.logprobs) : nullptr;
      // The finish reason rides on the last content chunk (vLLM), not on a chunk of its own.
      Json c = chat_chunk_choice(
          o.choice_index, std::move(delta), std::move(logprobs),
          o.finished() ? o.finish_reason : FinishReason::None,
          o.finished() ? stop_reason_json(o.stop_string, o.stop_token) : Json(nullptr));
      if (request_->options.return_token_ids) c["token_ids"] = ids_json(o.token_ids);
      if (depth) c["depth_attention"] = chunk_depth_json(state_, o);
      chunk(out, std::move(c));
    } else if (o.finished()) {  // nothing else to send with it
      chunk(out, chat_chunk_choice(o.choice_index, Json::object(), nullptr, o.finish_reason,
                                   stop_reason_json(o.stop_string, o.stop_token)));
    }
    return true;
  }

 private:
  // An answer split into reasoning, content and tool calls: the step's pieces as deltas (a
  // step whose text the parsers hold back sends only what else it carries), the logprobs,
  // token ids and depth weights on the first, the finish reason on the last.
  bool on_parsed_output(const RequestOutput& o, SseWriter& out, bool depth) {
    ChatAnswerStream& answer = answers_[static_cast<size_t>(o.choice_index)];
    ChatAnswerDelta d = answer.push(o.text);
    if (o.finished()) {
      ChatAnswerDelta rest = answer.finish();
      d.reasoning += rest.reasoning;
      d.content += rest.content;
      for (ToolCallDelta& c : rest.calls) d.calls.push_back(std::move(c));
    }
    std::vector<Json> deltas = chat_answer_deltas(d, request_->include_reasoning);
    const bool ids = request_->options.return_token_ids && !o.token_ids.empty();
    if (deltas.empty() && (ids || !o.logprobs.empty() || depth || o.finished())) {
      deltas.push_back(Json::object());
    }
    for (size_t k = 0; k < deltas.size(); ++k) {
      const bool first = k == 0, last = k + 1 == deltas.size();
      Json logprobs =
          first && request_->logprobs ? chat_logprobs_json(tokenizer_, o.logprobs) : Json(nullptr);
      const bool finishing = last && o.finished();
      Json c = chat_chunk_choice(
          o.choice_index, std::move(deltas[k]), std::move(logprobs),
          finishing ? o.finish_reason : FinishReason::None,
          finishing ? stop_reason_json(o.stop_string, o.stop_token) : Json(nullptr));
      if (finishing)
        c["finish_reason"] = chat_finish_reason_json(o.finish_reason, answer.made_calls());
      if (request_->options.return_token_ids)
        c["token_ids"] = ids_json(first ? o.token_ids : std::vector<int32_t>{});
      if (first && depth) c["depth_attention"] = chunk_depth_json(state_, o);
      chunk(out, std::move(c));
    }
    return true;
  }

  void chunk(SseWriter& out, Json choice) {
    Json j = chunk_json(std::move(choice));
    if (first_chunk_ && request_->options.return_token_ids) {
      j["prompt_token_ids"] = ids_json(request_->prompt.ids);
    }
    first_chunk_ = false;
    out.event(j);
  }

  const std::shared_ptr<const ChatRequest> request_;
  std::vector<bool> role_sent_;
  std::vector<ChatAnswerStream> answers_;  // one per choice, when the answer is parsed
  bool first_chunk_ = true;
};

Json chat_body(const ResponseHead& head, const ChatRequest& request,
               const std::vector<ChoiceResult>& results, const Usage& usage,
               const Tokenizer& tokenizer, const DepthAttentionLayout& depth_layout) {
  Json body = head_json(head);
  Json choices = Json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const ChoiceResult& r = results[i];
    Json message;
    message["role"] = "assistant";
    const ChatAnswer answer = parse_chat_answer(request.answer_format, r.text);
    set_message_answer(message, answer, request.answer_format, request.include_reasoning);
    Json c;
    c["index"] = static_cast<int>(i);
    c["message"] = std::move(message);
    c["logprobs"] = request.logprobs ? chat_logprobs_json(tokenizer, r.logprobs) : Json(nullptr);
    c["finish_reason"] = chat_finish_reason_json(r.finish_reason, !answer.calls.empty());
    c["stop_reason"] = stop_reason_json(r.stop_string, r.stop_token);
    if (request.options.return_token_ids) c["token_ids"] = ids_json(r.token_ids);
    if (request.options.params.depth_attention) {
      c["depth_attention"] = choice_depth_json(depth_layout, request.options.params, r);
    }
    choices.push_back(std::move(c));
  }
  body["choices"] = std::move(choices);
  body["usage"] = usage_json(usage);
  if (request.options.return_token_ids) body["prompt_token_ids"] = ids_json(request.prompt.ids);
  // vLLM puts chat's prompt_logprobs beside the choices: they share the prompt.
  if (request.options.params.prompt_logprobs >= 0 && !results.empty()) {
    body["prompt_logprobs"] =
        prompt_logprobs_json(tokenizer, request.prompt.ids, results.front().prompt_logprobs);
  }
  return body;
}

// Submits a parsed request and sets `res` to stream it (SSE) or to collect it into one body.
template <typename Request, typename Formatter, typename MakeBody>
void run_generation(ServerState& state, HttpResponse& res, std::shared_ptr<const Request> request,
                    ResponseHead head, const std::vector<std::vector<int32_t>>& prompts,
                    MakeBody make_body) {
  const GenerationOptions& options = request->options;
  auto generation =
      std::make_unique<Generation>(state, head.id, prompts, options.params, options.n);
  if (options.stream) {
    // Chat chunks are "chat.completion.chunk"; legacy completion chunks stay
    // "text_completion" (OpenAI and vLLM alike).
    if (head.object == "chat.completion") head.object += ".chunk";
    std::vector<int> choice_prompt_tokens;
    for (const auto& prompt : prompts) {
      choice_prompt_tokens.insert(choice_prompt_tokens.end(), static_cast<size_t>(options.n),
                                  static_cast<int>(prompt.size()));
    }
    auto formatter = std::make_unique<Formatter>(state, head, request, generation->num_choices(),
                                                 std::move(choice_prompt_tokens));
    res.status = 200;
    res.content_type = "text/event-stream";
    res.headers.emplace_back("Cache-Control", "no-cache");
    res.async = std::make_shared<StreamedGeneration>(std::move(head), options.include_usage,
                                                     std::move(generation), std::move(formatter));
    return;
  }
  BodyBuilder build = [&state, request, head, make_body](const std::vector<ChoiceResult>& results,
                                                         const Usage& usage) {
    return make_body(head, *request, results, usage, *state.model().tokenizer,
                     state.engine().depth_attention_layout());
  };
  res.async = std::make_shared<CollectedGeneration>(state, std::move(generation), std::move(build));
}

}  // namespace

void handle_completions(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  const Json body = parse_json_body(req);
  auto request = std::make_shared<const CompletionRequest>(parse_completion_request(body, state));
  std::vector<std::vector<int32_t>> prompts;
  for (const PromptInput& p : request->prompts) prompts.push_back(p.ids);
  ResponseHead head{state.next_request_id("cmpl"), "text_completion", unix_now(),
                    state.options().served_model_name};
  run_generation<CompletionRequest, CompletionStream>(state, res, request, std::move(head), prompts,
                                                      completion_body);
}

void handle_chat_completions(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  const Json body = parse_json_body(req);
  auto request = std::make_shared<const ChatRequest>(parse_chat_request(body, state));
  ResponseHead head{state.next_request_id("chatcmpl"), "chat.completion", unix_now(),
                    state.options().served_model_name};
  run_generation<ChatRequest, ChatStream>(state, res, request, std::move(head),
                                          {request->prompt.ids}, chat_body);
}

}  // namespace attnres::server::http
