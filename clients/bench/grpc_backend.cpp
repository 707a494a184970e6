#include "clients/bench/grpc_backend.h"

#include <grpcpp/grpcpp.h>

#include "attnres/v1/generate.grpc.pb.h"
#include "clients/bench/stream_recorder.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

namespace pb = attnres::v1;

constexpr double kConnectTimeoutSeconds = 10;
constexpr double kTokenizerTimeoutSeconds = 120;

std::chrono::system_clock::time_point deadline_after(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

std::string status_text(const grpc::Status& s) {
  return "gRPC status " + std::to_string(static_cast<int>(s.error_code())) + ": " +
         s.error_message();
}

class GrpcBackend;

class GrpcPromptTokenizer : public PromptTokenizer {
 public:
  explicit GrpcPromptTokenizer(const GrpcBackend& backend) : backend_(backend) {}
  int count_prompt(const std::string& text) override;
  std::vector<int32_t> encode_text(const std::string& text) override;
  std::string decode(const std::vector<int32_t>& ids) override;

 private:
  const GrpcBackend& backend_;
};

class GrpcBackend : public ServingBackend {
 public:
  GrpcBackend(std::string target, std::string api_key)
      : target_(std::move(target)), api_key_(std::move(api_key)) {
    if (target_.rfind("grpc://", 0) == 0) target_ = target_.substr(7);
    if (target_.rfind("http://", 0) == 0 || target_.rfind("https://", 0) == 0) {
      throw Error("--url " + target_ + ": the grpc backend takes HOST:PORT (e.g. 127.0.0.1:50051)");
    }
    if (target_.empty()) throw Error("--url: empty gRPC target");
    channel_ = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
    stub_ = pb::Generate::NewStub(channel_);
  }

  std::string first_model() override { return model_info().served_model_name(); }

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

  void prepare(grpc::ClientContext& context, double timeout_s) const {
    context.set_deadline(deadline_after(timeout_s));
    if (!api_key_.empty()) context.AddMetadata("authorization", "Bearer " + api_key_);
  }

  pb::TokenizeResponse tokenize(const std::string& text, bool add_special_tokens) const {
    grpc::ClientContext context;
    prepare(context, kTokenizerTimeoutSeconds);
    pb::TokenizeRequest req;
    req.set_text(text);
    req.set_add_special_tokens(add_special_tokens);
    pb::TokenizeResponse reply;
    const grpc::Status s = stub_->Tokenize(&context, req, &reply);
    if (!s.ok()) throw Error("Tokenize at " + target_ + ": " + status_text(s));
    return reply;
  }

  std::string detokenize(const std::vector<int32_t>& ids) const {
    grpc::ClientContext context;
    prepare(context, kTokenizerTimeoutSeconds);
    pb::DetokenizeRequest req;
    for (int32_t id : ids) req.add_token_ids(id);
    pb::DetokenizeResponse reply;
    const grpc::Status s = stub_->Detokenize(&context, req, &reply);
    if (!s.ok()) throw Error("Detokenize at " + target_ + ": " + status_text(s));
    return reply.text();
  }

 private:
  pb::GetModelInfoResponse model_info() const {
    grpc::ClientContext context;
    prepare(context, kConnectTimeoutSeconds);
    pb::GetModelInfoResponse reply;
    const grpc::Status s = stub_->GetModelInfo(&context, pb::GetModelInfoRequest(), &reply);
    if (!s.ok()) {
      throw Error("GetModelInfo at " + target_ + " failed: " + status_text(s) +
                  " (is the gRPC server running at " + target_ + "?)");
    }
    return reply;
  }

  std::string target_;
  std::string api_key_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Generate::Stub> stub_;
};

RequestOutput GrpcBackend::send(const BenchPrompt& prompt, const RequestSettings& settings,
                                const std::string& request_id) {
  RequestOutput out;
  out.prompt_len = prompt.prompt_len;
  pb::GenerateRequest req;
  req.set_request_id(request_id);
  req.set_text(prompt.text);
  req.set_stream(true);
  pb::SamplingParams* p = req.mutable_sampling_params();
  p->set_max_tokens(prompt.output_len);
  p->set_ignore_eos(settings.ignore_eos);
  const SamplingOverrides& s = settings.sampling;
  if (s.temperature) p->set_temperature(static_cast<float>(*s.temperature));
  if (s.top_p) p->set_top_p(static_cast<float>(*s.top_p));
  if (s.top_k) p->set_top_k(*s.top_k);
  if (s.min_p) p->set_min_p(static_cast<float>(*s.min_p));
  if (s.repetition_penalty) p->set_repetition_penalty(static_cast<float>(*s.repetition_penalty));
  if (s.presence_penalty) p->set_presence_penalty(static_cast<float>(*s.presence_penalty));
  if (s.frequency_penalty) p->set_frequency_penalty(static_cast<float>(*s.frequency_penalty));

  grpc::ClientContext context;
  prepare(context, settings.timeout_s);
  const double sent = steady_seconds();
  out.start_time = sent;
  ChunkTimer timer(sent);
  bool complete = false;
  std::string error;
  std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader = stub_->Generate(&context, req);
  pb::GenerateResponse response;
  while (reader->Read(&response)) {
    const double now = steady_seconds();
    if (response.has_chunk()) {
      timer.on_chunk(now, out);
      out.generated_text += response.chunk().text();
    } else if (response.has_complete()) {
      const pb::GenerateComplete& c = response.complete();
      complete = true;
      out.output_tokens = static_cast<int>(c.usage().completion_tokens());
      out.prompt_len = static_cast<int>(c.usage().prompt_tokens());
      if (!c.error().empty()) error = "server error: " + c.error();
    }
  }
  const grpc::Status status = reader->Finish();
  timer.finish(out);
  if (!status.ok()) {
    out.error =
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
            ? "timeout: no complete response within " + std::to_string(settings.timeout_s) + " s"
            : status_text(status);
  } else if (!error.empty()) {
    out.error = error;
  } else if (!timer.any()) {
    out.error = "never received a chunk, so no TTFT";
  } else if (!complete) {
    out.error = "the stream ended without GenerateComplete";
  }
  out.success = out.error.empty();
  return out;
}

int GrpcPromptTokenizer::count_prompt(const std::string& text) {
  return static_cast<int>(backend_.tokenize(text, true).count());
}

std::vector<int32_t> GrpcPromptTokenizer::encode_text(const std::string& text) {
  const pb::TokenizeResponse r = backend_.tokenize(text, false);
  return {r.token_ids().begin(), r.token_ids().end()};
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
