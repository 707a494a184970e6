// The routes that do not generate: /v1/models (and /v1/models/{model}), /version, /health,
// /metrics, /tokenize, /detokenize.
#include "engine/core/error.h"
#include "server/common/token_ids.h"
#include "server/http/api_error.h"
#include "server/http/chat_requests.h"
#include "server/http/field_reader.h"
#include "server/http/openai_requests.h"
#include "server/http/routes.h"
#include "server/http/vllm_request_fields.h"

namespace attnres::server::http {

using Json = nlohmann::ordered_json;

Json parse_json_body(const HttpRequest& req) {
  try {
    return Json::parse(req.body);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number overflow
    // nlohmann checks UTF-8 inside strings, so invalid bytes land here too.
    std::string message = "the request body is not valid JSON (or not valid UTF-8): ";
    message += e.what();
    throw bad_request(message);
  }
}

void send_json(HttpResponse& res, int status, const Json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

namespace {

Json model_json(const ServerState& state) {
  Json model;
  model["id"] = state.options().served_model_name;
  model["object"] = "model";
  model["created"] = state.created_unix();
  model["owned_by"] = "attnres";
  model["root"] = state.model().source;
  model["parent"] = nullptr;
  model["max_model_len"] = state.options().max_model_len;
  return model;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// RFC 3986 percent-decoding (clients encode the '/' of "org/model" ids as %2F); a malformed
// escape is kept as written.
std::string percent_decode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      const int hi = hex_digit(text[i + 1]), lo = hex_digit(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

}  // namespace

void handle_models(ServerState& state, const HttpRequest&, HttpResponse& res) {
  Json body;
  body["object"] = "list";
  body["data"] = Json::array({model_json(state)});
  send_json(res, 200, body);
}

void handle_model(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  constexpr std::string_view kPrefix = "/v1/models/";
  const std::string id = percent_decode(std::string_view(req.path).substr(kPrefix.size()));
  if (id != state.options().served_model_name) {
    throw ApiError(404, "The model `" + id + "` does not exist.", "model", "model_not_found");
  }
  send_json(res, 200, model_json(state));
}

void handle_version(ServerState&, const HttpRequest&, HttpResponse& res) {
  Json body;
  body["version"] = ATTNRES_VERSION;
  send_json(res, 200, body);
}

void handle_health(ServerState& state, const HttpRequest&, HttpResponse& res) {
  const EngineStats stats = state.engine().stats();
  if (stats.alive && state.accepting()) {
    res.status = 200;
    res.set_content("", "text/plain");
    return;
  }
  // Never 200 over a dead or draining engine (API.md).
  std::string why = stats.alive ? "shutting down" : "engine failed: " + stats.error;
  res.status = 503;
  res.set_content(dump_json(error_body(503, why)), "application/json");
}

void handle_metrics(ServerState& state, const HttpRequest&, HttpResponse& res) {
  res.status = 200;
  res.set_content(state.metrics().render(state.engine().stats()),
                  "text/plain; version=0.0.4; charset=utf-8");
}

void handle_tokenize(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  const Json body = parse_json_body(req);
  FieldReader f(body);
  check_model_field(body, state);
  const Tokenizer& tokenizer = *state.model().tokenizer;
  std::vector<int32_t> ids;
  if (const auto* messages = f.find("messages")) {
    // vLLM: a conversation is rendered with the template, which writes its own special tokens,
    // with the chat request's template options.
    const ChatPromptOptions options = read_chat_prompt_options(f);
    nlohmann::ordered_json tools = nullptr;
    if (const auto* t = f.find("tools")) tools = *t;
    const auto normalized = normalize_messages(*messages);
    std::string text = render_chat_prompt(
        state.model(), normalized, options.add_generation_prompt, tools, options.variables,
        options.chat_template ? &*options.chat_template : nullptr);
    if (options.continue_final_message) text = cut_after_final_message(text, normalized);
    ids = tokenizer.encode(text, options.add_special_tokens);
  } else if (auto prompt = f.string("prompt")) {
    ids = tokenizer.encode(*prompt, f.boolean("add_special_tokens").value_or(true));
  } else {
    throw bad_request("field prompt: is required (or messages)", "prompt");
  }
  Json out;
  out["count"] = ids.size();
  out["max_model_len"] = state.options().max_model_len;
  out["tokens"] = ids;
  if (f.boolean("return_token_strs").value_or(false)) {
    Json strs = Json::array();
    for (int32_t id : ids) strs.push_back(tokenizer.id_to_token(id));
    out["token_strs"] = std::move(strs);
  }
  send_json(res, 200, out);
}

void handle_detokenize(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  const Json body = parse_json_body(req);
  FieldReader f(body);
  check_model_field(body, state);
  auto ids = f.int_list("tokens");
  if (!ids) throw bad_request("field tokens: is required", "tokens");
  server::check_token_ids("tokens", *ids, state.model().vocabulary());
  Json out;
  out["prompt"] = state.model().tokenizer->decode(*ids, /*skip_special_tokens=*/false);
  send_json(res, 200, out);
}

}  // namespace attnres::server::http
