// The client library's proto conversions and the assembly of Generate streams: every
// GenerateOptions field lands in its GenerateRequest field (unset optionals stay unset, so
// the server's defaults apply), and streams of chunks and completions (interleaved choices,
// streamed or whole logprobs, protocol violations) assemble into the right GenerateResult.
#include <gtest/gtest.h>

#include "clients/cpp/client_error.h"
#include "clients/cpp/proto_conversions.h"

namespace attnres::client {
namespace {

TEST(ToProto, CopiesEveryField) {
  GenerateOptions options;
  options.prompt = std::string("Hello");
  options.request_id = "req-1";
  options.add_special_tokens = false;
  options.stream = false;
  options.detokenize = false;
  SamplingOptions& s = options.sampling;
  s.temperature = 0.5f;
  s.top_p = 0.9f;
  s.top_k = 40;
  s.min_p = 0.05f;
  s.repetition_penalty = 1.1f;
  s.presence_penalty = 0.25f;
  s.frequency_penalty = -0.5f;
  s.seed = 18446744073709551615ull;  // the whole uint64 range survives
  s.max_tokens = 33;
  s.min_tokens = 2;
  s.stop = {"\n\n", "END"};
  s.stop_token_ids = {7, 9};
  s.ignore_eos = true;
  s.logprobs = 3;
  s.skip_special_tokens = false;
  s.n = 4;
  s.logit_bias = {{11, -100.0f}, {12, 2.5f}};

  const v1::GenerateRequest r = to_proto(options);
  EXPECT_EQ(r.request_id(), "req-1");
  ASSERT_EQ(r.input_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(r.text(), "Hello");
  ASSERT_TRUE(r.has_add_special_tokens());
  EXPECT_FALSE(r.add_special_tokens());
  EXPECT_FALSE(r.stream());
  ASSERT_TRUE(r.has_detokenize());
  EXPECT_FALSE(r.detokenize());
  const v1::SamplingParams& p = r.sampling_params();
  EXPECT_FLOAT_EQ(p.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(p.top_p(), 0.9f);
  EXPECT_EQ(p.top_k(), 40);
  EXPECT_FLOAT_EQ(p.min_p(), 0.05f);
  EXPECT_FLOAT_EQ(p.repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(p.presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(p.frequency_penalty(), -0.5f);
  EXPECT_EQ(p.seed(), 18446744073709551615ull);
  EXPECT_EQ(p.max_tokens(), 33);
  EXPECT_EQ(p.min_tokens(), 2);
  ASSERT_EQ(p.stop_size(), 2);
  EXPECT_EQ(p.stop(0), "\n\n");
  EXPECT_EQ(p.stop(1), "END");
  ASSERT_EQ(p.stop_token_ids_size(), 2);
  EXPECT_EQ(p.stop_token_ids(1), 9);
  EXPECT_TRUE(p.ignore_eos());
  EXPECT_EQ(p.logprobs(), 3);
  ASSERT_TRUE(p.has_skip_special_tokens());
  EXPECT_FALSE(p.skip_special_tokens());
  EXPECT_EQ(p.n(), 4);
  ASSERT_EQ(p.logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(p.logit_bias().at(11), -100.0f);
  EXPECT_FLOAT_EQ(p.logit_bias().at(12), 2.5f);
}

TEST(ToProto, UnsetOptionalsStayUnsetForTheServersDefaults) {
  GenerateOptions options;
  options.prompt = std::vector<int32_t>{5, 6, 7};
  const v1::GenerateRequest r = to_proto(options);
  ASSERT_EQ(r.input_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_EQ(std::vector<int32_t>(r.token_ids().ids().begin(), r.token_ids().ids().end()),
            (std::vector<int32_t>{5, 6, 7}));
  EXPECT_FALSE(r.has_add_special_tokens());
  EXPECT_TRUE(r.stream());
  const v1::SamplingParams& p = r.sampling_params();
  EXPECT_FALSE(p.has_temperature());
  EXPECT_FALSE(p.has_top_p());
  EXPECT_FALSE(p.has_top_k());
  EXPECT_FALSE(p.has_min_p());
  EXPECT_FALSE(p.has_repetition_penalty());
  EXPECT_FALSE(p.has_seed());
  EXPECT_FALSE(p.has_max_tokens());
  EXPECT_FALSE(p.has_logprobs());
  EXPECT_FALSE(p.has_skip_special_tokens());
  EXPECT_EQ(p.n(), 1);
}

TEST(ToProto, AnEmptyTextIsStillATextPrompt) {
  // The server names the field ("text"); the client must not turn it into "no input".
  GenerateOptions options;
  options.prompt = std::string();
  EXPECT_EQ(to_proto(options).input_case(), v1::GenerateRequest::kText);
}

// --- stream assembly ---------------------------------------------------------------------------

v1::GenerateResponse chunk(uint32_t index, std::vector<int32_t> ids, const std::string& text,
                           const std::string& request_id = "r") {
  v1::GenerateResponse response;
  response.set_request_id(request_id);
  auto* c = response.mutable_chunk();
  c->set_index(index);
  for (int32_t id : ids) {
    c->add_token_ids(id);
    auto* lp = c->add_logprobs();
    lp->set_token_id(id);
    lp->set_logprob(-0.5f * static_cast<float>(id));
    lp->set_rank(1);
    auto* top = lp->add_top_logprobs();
    top->set_token_id(id);
    top->set_logprob(-0.5f * static_cast<float>(id));
  }
  c->set_text(text);
  return response;
}

v1::GenerateResponse complete(uint32_t index, std::vector<int32_t> ids, const std::string& text,
                              const std::string& reason, uint32_t prompt_tokens) {
  v1::GenerateResponse response;
  response.set_request_id("r");
  auto* c = response.mutable_complete();
  c->set_index(index);
  c->set_finish_reason(reason);
  for (int32_t id : ids) c->add_output_ids(id);
  c->set_text(text);
  c->mutable_usage()->set_prompt_tokens(prompt_tokens);
  c->mutable_usage()->set_completion_tokens(static_cast<uint32_t>(ids.size()));
  c->mutable_usage()->set_total_tokens(prompt_tokens + static_cast<uint32_t>(ids.size()));
  return response;
}

TEST(ResultAssembler, InterleavedChoicesOfAStream) {
  ResultAssembler assembler(2);
  auto first = assembler.add(chunk(1, {4}, "d"));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->request_id, "r");
  EXPECT_EQ(first->index, 1u);
  EXPECT_EQ(first->token_ids, std::vector<int32_t>{4});
  EXPECT_EQ(first->text, "d");
  ASSERT_EQ(first->logprobs.size(), 1u);
  EXPECT_FLOAT_EQ(first->logprobs[0].logprob, -2.0f);
  EXPECT_TRUE(assembler.add(chunk(0, {1, 2}, "ab")));
  EXPECT_TRUE(assembler.add(chunk(0, {3}, "")));  // text held back (a possible stop string)
  v1::GenerateResponse first_done = complete(0, {1, 2, 3}, "abc", "stop", 5);
  first_done.mutable_complete()->mutable_usage()->set_cached_tokens(4);
  EXPECT_FALSE(assembler.add(first_done));
  EXPECT_FALSE(assembler.complete());
  EXPECT_TRUE(assembler.add(chunk(1, {6}, "e")));
  v1::GenerateResponse last = complete(1, {4, 6}, "de", "stop", 5);
  last.mutable_complete()->set_stop_string("\n");
  EXPECT_FALSE(assembler.add(last));
  EXPECT_TRUE(assembler.complete());

  const GenerateResult result = assembler.result();
  EXPECT_EQ(result.request_id, "r");
  ASSERT_EQ(result.choices.size(), 2u);
  const Choice& c0 = result.choices[0];
  EXPECT_EQ(c0.index, 0u);
  EXPECT_EQ(c0.text, "abc");
  EXPECT_EQ(c0.token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(c0.finish_reason, "stop");
  EXPECT_FALSE(c0.stop_string);
  // The streamed logprobs of the choice, in order (the completion of a stream has none).
  ASSERT_EQ(c0.logprobs.size(), 3u);
  EXPECT_EQ(c0.logprobs[2].token_id, 3);
  ASSERT_EQ(c0.logprobs[2].top.size(), 1u);
  EXPECT_EQ(c0.logprobs[2].top[0].first, 3);
  const Choice& c1 = result.choices[1];
  EXPECT_EQ(c1.finish_reason, "stop");
  EXPECT_EQ(c1.stop_string, "\n");
  EXPECT_FALSE(c1.stop_token_id);
  ASSERT_EQ(c1.logprobs.size(), 2u);
  EXPECT_EQ(c1.logprobs[0].token_id, 4);
  EXPECT_EQ(c1.logprobs[1].token_id, 6);
  // The request's usage counts the prompt once and every choice's tokens.
  EXPECT_EQ(result.usage.prompt_tokens, 5u);
  EXPECT_EQ(result.usage.completion_tokens, 5u);
  EXPECT_EQ(result.usage.total_tokens, 10u);
  // The prefix-cache hit is choice 0's, as OpenAI usage reports it.
  EXPECT_EQ(c0.usage.cached_tokens, 4u);
  EXPECT_EQ(result.usage.cached_tokens, 4u);
}

TEST(ResultAssembler, NotStreamedTakesEverythingFromTheCompletion) {
  ResultAssembler assembler(1);
  v1::GenerateResponse whole = complete(0, {8, 9}, "xy", "stop", 3);
  whole.mutable_complete()->set_stop_token_id(9);
  auto* lp = whole.mutable_complete()->add_logprobs();
  lp->set_token_id(8);
  lp->set_logprob(-1.25f);
  lp->set_rank(2);
  whole.mutable_complete()->set_error("engine failed");
  EXPECT_FALSE(assembler.add(whole));
  const GenerateResult result = assembler.result();
  ASSERT_EQ(result.choices.size(), 1u);
  const Choice& c = result.choices[0];
  EXPECT_EQ(c.stop_token_id, 9);
  EXPECT_FALSE(c.stop_string);
  ASSERT_EQ(c.logprobs.size(), 1u);
  EXPECT_FLOAT_EQ(c.logprobs[0].logprob, -1.25f);
  EXPECT_EQ(c.logprobs[0].rank, 2);
  EXPECT_EQ(c.error, "engine failed");
  EXPECT_EQ(result.usage.total_tokens, 5u);
}

TEST(ResultAssembler, NZeroMeansOneChoice) {
  ResultAssembler assembler(0);
  EXPECT_FALSE(assembler.complete());
  assembler.add(complete(0, {1}, "a", "length", 1));
  EXPECT_TRUE(assembler.complete());
}

void expect_protocol_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    FAIL() << "expected a protocol error mentioning '" << fragment << "'";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::INTERNAL);
    EXPECT_NE(e.message().find(fragment), std::string::npos) << e.message();
  }
}

TEST(ResultAssembler, ProtocolViolationsAreErrors) {
  expect_protocol_error(
      [] {
        ResultAssembler a(1);
        a.add(complete(0, {1}, "a", "length", 1));
        a.add(chunk(0, {2}, "b"));
      },
      "after its completion");
  expect_protocol_error(
      [] {
        ResultAssembler a(1);
        a.add(complete(0, {1}, "a", "length", 1));
        a.add(complete(0, {1}, "a", "length", 1));
      },
      "completed twice");
  expect_protocol_error(
      [] {
        ResultAssembler a(2);
        a.add(chunk(2, {1}, "a"));
      },
      "only 2 were asked for");
  expect_protocol_error(
      [] {
        ResultAssembler a(2);
        a.add(complete(0, {1}, "a", "length", 1));
        a.result();
      },
      "before choice 1 completed");
  expect_protocol_error(
      [] {
        ResultAssembler a(1);
        a.add(v1::GenerateResponse());
      },
      "neither");
}

TEST(FromProto, ModelInfo) {
  v1::GetModelInfoResponse info;
  info.set_served_model_name("m");
  info.set_model_source("/models/m");
  info.set_max_model_len(4096);
  info.set_vocab_size(1000);
  info.set_architecture("qwen3");
  info.set_model_type("qwen3_attnres");
  info.set_attnres_mode("block");
  info.set_attnres_num_blocks(4);
  info.set_num_layers(8);
  info.add_eos_token_ids(2);
  info.add_eos_token_ids(3);
  ModelInfo out = from_proto(info);
  EXPECT_EQ(out.served_model_name, "m");
  EXPECT_EQ(out.model_source, "/models/m");
  EXPECT_EQ(out.max_model_len, 4096u);
  EXPECT_EQ(out.vocab_size, 1000u);
  EXPECT_EQ(out.architecture, "qwen3");
  EXPECT_EQ(out.model_type, "qwen3_attnres");
  EXPECT_EQ(out.attnres_mode, "block");
  EXPECT_EQ(out.attnres_num_blocks, 4u);
  EXPECT_EQ(out.num_layers, 8u);
  EXPECT_EQ(out.eos_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_FALSE(out.bos_token_id);  // absent is not token 0
  info.set_bos_token_id(0);
  EXPECT_EQ(from_proto(info).bos_token_id, 0);
}

}  // namespace
}  // namespace attnres::client
