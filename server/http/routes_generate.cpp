// POST /v1/completions and POST /v1/chat/completions: parse, submit (every 4xx / 503 is sent
// before a stream starts), then either collect the whole answer or stream it as SSE.
#include <chrono>
#include <memory>

#include "server/http/api_error.h"
#include "server/http/client_connection.h"
#include "server/http/generation.h"
#include "server/http/openai_requests.h"
#include "server/http/openai_responses.h"
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

ClientConnection client_of(const httplib::Request& req) {
  return ClientConnection(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
}

void require_accepting(const ServerState& state) {
  if (!state.accepting()) {
    throw ApiError(503, "the server is shutting down and accepts no new requests", "",
                   "unavailable");
  }
}

// An engine error ended a choice (not a client mistake): 503 once the engine died, else 500.
[[noreturn]] void throw_engine_error(const ServerState& state, const std::string& error) {
  const int status = state.engine().stats().alive ? 500 : 503;
  throw ApiError(status, "generation failed: " + error);
}

Json engine_error_envelope(const ServerState& state, const std::string& error) {
  return error_body(state.engine().stats().alive ? 500 : 503, "generation failed: " + error);
}

std::vector<ChoiceResult> collect(Generation& generation, const ClientConnection& client,
                                  bool* client_gone) {
  std::vector<ChoiceResult> results(static_cast<size_t>(generation.num_choices()));
  const DriveResult end = drive_generation(generation, client, [&](const RequestOutput& out) {
    results[static_cast<size_t>(out.choice_index)].add(out);
    return true;
  });
  *client_gone = end == DriveResult::ClientGone;
  return results;
}

// What the streaming content provider owns once the handler has returned.
struct StreamJob {
  ServerState& state;
  ResponseHead head;
  GenerationOptions options;
  std::unique_ptr<Generation> generation;
  ClientConnection client;
};

void start_sse(httplib::Response& res, std::shared_ptr<StreamJob> job,
               std::function<void(StreamJob&, SseWriter&)> body) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [job, body](size_t, httplib::DataSink& sink) {
        SseWriter writer([&sink](const char* data, size_t size) { return sink.write(data, size); });
        body(*job, writer);
        if (!writer.ok()) return false;  // the client is gone: drop the connection
        sink.done();
        return true;
      });
}

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

// The end of every stream: the usage chunk when asked for (choices: []), then [DONE].
void finish_stream(StreamJob& job, SseWriter& out, DriveResult end) {
  if (end == DriveResult::ClientGone || !out.ok()) return;
  if (job.options.include_usage) {
    Json j = head_json(job.head);
    j["choices"] = Json::array();
    j["usage"] = usage_json(job.generation->usage());
    if (!out.event(j)) return;
  }
  out.done();
}

void stream_completion(StreamJob& job, const CompletionRequest& request, SseWriter& out) {
  const Tokenizer& tokenizer = *job.state.model().tokenizer;
  const size_t n = static_cast<size_t>(job.options.n);
  const size_t choices = static_cast<size_t>(job.generation->num_choices());
  std::vector<bool> started(choices, false);
  std::vector<size_t> text_offset(choices, 0);
  // echo with logprobs: each choice's first chunk starts with its prompt's logprobs, which the
  // engine sends once per prompt, with choice p * n's first output. Another choice's outputs
  // that come before that one are held back until it does.
  const bool prompt_logprobs = request.echo && job.options.params.prompt_logprobs >= 0;
  std::vector<bool> prompt_known(request.prompts.size(), !prompt_logprobs);
  std::vector<std::vector<std::optional<TokenLogprob>>> prompt_lps(request.prompts.size());
  std::vector<std::vector<RequestOutput>> held(choices);
  auto chunk = [&](Json choice) {
    Json j = head_json(job.head);
    j["choices"] = Json::array({std::move(choice)});
    return out.event(j);
  };
  auto send = [&](const RequestOutput& o) {
    const size_t i = static_cast<size_t>(o.choice_index);
    const size_t p = i / n;
    const PromptInput& prompt = request.prompts[p];
    std::string text = o.text;
    const bool first = !started[i];
    if (first && request.echo) text = prompt.text + text;
    started[i] = true;
    if (!o.error.empty()) return out.error(engine_error_envelope(job.state, o.error)) && false;
    // With return_token_ids every id is sent, even one whose text is still held back.
    const bool ids_to_send = job.options.return_token_ids && (first || !o.token_ids.empty());
    const bool prompt_part = first && prompt_logprobs && !prompt_lps[p].empty();
    const bool depth = has_depth_attention(o);
    // A step that generated tokens gets a chunk even when its text is held back (an
    // incomplete UTF-8 character, a possible stop string): one chunk per engine step, as
    // vLLM streams, so benchmarks time every step.
    if (!text.empty() || !o.token_ids.empty() || !o.logprobs.empty() || ids_to_send ||
        prompt_part || depth) {
      Json logprobs = nullptr;
      if (job.options.params.logprobs >= 0) {
        logprobs = prompt_part ? completion_logprobs_json(tokenizer, prompt.ids, prompt_lps[p],
                                                          o.logprobs, text_offset[i])
                               : completion_logprobs_json(tokenizer, o.logprobs, text_offset[i]);
      }
      // The last output's chunk carries the finish reason, as vLLM's do: a separate empty
      // chunk would count as one more token chunk in vLLM's benchmark (an ITL of ~0).
      Json c = completion_choice(
          o.choice_index, std::move(text), std::move(logprobs),
          o.finished() ? o.finish_reason : FinishReason::None,
          o.finished() ? stop_reason_json(o.stop_string, o.stop_token) : Json(nullptr));
      if (job.options.return_token_ids) {
        c["token_ids"] = ids_json(o.token_ids);
        if (first) c["prompt_token_ids"] = ids_json(prompt.ids);
      }
      if (depth) c["depth_attention"] = chunk_depth_json(job.state, o);
      return chunk(std::move(c));
    }
    if (o.finished()) {  // nothing else to send with it (e.g. a stop string ended the text)
      Json c = completion_choice(o.choice_index, "", nullptr, o.finish_reason,
                                 stop_reason_json(o.stop_string, o.stop_token));
      if (!chunk(std::move(c))) return false;
    }
    return true;
  };
  auto flush_held = [&](size_t p) {
    for (size_t i = p * n; i < (p + 1) * n && i < choices; ++i) {
      for (const RequestOutput& o : held[i]) {
        if (!send(o)) return false;
      }
      held[i].clear();
    }
    return true;
  };
  const DriveResult end =
      drive_generation(*job.generation, job.client, [&](const RequestOutput& o) {
        const size_t i = static_cast<size_t>(o.choice_index);
        const size_t p = i / n;
        if (!prompt_known[p]) {
          if (i % n != 0) {
            held[i].push_back(o);
            return true;
          }
          prompt_known[p] = true;  // choice 0's first output (without them only if it failed)
          prompt_lps[p] = o.prompt_logprobs;
          return send(o) && flush_held(p);
        }
        return send(o);
      });
  if (end != DriveResult::ClientGone && out.ok()) {
    for (size_t p = 0; p < request.prompts.size(); ++p) {
      if (!flush_held(p)) break;
    }
  }
  finish_stream(job, out, end);
}

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
      // echo with logprobs: the prompt's logprobs came with the prompt's first choice.
      const size_t first_choice = i - i % static_cast<size_t>(request.options.n);
      logprobs =
          request.echo && request.options.params.prompt_logprobs >= 0
              ? completion_logprobs_json(tokenizer, prompt.ids,
                                         results[first_choice].prompt_logprobs, r.logprobs, offset)
              : completion_logprobs_json(tokenizer, r.logprobs, offset);
    }
    Json c = completion_choice(static_cast<int>(i), request.echo ? prompt.text + r.text : r.text,
                               std::move(logprobs), r.finish_reason,
                               stop_reason_json(r.stop_string, r.stop_token));
    if (request.options.return_token_ids) {
      c["token_ids"] = ids_json(r.token_ids);
      c["prompt_token_ids"] = ids_json(prompt.ids);
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

void stream_chat(StreamJob& job, const ChatRequest& request, SseWriter& out) {
  const Tokenizer& tokenizer = *job.state.model().tokenizer;
  const size_t choices = static_cast<size_t>(job.generation->num_choices());
  std::vector<bool> role_sent(choices, false);
  bool first_chunk = true;
  auto chunk = [&](Json choice) {
    Json j = head_json(job.head);
    j["choices"] = Json::array({std::move(choice)});
    if (first_chunk && job.options.return_token_ids) {
      j["prompt_token_ids"] = ids_json(request.prompt.ids);
    }
    first_chunk = false;
    return out.event(j);
  };
  const DriveResult end =
      drive_generation(*job.generation, job.client, [&](const RequestOutput& o) {
        const size_t i = static_cast<size_t>(o.choice_index);
        if (!o.error.empty()) return out.error(engine_error_envelope(job.state, o.error)) && false;
        if (!role_sent[i]) {  // sent with the first output: after prefill, an honest TTFT
          role_sent[i] = true;
          Json delta;
          delta["role"] = "assistant";
          delta["content"] = "";
          if (!chunk(chat_chunk_choice(o.choice_index, std::move(delta), nullptr,
                                       FinishReason::None, nullptr))) {
            return false;
          }
        }
        const bool depth = has_depth_attention(o);
        // One chunk per step that generated tokens, even if its text is held back (vLLM).
        if (!o.text.empty() || !o.token_ids.empty() || !o.logprobs.empty() || depth) {
          Json delta;
          delta["content"] = o.text;
          Json logprobs = request.logprobs ? chat_logprobs_json(tokenizer, o.logprobs) : nullptr;
          // The finish reason rides on the last content chunk (vLLM), not on a chunk of its own.
          Json c = chat_chunk_choice(
              o.choice_index, std::move(delta), std::move(logprobs),
              o.finished() ? o.finish_reason : FinishReason::None,
              o.finished() ? stop_reason_json(o.stop_string, o.stop_token) : Json(nullptr));
          if (job.options.return_token_ids) c["token_ids"] = ids_json(o.token_ids);
          if (depth) c["depth_attention"] = chunk_depth_json(job.state, o);
          return chunk(std::move(c));
        }
        if (o.finished()) {  // nothing else to send with it
          Json c = chat_chunk_choice(o.choice_index, Json::object(), nullptr, o.finish_reason,
                                     stop_reason_json(o.stop_string, o.stop_token));
          if (!chunk(std::move(c))) return false;
        }
        return true;
      });
  finish_stream(job, out, end);
}

Json chat_body(const ResponseHead& head, const ChatRequest& request,
               const std::vector<ChoiceResult>& results, const Usage& usage,
               const Tokenizer& tokenizer, const DepthAttentionLayout& depth_layout) {
  Json body = head_json(head);
  Json choices = Json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const ChoiceResult& r = results[i];
    Json message;
    message["role"] = "assistant";
    message["content"] = r.text;
    Json c;
    c["index"] = static_cast<int>(i);
    c["message"] = std::move(message);
    c["logprobs"] = request.logprobs ? chat_logprobs_json(tokenizer, r.logprobs) : Json(nullptr);
    c["finish_reason"] = finish_reason_json(r.finish_reason);
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
  return body;
}

// Runs a parsed request: streamed (SSE) or collected into one body by `make_body`.
template <typename Request, typename StreamFn, typename BodyFn>
void run_generation(ServerState& state, const httplib::Request& req, httplib::Response& res,
                    std::shared_ptr<const Request> request, ResponseHead head,
                    const std::vector<std::vector<int32_t>>& prompts, StreamFn stream_fn,
                    BodyFn make_body) {
  const GenerationOptions& options = request->options;
  auto generation =
      std::make_unique<Generation>(state, head.id, prompts, options.params, options.n);
  if (options.stream) {
    // Chat chunks are "chat.completion.chunk"; legacy completion chunks stay
    // "text_completion" (OpenAI and vLLM alike).
    if (head.object == "chat.completion") head.object += ".chunk";
    auto job = std::make_shared<StreamJob>(
        StreamJob{state, head, options, std::move(generation), client_of(req)});
    start_sse(res, job,
              [request, stream_fn](StreamJob& j, SseWriter& out) { stream_fn(j, *request, out); });
    return;
  }
  bool client_gone = false;
  const std::vector<ChoiceResult> results = collect(*generation, client_of(req), &client_gone);
  if (client_gone) {
    res.status = 499;  // nginx's "client closed request": nobody reads it
    return;
  }
  for (const ChoiceResult& r : results) {
    if (!r.error.empty()) throw_engine_error(state, r.error);
  }
  send_json(res, 200,
            make_body(head, *request, results, generation->usage(), *state.model().tokenizer,
                      state.engine().depth_attention_layout()));
}

}  // namespace

void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  require_accepting(state);
  const Json body = parse_json_body(req);
  auto request = std::make_shared<const CompletionRequest>(parse_completion_request(body, state));
  std::vector<std::vector<int32_t>> prompts;
  for (const PromptInput& p : request->prompts) prompts.push_back(p.ids);
  ResponseHead head{state.next_request_id("cmpl"), "text_completion", unix_now(),
                    state.options().served_model_name};
  run_generation(state, req, res, request, std::move(head), prompts, stream_completion,
                 completion_body);
}

void handle_chat_completions(ServerState& state, const httplib::Request& req,
                             httplib::Response& res) {
  require_accepting(state);
  const Json body = parse_json_body(req);
  auto request = std::make_shared<const ChatRequest>(parse_chat_request(body, state));
  ResponseHead head{state.next_request_id("chatcmpl"), "chat.completion", unix_now(),
                    state.options().served_model_name};
  run_generation(state, req, res, request, std::move(head), {request->prompt.ids}, stream_chat,
                 chat_body);
}

}  // namespace attnres::server::http
