// The routes that do not generate: /v1/models, /health, /metrics, /tokenize, /detokenize.
#include "engine/core/error.h"
#include "server/common/token_ids.h"
#include "server/http/api_error.h"
#include "server/http/chat_requests.h"
#include "server/http/field_reader.h"
#include "server/http/openai_requests.h"
#include "server/http/routes.h"

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

void handle_models(ServerState& state, const HttpRequest&, HttpResponse& res) {
  Json model;
  model["id"] = state.options().served_model_name;
  model["object"] = "model";
  model["created"] = state.created_unix();
  model["owned_by"] = "attnres";
  model["root"] = state.model().source;
  model["parent"] = nullptr;
  model["max_model_len"] = state.options().max_model_len;
  Json body;
  body["object"] = "list";
  body["data"] = Json::array({std::move(model)});
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
    // vLLM: a conversation is rendered with the template, which writes its own special tokens.
    const bool add_special = f.boolean("add_special_tokens").value_or(false);
    const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    if (const auto* kwargs = f.find("chat_template_kwargs")) {
      if (!kwargs->is_object()) {
        throw bad_request("field chat_template_kwargs: expected an object", "chat_template_kwargs");
      }
      extra = *kwargs;
    }
    nlohmann::ordered_json tools = nullptr;
    if (const auto* t = f.find("tools")) tools = *t;
    const std::string text = render_chat_prompt(state.model(), normalize_messages(*messages),
                                                add_generation_prompt, tools, extra);
    ids = tokenizer.encode(text, add_special);
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
