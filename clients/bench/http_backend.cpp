#include "clients/bench/http_backend.h"

#include <httplib.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "clients/bench/sse_parser.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

using Json = nlohmann::ordered_json;

constexpr time_t kConnectTimeoutSeconds = 10;
constexpr time_t kTokenizerTimeoutSeconds = 120;
constexpr size_t kMaxErrorBody = 2000;

// The message of an OpenAI-style error body, else the body itself (shortened).
std::string error_message(const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const Json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      return e["message"].get<std::string>();
    }
    if (e.is_string()) return e.get<std::string>();
  }
  return body.substr(0, 300);
}

// httplib's error names are terse ("Connection"): say what happened.
std::string describe(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "could not connect";
    case httplib::Error::ConnectionTimeout:
      return "connecting timed out";
    case httplib::Error::Read:
      return "the connection broke (or timed out) while reading the response";
    case httplib::Error::Write:
      return "the connection broke while sending the request";
    default:
      return httplib::to_string(error);
  }
}

Json sampling_fields(const SamplingOverrides& s) {
  Json j = Json::object();
  if (s.top_p) j["top_p"] = *s.top_p;
  if (s.top_k) j["top_k"] = *s.top_k;
  if (s.min_p) j["min_p"] = *s.min_p;
  if (s.temperature) j["temperature"] = *s.temperature;
  if (s.frequency_penalty) j["frequency_penalty"] = *s.frequency_penalty;
  if (s.presence_penalty) j["presence_penalty"] = *s.presence_penalty;
  if (s.repetition_penalty) j["repetition_penalty"] = *s.repetition_penalty;
  return j;
}

// vLLM's _get_chat_messages for a text prompt: one user message with one text part, after
// the multi-turn history as alternating user / assistant messages.
Json chat_messages(const std::string& text, const std::vector<std::string>& history = {}) {
  Json messages = Json::array();
  for (size_t i = 0; i < history.size(); ++i) {
    messages.push_back({{"role", i % 2 == 0 ? "user" : "assistant"}, {"content", history[i]}});
  }
  messages.push_back(
      {{"role", "user"}, {"content", Json::array({{{"type", "text"}, {"text", text}}})}});
  return messages;
}

class HttpBackend;

class HttpPromptTokenizer : public PromptTokenizer {
 public:
  HttpPromptTokenizer(const HttpBackend& backend, std::string model, OpenAiApi api)
      : backend_(backend), model_(std::move(model)), api_(api) {}
  int count_prompt(const std::string& text) override;
  std::vector<int32_t> encode_text(const std::string& text) override;
  std::string decode(const std::vector<int32_t>& ids) override;

 private:
  const HttpBackend& backend_;
  std::string model_;
  OpenAiApi api_;
};

class HttpBackend : public ServingBackend {
 public:
  HttpBackend(const std::string& base_url, OpenAiApi api, const std::string& endpoint,
              std::string api_key)
      : url_(base_url), target_(parse_http_url(base_url)), api_(api), api_key_(std::move(api_key)) {
    endpoint_ = !endpoint.empty()                    ? endpoint
                : api == OpenAiApi::kChatCompletions ? "/v1/chat/completions"
                                                     : "/v1/completions";
  }

  std::string first_model() override {
    const std::vector<std::string> ids = model_ids();
    if (ids.empty()) throw Error("the server at " + url_ + " lists no models in /v1/models");
    return ids[0];
  }

  void check_model(const std::string& model) override {
    const std::vector<std::string> ids = model_ids();
    if (std::find(ids.begin(), ids.end(), model) != ids.end()) return;
    std::string served;
    for (const std::string& id : ids) served += (served.empty() ? "" : ", ") + id;
    throw Error("--model " + model + ": the server at " + url_ +
                " does not serve it (it serves: " + served + ")");
  }

  std::unique_ptr<PromptTokenizer> tokenizer(const RequestSettings& settings) override {
    return std::make_unique<HttpPromptTokenizer>(*this, settings.model, api_);
  }

  RequestOutput send(const BenchPrompt& prompt, const RequestSettings& settings,
                     const std::string& request_id) override;

  // A JSON request/response exchange (GET when body is null); throws attnres::Error naming the
  // route and the server's message on any failure.
  Json call(const std::string& method, const std::string& path, const Json& body) const {
    httplib::Client client(target_.host, target_.port);
    client.set_connection_timeout(kConnectTimeoutSeconds, 0);
    client.set_read_timeout(kTokenizerTimeoutSeconds, 0);
    httplib::Headers headers = auth_headers();
    const std::string full = target_.path_prefix + path;
    httplib::Result r = method == "GET"
                            ? client.Get(full.c_str(), headers)
                            : client.Post(full.c_str(), headers, body.dump(), "application/json");
    if (!r) {
      throw Error(method + " " + url_ + path + " failed: " + describe(r.error()) +
                  " (is the server running at " + url_ + "?)");
    }
    if (r->status != 200) {
      throw Error(method + " " + path + ": HTTP " + std::to_string(r->status) + ": " +
                  error_message(r->body));
    }
    Json j = Json::parse(r->body, nullptr, false);
    if (j.is_discarded()) throw Error(method + " " + path + ": the reply is not JSON");
    return j;
  }

 private:
  httplib::Headers auth_headers() const {
    httplib::Headers h;
    if (!api_key_.empty()) h.emplace("Authorization", "Bearer " + api_key_);
    return h;
  }

  std::vector<std::string> model_ids() const {
    const Json j = call("GET", "/v1/models", nullptr);
    std::vector<std::string> ids;
    if (j.contains("data") && j["data"].is_array()) {
      for (const Json& m : j["data"]) {
        if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"]);
      }
    }
    return ids;
  }

  Json payload(const BenchPrompt& prompt, const RequestSettings& settings) const {
    Json p;
    p["model"] = settings.model;
    if (api_ == OpenAiApi::kCompletions) {
      p["prompt"] = flat_prompt_text(prompt);
      p["repetition_penalty"] = 1.0;
      p["max_tokens"] = prompt.output_len;
      p["logprobs"] = nullptr;
    } else {
      p["messages"] = chat_messages(prompt.text, prompt.history);
      p["max_completion_tokens"] = prompt.output_len;
    }
    p["stream"] = true;
    p["stream_options"] = {{"include_usage", true}};
    if (settings.ignore_eos) p["ignore_eos"] = true;
    const Json sampling = sampling_fields(settings.sampling);  // named: items() would dangle
    for (const auto& [key, value] : sampling.items()) p[key] = value;
    return p;
  }

  std::string url_;
  HttpTarget target_;
  OpenAiApi api_;
  std::string api_key_;
  std::string endpoint_;
};

RequestOutput HttpBackend::send(const BenchPrompt& prompt, const RequestSettings& settings,
                                const std::string& request_id) {
  RequestOutput out;
  out.prompt_len = prompt.prompt_len;
  httplib::Client client(target_.host, target_.port);
  client.set_connection_timeout(kConnectTimeoutSeconds, 0);
  const time_t timeout = static_cast<time_t>(std::max(1.0, settings.timeout_s));
  client.set_read_timeout(timeout, 0);
  client.set_write_timeout(timeout, 0);

  httplib::Request req;
  req.method = "POST";
  req.path = target_.path_prefix + endpoint_;
  req.headers = auth_headers();
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("x-request-id", request_id);
  req.body = payload(prompt, settings).dump();

  int status = 0;
  std::string error_body;
  bool timed_out = false;
  SseParser parser;
  const double sent = steady_seconds();
  out.start_time = sent;
  OpenAiStreamRecorder recorder(api_, sent, out);
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    const double now = steady_seconds();
    if (status != 200) {
      if (error_body.size() < kMaxErrorBody) error_body.append(data, size);
      return true;
    }
    for (const std::string& event : parser.feed(std::string_view(data, size))) {
      recorder.on_event(event, now);
    }
    if (now - sent > settings.timeout_s) {
      timed_out = true;
      return false;  // httplib closes the connection: the server aborts the request
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool ok = client.send(req, res, error);
  const bool read_timeout =
      error == httplib::Error::Read && steady_seconds() - sent >= settings.timeout_s * 0.99;
  if (timed_out || read_timeout) {
    out.error = "timeout: no complete response within " + std::to_string(settings.timeout_s) + " s";
  } else if (!ok) {
    out.error = "HTTP request failed: " + describe(error);
  } else if (status != 200) {
    out.error = "HTTP " + std::to_string(status) + ": " + error_message(error_body);
  } else {
    recorder.finish();
    return out;
  }
  out.success = false;
  return out;
}

int HttpPromptTokenizer::count_prompt(const std::string& text) {
  Json body;
  body["model"] = model_;
  if (api_ == OpenAiApi::kChatCompletions) {
    body["messages"] = chat_messages(text);
    body["add_generation_prompt"] = true;
    return tokenize_reply_count(backend_.call("POST", "/tokenize", body));
  }
  // Special tokens added, as /v1/completions adds them to the prompt.
  return tokenize_reply_count(backend_.call("POST", "/tokenize", tokenize_request(model_, text, true)));
}

std::vector<int32_t> HttpPromptTokenizer::encode_text(const std::string& text) {
  return tokenize_reply_tokens(backend_.call("POST", "/tokenize", tokenize_request(model_, text, false)));
}

std::string HttpPromptTokenizer::decode(const std::vector<int32_t>& ids) {
  Json body;
  body["model"] = model_;
  body["tokens"] = ids;
  return detokenize_reply_text(backend_.call("POST", "/detokenize", body));
}

}  // namespace

Json tokenize_request(const std::string& model, const std::string& text, bool add_special) {
  Json body;
  body["model"] = model;
  body["prompt"] = text;
  body["add_special_tokens"] = add_special;
  body["content"] = text;
  body["add_special"] = add_special;
  return body;
}

std::vector<int32_t> tokenize_reply_tokens(const Json& reply) {
  if (!reply.contains("tokens") || !reply["tokens"].is_array()) {
    throw Error("POST /tokenize: the reply has no tokens list");
  }
  return reply["tokens"].get<std::vector<int32_t>>();
}

int tokenize_reply_count(const Json& reply) {
  if (reply.contains("count") && reply["count"].is_number_integer()) return reply["count"].get<int>();
  if (reply.contains("tokens") && reply["tokens"].is_array()) {
    return static_cast<int>(reply["tokens"].size());
  }
  throw Error("POST /tokenize: the reply has neither an integer count nor a tokens list");
}

std::string detokenize_reply_text(const Json& reply) {
  for (const char* key : {"prompt", "content"}) {
    if (reply.contains(key) && reply[key].is_string()) return reply[key].get<std::string>();
  }
  throw Error("POST /detokenize: the reply has neither a prompt nor a content string");
}

HttpTarget parse_http_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind("https://", 0) == 0) {
    throw Error("--url " + url + ": https is not supported by this client (use http://)");
  }
  if (url.rfind(scheme, 0) != 0) {
    throw Error("--url " + url + ": expected http://HOST:PORT");
  }
  std::string rest = url.substr(scheme.size());
  HttpTarget t;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    t.path_prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
  }
  while (!t.path_prefix.empty() && t.path_prefix.back() == '/') t.path_prefix.pop_back();
  if (t.path_prefix.size() >= 3 && t.path_prefix.compare(t.path_prefix.size() - 3, 3, "/v1") == 0) {
    t.path_prefix.resize(t.path_prefix.size() - 3);
  }
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(']', colon) == std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    try {
      size_t used = 0;
      t.port = std::stoi(port, &used);
      if (used != port.size() || t.port < 1 || t.port > 65535) throw std::exception();
    } catch (...) {
      throw Error("--url " + url + ": '" + port + "' is not a port number");
    }
    rest = rest.substr(0, colon);
  }
  if (rest.size() > 2 && rest.front() == '[' && rest.back() == ']') {
    rest = rest.substr(1, rest.size() - 2);
  }
  if (rest.empty()) throw Error("--url " + url + ": no host");
  t.host = rest;
  return t;
}

std::unique_ptr<ServingBackend> make_http_backend(const std::string& base_url, OpenAiApi api,
                                                  const std::string& endpoint_override,
                                                  const std::string& api_key) {
  return std::make_unique<HttpBackend>(base_url, api, endpoint_override, api_key);
}

}  // namespace attnres::bench
