// attnres-client's command line into the client library's values: the generate flags into
// the GenerateRequest sent (through the library's to_proto, as the command does), the
// connection flags with their environment fallbacks, and the malformed command lines that
// must be usage errors (attnres::Error) naming the flag.
#include <gtest/gtest.h>

#include <map>

#include "clients/cpp/cli/cli_options.h"
#include "clients/cpp/proto_conversions.h"
#include "engine/core/error.h"

namespace attnres::client::cli {
namespace {

using attnres::cli::Flags;

Flags generate_args(const std::vector<std::string>& args) {
  std::vector<attnres::cli::FlagSpec> specs = generate_flags();
  for (const auto& spec : connection_flags()) specs.push_back(spec);
  return Flags(specs, args);
}

v1::GenerateRequest request_for(const std::vector<std::string>& args) {
  return to_proto(generate_options_from_flags(generate_args(args)));
}

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(GenerateFlags, EverySamplingFlagReachesTheRequest) {
  const v1::GenerateRequest r = request_for({"--prompt",
                                             "Hi there",
                                             "--max-tokens",
                                             "20",
                                             "--temperature",
                                             "0.7",
                                             "--top-p",
                                             "0.8",
                                             "--top-k",
                                             "50",
                                             "--min-p",
                                             "0.1",
                                             "--repetition-penalty",
                                             "1.2",
                                             "--presence-penalty",
                                             "0.5",
                                             "--frequency-penalty",
                                             "-0.25",
                                             "--logit-bias",
                                             "42:-100",
                                             "--logit-bias",
                                             "7:3.5",
                                             "--seed",
                                             "12345678901234567890",
                                             "--stop",
                                             "\n",
                                             "--stop",
                                             "END",
                                             "--stop-token-ids",
                                             "1,2",
                                             "--ignore-eos",
                                             "--min-tokens",
                                             "3",
                                             "--logprobs",
                                             "5",
                                             "--n",
                                             "3",
                                             "--no-skip-special-tokens",
                                             "--request-id",
                                             "my-id",
                                             "--no-stream",
                                             "--no-special-tokens"});
  EXPECT_EQ(r.text(), "Hi there");
  EXPECT_EQ(r.request_id(), "my-id");
  EXPECT_FALSE(r.stream());
  ASSERT_TRUE(r.has_add_special_tokens());
  EXPECT_FALSE(r.add_special_tokens());
  const v1::SamplingParams& p = r.sampling_params();
  EXPECT_EQ(p.max_tokens(), 20);
  EXPECT_FLOAT_EQ(p.temperature(), 0.7f);
  EXPECT_FLOAT_EQ(p.top_p(), 0.8f);
  EXPECT_EQ(p.top_k(), 50);
  EXPECT_FLOAT_EQ(p.min_p(), 0.1f);
  EXPECT_FLOAT_EQ(p.repetition_penalty(), 1.2f);
  EXPECT_FLOAT_EQ(p.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty(), -0.25f);
  ASSERT_EQ(p.logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(p.logit_bias().at(42), -100.0f);
  EXPECT_FLOAT_EQ(p.logit_bias().at(7), 3.5f);
  EXPECT_EQ(p.seed(), 12345678901234567890ull);  // beyond a double's exact integers
  ASSERT_EQ(p.stop_size(), 2);
  EXPECT_EQ(p.stop(0), "\n");
  EXPECT_EQ(p.stop(1), "END");
  ASSERT_EQ(p.stop_token_ids_size(), 2);
  EXPECT_EQ(p.stop_token_ids(0), 1);
  EXPECT_TRUE(p.ignore_eos());
  EXPECT_EQ(p.min_tokens(), 3);
  EXPECT_EQ(p.logprobs(), 5);
  EXPECT_EQ(p.n(), 3);
  ASSERT_TRUE(p.has_skip_special_tokens());
  EXPECT_FALSE(p.skip_special_tokens());
}

TEST(GenerateFlags, UnsetFlagsLeaveTheServersDefaults) {
  const v1::GenerateRequest r = request_for({"--prompt-ids", "1,2,3"});
  ASSERT_EQ(r.input_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_EQ(r.token_ids().ids_size(), 3);
  EXPECT_EQ(r.token_ids().ids(2), 3);
  EXPECT_TRUE(r.stream());
  EXPECT_TRUE(r.request_id().empty());
  EXPECT_FALSE(r.has_add_special_tokens());
  const v1::SamplingParams& p = r.sampling_params();
  EXPECT_FALSE(p.has_max_tokens());
  EXPECT_FALSE(p.has_temperature());
  EXPECT_FALSE(p.has_top_p());
  EXPECT_FALSE(p.has_top_k());
  EXPECT_FALSE(p.has_seed());
  EXPECT_FALSE(p.has_logprobs());
  EXPECT_FALSE(p.has_skip_special_tokens());
  EXPECT_EQ(p.n(), 1);
  EXPECT_FALSE(p.ignore_eos());
}

TEST(GenerateFlags, OutOfRangeValuesAreLeftForTheServer) {
  // The server's INVALID_ARGUMENT names the field; the CLI passes the values through.
  const v1::SamplingParams p =
      request_for({"--prompt", "x", "--temperature", "-1", "--n", "-2", "--max-tokens", "0"})
          .sampling_params();
  EXPECT_FLOAT_EQ(p.temperature(), -1.0f);
  EXPECT_EQ(p.n(), -2);
  ASSERT_TRUE(p.has_max_tokens());
  EXPECT_EQ(p.max_tokens(), 0);
}

void expect_usage_error(const std::vector<std::string>& args, const std::string& fragment) {
  try {
    request_for(args);
    ADD_FAILURE() << "no usage error for '" << fragment << "'";
  } catch (const attnres::Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(GenerateFlags, MalformedCommandLinesAreUsageErrors) {
  expect_usage_error({}, "--prompt");
  expect_usage_error({"--prompt", "a", "--prompt-ids", "1"}, "exactly one");
  expect_usage_error({"--prompt-ids", "1,x"}, "--prompt-ids");
  expect_usage_error({"--prompt-ids", "1", "--no-special-tokens"}, "--no-special-tokens");
  expect_usage_error({"--prompt", "a", "--seed", "-1"}, "--seed");
  expect_usage_error({"--prompt", "a", "--seed", "1.5"}, "--seed");
  expect_usage_error({"--prompt", "a", "--logit-bias", "5"}, "ID:BIAS");
  expect_usage_error({"--prompt", "a", "--logit-bias", "x:1"}, "ID:BIAS");
  expect_usage_error({"--prompt", "a", "--logit-bias", "5:1x"}, "ID:BIAS");
  expect_usage_error({"--prompt", "a", "--temperature", "warm"}, "--temperature");
  expect_usage_error({"--prompt", "a", "--n"}, "--n");
  expect_usage_error({"--prompt", "a", "--top-k", "3.5"}, "--top-k");
  expect_usage_error({"--prompt", "a", "--chat"}, "unknown flag --chat");
}

TEST(ConnectionFlags, FlagsThenEnvironmentThenDefaults) {
  auto options = [](const std::vector<std::string>& args, const EnvLookup& env) {
    return client_options_from_flags(generate_args(args), env);
  };
  ClientOptions defaults = options({}, env_of({}));
  EXPECT_EQ(defaults.target, "127.0.0.1:50051");
  EXPECT_EQ(defaults.api_key, "");
  EXPECT_EQ(defaults.timeout.count(), 0);
  EXPECT_FALSE(defaults.wait_for_ready);

  const EnvLookup env =
      env_of({{"ATTNRES_GRPC_TARGET", "server:9000"}, {"ATTNRES_API_KEY", "from-env"}});
  ClientOptions from_env = options({}, env);
  EXPECT_EQ(from_env.target, "server:9000");
  EXPECT_EQ(from_env.api_key, "from-env");

  ClientOptions from_flags = options(
      {"--target", "[::1]:7000", "--api-key", "from-flag", "--timeout", "2.5", "--wait-for-ready"},
      env);
  EXPECT_EQ(from_flags.target, "[::1]:7000");
  EXPECT_EQ(from_flags.api_key, "from-flag");
  EXPECT_EQ(from_flags.timeout.count(), 2500);
  EXPECT_TRUE(from_flags.wait_for_ready);

  // An empty variable is unset (docker -e ATTNRES_GRPC_TARGET= ...).
  EXPECT_EQ(options({}, env_of({{"ATTNRES_GRPC_TARGET", ""}})).target, "127.0.0.1:50051");
  // A command's own default deadline (health) unless --timeout says otherwise.
  EXPECT_EQ(client_options_from_flags(generate_args({}), env_of({}), 10).timeout.count(), 10000);
  EXPECT_EQ(
      client_options_from_flags(generate_args({"--timeout", "0"}), env_of({}), 10).timeout.count(),
      0);
}

TEST(ConnectionFlags, BadTimeoutsAreUsageErrors) {
  for (const char* bad : {"-1", "nan", "inf", "soon"}) {
    EXPECT_THROW(client_options_from_flags(generate_args({"--timeout", bad}), env_of({})),
                 attnres::Error)
        << bad;
  }
}

}  // namespace
}  // namespace attnres::client::cli
