#include "clients/bench/grpc_backend.h"

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "clients/bench/stream_recorder.h"
#include "clients/cpp/client.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

using attnres::client::Client;
using attnres::client::ClientError;
using attnres::client::ClientOptions;

constexpr std::chrono::seconds kConnectTimeout{10};
constexpr std::chrono::seconds kTokenizerTimeout{120};

std::string status_text(const ClientError& e) {
  return "gRPC status " + std::to_string(static_cast<int>(e.code())) + ": " + e.message();
}

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

class GrpcBackend;

class GrpcPromptTokenizer : public PromptTokenizer {
 public:
  explicit GrpcPromptTokenizer(GrpcBackend& backend) : backend_(backend) {}
  int count_prompt(const std::string& text) override;
  std::vector<int32_t> encode_text(const std::string& text) override;
  std::string decode(const std::vector<int32_t>& ids) override;

 private:
  GrpcBackend& backend_;
};

// One channel; a client per deadline (model info, tokenizer calls, generation), as the
// library sets one deadline per Client.
class GrpcBackend : public ServingBackend {
 public:
  GrpcBackend(std::string target, const std::string& api_key) : target_(std::move(target)) {
    if (target_.rfind("grpc://", 0) == 0) target_ = target_.substr(7);
    if (target_.rfind("http://", 0) == 0 || target_.rfind("https://", 0) == 0) {
      throw Error("--url " + target_ + ": the grpc backend takes HOST:PORT (e.g. 127.0.0.1:50051)");
    }
    if (target_.empty()) throw Error("--url: empty gRPC target");
    channel_ = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
    api_key_ = api_key;
    info_client_ = make_client(kConnectTimeout);
    tokenizer_client_ = make_client(kTokenizerTimeout);
  }

  std::string first_model() override {
    try {
      return info_client_->model_info().served_model_name;
    } catch (const ClientError& e) {
      throw Error("GetModelInfo at " + target_ + " failed: " + status_text(e) +
                  " (is the gRPC server running at " + target_ + "?)");
    }
  }

  void check_model(const std::string& model) override {
    const std::string served = first_model();
    if (model != served) {
      throw Error("--model " + model + ": the gRPC server at " + target_ +
                  " does not serve it (it serves: " + served + ")");
    }
  }

  std::unique_ptr<PromptTokenizer> tokenizer(const RequestSettings&) override {
    return std::make_unique<GrpcPromptTokenizer>(*this);
  }

  RequestOutput send(const BenchPrompt& prompt, const RequestSettings& settings,
                     const std::string& request_id) override;

  attnres::client::TokenizeResult tokenize(const std::string& text, bool add_special_tokens) {
    try {
      return tokenizer_client_->tokenize(text, add_special_tokens);
    } catch (const ClientError& e) {
      throw Error("Tokenize at " + target_ + ": " + status_text(e));
    }
  }

  std::string detokenize(const std::vector<int32_t>& ids) {
    try {
      return tokenizer_client_->detokenize(ids);
    } catch (const ClientError& e) {
      throw Error("Detokenize at " + target_ + ": " + status_text(e));
    }
  }

 private:
  std::unique_ptr<Client> make_client(std::chrono::milliseconds timeout) const {
    ClientOptions options;
    options.target = target_;
    options.api_key = api_key_;
    options.timeout = timeout;
    return std::make_unique<Client>(channel_, options);
  }

  // The generation client: its deadline is the request timeout (the same for every request).
  Client& generate_client(double timeout_s) {
    std::lock_guard lock(generate_mutex_);
    if (!generate_client_) generate_client_ = make_client(milliseconds(timeout_s));
    return *generate_client_;
  }

  std::string target_;
  std::string api_key_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Client> info_client_, tokenizer_client_;
  std::mutex generate_mutex_;
  std::unique_ptr<Client> generate_client_;
};

RequestOutput GrpcBackend::send(const BenchPrompt& prompt, const RequestSettings& settings,
                                const std::string& request_id) {
  RequestOutput out;
  out.prompt_len = prompt.prompt_len;
  attnres::client::GenerateOptions options;
  options.prompt = flat_prompt_text(prompt);
  options.request_id = request_id;
  options.stream = true;
  attnres::client::SamplingOptions& p = options.sampling;
  p.max_tokens = prompt.output_len;
  p.ignore_eos = settings.ignore_eos;
  const SamplingOverrides& s = settings.sampling;
  if (s.temperature) p.temperature = static_cast<float>(*s.temperature);
  if (s.top_p) p.top_p = static_cast<float>(*s.top_p);
  if (s.top_k) p.top_k = *s.top_k;
  if (s.min_p) p.min_p = static_cast<float>(*s.min_p);
  if (s.repetition_penalty) p.repetition_penalty = static_cast<float>(*s.repetition_penalty);
  if (s.presence_penalty) p.presence_penalty = static_cast<float>(*s.presence_penalty);
  if (s.frequency_penalty) p.frequency_penalty = static_cast<float>(*s.frequency_penalty);

  Client& client = generate_client(settings.timeout_s);
  const double sent = steady_seconds();
  out.start_time = sent;
  ChunkTimer timer(sent);
  try {
    // Each GenerateStreamChunk is a chunk (vLLM's rule: a message carrying the choice).
    const attnres::client::GenerateResult result =
        client.generate(options, [&](const attnres::client::StreamChunk& chunk) {
          timer.on_chunk(steady_seconds(), out);
          out.generated_text += chunk.text;
        });
    timer.finish(out);
    const attnres::client::Choice& choice = result.choices.at(0);
    out.output_tokens = static_cast<int>(choice.usage.completion_tokens);
    out.prompt_len = static_cast<int>(choice.usage.prompt_tokens);
    out.cached_tokens = static_cast<int>(choice.usage.cached_tokens);
    if (!choice.error.empty()) {
      out.error = "server error: " + choice.error;
    } else if (!timer.any()) {
      out.error = "never received a chunk, so no TTFT";
    }
  } catch (const ClientError& e) {
    // The library also turns a stream that ends without GenerateComplete into an error.
    timer.finish(out);
    out.error =
        e.code() == grpc::StatusCode::DEADLINE_EXCEEDED
            ? "timeout: no complete response within " + std::to_string(settings.timeout_s) + " s"
            : status_text(e);
  }
  out.success = out.error.empty();
  return out;
}

int GrpcPromptTokenizer::count_prompt(const std::string& text) {
  return static_cast<int>(backend_.tokenize(text, true).token_ids.size());
}

std::vector<int32_t> GrpcPromptTokenizer::encode_text(const std::string& text) {
  return backend_.tokenize(text, false).token_ids;
}

std::string GrpcPromptTokenizer::decode(const std::vector<int32_t>& ids) {
  return backend_.detokenize(ids);
}

}  // namespace

std::unique_ptr<ServingBackend> make_grpc_backend(const std::string& target,
                                                  const std::string& api_key) {
  return std::make_unique<GrpcBackend>(target, api_key);
}

}  // namespace attnres::bench
