// server/common/auth.h: one rule for HTTP and gRPC. The Bearer scheme is case-insensitive
// (RFC 7235: gRPC used to compare it exactly), the key exact.
#include "server/common/auth.h"

#include <gtest/gtest.h>

#include "engine/model/loaded_model.h"
#include "engine_test_util.h"

namespace attnres::testing {
namespace {

using server::AuthResult;

TEST(Auth, BearerSchemeIsCaseInsensitiveAndTheKeyIsExact) {
  LoadedModel model = load_builtin_model("demo");
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  server::Metrics metrics("test");
  server::ServeOptions options;
  server::ServerState open_state(model, engine, metrics, options);
  EXPECT_EQ(server::authenticate(open_state, std::nullopt), AuthResult::Ok);

  options.api_keys = {"sk-one", "sk-two"};
  server::ServerState state(model, engine, metrics, options);
  EXPECT_EQ(server::authenticate(state, "Bearer sk-one"), AuthResult::Ok);
  EXPECT_EQ(server::authenticate(state, "bearer sk-two"), AuthResult::Ok);
  EXPECT_EQ(server::authenticate(state, "BEARER sk-two"), AuthResult::Ok);
  EXPECT_EQ(server::authenticate(state, "Bearer SK-ONE"), AuthResult::Invalid);
  EXPECT_EQ(server::authenticate(state, "Bearer sk-three"), AuthResult::Invalid);
  EXPECT_EQ(server::authenticate(state, "Basic sk-one"), AuthResult::Missing);
  EXPECT_EQ(server::authenticate(state, "sk-one"), AuthResult::Missing);
  EXPECT_EQ(server::authenticate(state, std::nullopt), AuthResult::Missing);
}

}  // namespace
}  // namespace attnres::testing
