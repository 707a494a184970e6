// POST /v1/responses: the Responses API over the chat path. The request becomes a rendered
// chat conversation (responses_requests.h) run as one Generation; the answer is split into
// output items (responses_output.h), stored for previous_response_id unless store is false,
// and sent whole or as the Responses event stream. The items are built as the text arrives
// (responses_stream.h), so a stream sends reasoning, message text and call arguments as they
// are generated.
#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>

#include "server/common/choice_result.h"
#include "server/common/generation.h"
#include "server/http/api_error.h"
#include "server/http/responses_output.h"
#include "server/http/responses_requests.h"
#include "server/http/responses_stream.h"
#include "server/http/router.h"
#include "server/http/routes.h"

namespace attnres::server::http {
namespace {

// "<prefix>_<32 hex>", OpenAI's id spelling (resp_..., msg_..., call_...).
std::string openai_id(ServerState& state, std::string_view prefix) {
  std::string id = state.next_request_id(prefix);
  id[prefix.size()] = '_';
  return id;
}

// Calls an answer may make: parallel_tool_calls false allows one, max_tool_calls caps them.
int max_calls(const ResponsesRequest& request) {
  int limit = request.parallel_tool_calls ? INT32_MAX : 1;
  if (request.max_tool_calls) limit = std::min(limit, *request.max_tool_calls);
  return limit;
}

class ResponsesBody : public AsyncBody {
 public:
  ResponsesBody(ServerState& state, std::shared_ptr<const ResponsesRequest> request,
                ResponseState response, std::unique_ptr<Generation> generation)
      : state_(state),
        request_(std::move(request)),
        response_(std::move(response)),
        generation_(std::move(generation)),
        items_(
            request_->chat.answer_format,
            [this](std::string_view prefix) { return openai_id(state_, prefix); },
            request_->chat.options.stream ? &events_ : nullptr, max_calls(*request_)) {}

  bool streamed() const override { return request_->chat.options.stream; }
  void set_wake(std::function<void()> wake) override { generation_->set_listener(std::move(wake)); }
  void cancel() override { generation_->cancel(); }

  bool pump(std::string& chunk, HttpResponse& whole) override {
    events_.set_output(&chunk);
    if (streamed() && !started_) {
      started_ = true;
      events_.started(response_json(response_, request_->echo));
    }
    RequestOutput o;
    while (generation_->next(o)) {
      result_.add(o);
      if (o.error.empty() && !o.text.empty()) items_.push(o.text);
    }
    if (!generation_->ended()) return false;
    if (!result_.error.empty()) {
      const int status = state_.engine().stats().alive ? 500 : 503;
      const std::string message = "generation failed: " + result_.error;
      if (!streamed()) {
        send_error(whole, status, message);
        return true;
      }
      response_.status = "failed";
      response_.error = {{"code", "server_error"}, {"message", message}};
      events_.failed(response_json(response_, request_->echo));
      return true;
    }
    finish();
    const Json body = response_json(response_, request_->echo);
    if (request_->store) {
      Json conversation = request_->conversation;
      for (const Json& item : response_.output) conversation.push_back(item);
      state_.response_store().put(response_.id, StoredResponse{std::move(conversation), body});
    }
    if (streamed()) {
      events_.ended(body);
    } else {
      send_json(whole, 200, body);
    }
    return true;
  }

 private:
  // The final output items (the last one's done events when streamed), status and usage.
  void finish() {
    const bool incomplete = result_.finish_reason == FinishReason::Length;
    response_.output = items_.finish(incomplete);
    response_.status = incomplete ? "incomplete" : "completed";
    if (incomplete) response_.incomplete_details = {{"reason", "max_output_tokens"}};
    // Reasoning tokens as the tokenizer encodes the reasoning text.
    const std::string& reasoning = items_.reasoning_text();
    const int reasoning_tokens =
        reasoning.empty()
            ? 0
            : int(state_.model().tokenizer->encode(reasoning, /*add_special_tokens=*/false).size());
    response_.usage = responses_usage_json(generation_->usage(), reasoning_tokens);
  }

  ServerState& state_;
  const std::shared_ptr<const ResponsesRequest> request_;
  ResponseState response_;
  std::unique_ptr<Generation> generation_;
  ResponseEventWriter events_;
  ResponseItemBuilder items_;  // sends its events when streamed
  ChoiceResult result_;
  bool started_ = false;
};

}  // namespace

void handle_responses(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  const Json body = parse_json_body(req);
  auto request = std::make_shared<const ResponsesRequest>(parse_responses_request(body, state));
  ResponseState response;
  response.id = openai_id(state, "resp");
  response.created_at = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  response.model = state.options().served_model_name;
  auto generation = std::make_unique<Generation>(
      state, response.id, std::vector<std::vector<int32_t>>{request->chat.prompt.ids},
      request->chat.options.params, 1);
  if (request->chat.options.stream) {
    res.status = 200;
    res.content_type = "text/event-stream";
    res.headers.emplace_back("Cache-Control", "no-cache");
  }
  res.async = std::make_shared<ResponsesBody>(state, std::move(request), std::move(response),
                                              std::move(generation));
}

void handle_response_get(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  constexpr std::string_view kPrefix = "/v1/responses/";
  const std::string id = req.path.substr(kPrefix.size());
  std::optional<StoredResponse> stored = state.response_store().get(id);
  if (!stored) {
    throw ApiError(404,
                   "Response with id '" + id +
                       "' not found: it was not stored (store: false), was evicted from the store "
                       "of the " +
                       std::to_string(state.response_store().capacity()) +
                       " most recent responses, or the server restarted",
                   "response_id", "not_found");
  }
  send_json(res, 200, stored->response);
}

}  // namespace attnres::server::http
