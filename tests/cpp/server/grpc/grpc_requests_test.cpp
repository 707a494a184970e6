// proto -> EngineRequest: defaults, overrides, and errors that name the proto field.
#include "server/grpc/grpc_requests.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/core/error.h"

namespace attnres::server {
namespace {

const Vocabulary kVocab = Vocabulary::all_rows(50257);

std::shared_ptr<const Tokenizer> gpt2() {
  static const auto tokenizer =
      Tokenizer::load(std::string(ATTNRES_SOURCE_DIR) + "/engine/model/assets/gpt2/tokenizer.json");
  return tokenizer;
}

std::string error_of(const v1::GenerateRequest& request) {
  try {
    to_engine_request(request, SamplingParams{}, *gpt2(), kVocab);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GrpcRequests, UnsetFieldsKeepTheModelDefaults) {
  SamplingParams defaults;
  defaults.temperature = 0.6f;
  defaults.top_p = 0.9f;
  defaults.top_k = 20;
  const SamplingParams p = to_sampling_params(v1::SamplingParams{}, defaults);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_EQ(p.logprobs, -1);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_TRUE(p.skip_special_tokens);
}

TEST(GrpcRequests, SetFieldsOverrideTheDefaults) {
  v1::SamplingParams proto;
  proto.set_temperature(0.0f);  // explicitly zero: greedy, not "unset"
  proto.set_seed(7);
  proto.set_max_tokens(5);
  proto.set_logprobs(0);
  proto.add_stop("\n");
  proto.add_stop_token_ids(13);
  (*proto.mutable_logit_bias())[11] = 2.0f;
  (*proto.mutable_logit_bias())[3] = -1.0f;
  proto.set_skip_special_tokens(false);
  SamplingParams defaults;
  defaults.temperature = 0.6f;
  const SamplingParams p = to_sampling_params(proto, defaults);
  EXPECT_TRUE(p.greedy());
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.max_tokens, 5);
  EXPECT_EQ(p.logprobs, 0);
  EXPECT_EQ(p.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{13});
  const std::vector<std::pair<int32_t, float>> bias = {{3, -1.0f}, {11, 2.0f}};  // sorted
  EXPECT_EQ(p.logit_bias, bias);
  EXPECT_FALSE(p.skip_special_tokens);
}

TEST(GrpcRequests, NegativeLogprobsAreRejectedNotReadAsNone) {
  v1::SamplingParams proto;
  proto.set_logprobs(-1);
  EXPECT_THROW(to_sampling_params(proto, SamplingParams{}), Error);
}

TEST(GrpcRequests, TextIsTokenizedAndTokenIdsAreUsedAsGiven) {
  v1::GenerateRequest request;
  request.set_text("Hello world");
  request.mutable_sampling_params()->set_n(0);
  GrpcGenerateRequest parsed = to_engine_request(request, SamplingParams{}, *gpt2(), kVocab);
  EXPECT_EQ(parsed.engine.prompt_ids, (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(parsed.engine.n, 1);  // 0 (unset) means 1
  EXPECT_TRUE(parsed.detokenize);
  EXPECT_FALSE(parsed.stream);

  request.mutable_token_ids()->add_ids(42);
  request.set_detokenize(false);
  request.set_request_id("mine");
  parsed = to_engine_request(request, SamplingParams{}, *gpt2(), kVocab);
  EXPECT_EQ(parsed.engine.prompt_ids, std::vector<int32_t>{42});
  EXPECT_EQ(parsed.engine.request_id, "mine");
  EXPECT_FALSE(parsed.detokenize);
}

TEST(GrpcRequests, InputErrorsNameTheField) {
  v1::GenerateRequest request;
  EXPECT_NE(error_of(request).find("input:"), std::string::npos);
  request.set_text("");
  EXPECT_NE(error_of(request).find("text:"), std::string::npos);
  request.mutable_token_ids();
  EXPECT_NE(error_of(request).find("token_ids:"), std::string::npos);
  request.mutable_token_ids()->add_ids(1);
  request.mutable_token_ids()->add_ids(50257);
  EXPECT_EQ(error_of(request), "field token_ids[1]: got 50257, expected a token id in [0, 50257)");
}

TEST(GrpcRequests, DepthAttentionOptions) {
  v1::GenerateRequest request;
  request.mutable_token_ids()->add_ids(5);
  GrpcGenerateRequest plain = to_engine_request(request, SamplingParams{}, *gpt2(), kVocab);
  EXPECT_FALSE(plain.engine.params.wants_depth_attention());
  request.mutable_depth_attention();  // present, empty: the prompt mean only
  GrpcGenerateRequest mean = to_engine_request(request, SamplingParams{}, *gpt2(), kVocab);
  EXPECT_TRUE(mean.engine.params.depth_attention);
  EXPECT_FALSE(mean.engine.params.depth_attention_per_token);
  request.mutable_depth_attention()->set_per_token(true);
  GrpcGenerateRequest per_token = to_engine_request(request, SamplingParams{}, *gpt2(), kVocab);
  EXPECT_TRUE(per_token.engine.params.depth_attention_per_token);
}

}  // namespace
}  // namespace attnres::server
