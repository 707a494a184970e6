// Failures are attnres::Error with useful messages, never crashes: syntax errors name the
// position and what was expected, raise_exception surfaces its text, limits hold.
#include "tests/cpp/engine/jinja/test_util.h"

namespace attnres::testing {
namespace {

using ::testing::HasSubstr;

TEST(ChatTemplateErrors, SyntaxErrorNamesPositionAndExpectation) {
  std::string msg = render_error("line one\n{% if x %}\nno end");
  EXPECT_THAT(msg, HasSubstr("syntax error"));
  EXPECT_THAT(msg, HasSubstr("'endif'"));
  msg = render_error("ok\n  {{ x + }}");
  EXPECT_THAT(msg, HasSubstr("line 2, column 10"));
  EXPECT_THAT(msg, HasSubstr("expected an expression"));
  EXPECT_THAT(render_error("{% frobnicate %}"), HasSubstr("unknown tag 'frobnicate'"));
  EXPECT_THAT(render_error("{{ 'open }}"), HasSubstr("unterminated string"));
  EXPECT_THAT(render_error("{% break %}"), HasSubstr("outside of a loop"));
}

TEST(ChatTemplateErrors, RaiseExceptionSurfacesMessage) {
  std::string msg = render_error("a\n{{ raise_exception('Roles must alternate!') }}");
  EXPECT_THAT(msg, HasSubstr("Roles must alternate!"));
  EXPECT_THAT(msg, HasSubstr("line 2"));
}

TEST(ChatTemplateErrors, RuntimeErrors) {
  EXPECT_THAT(render_error("{{ missing.attr }}"), HasSubstr("'missing' is undefined"));
  EXPECT_THAT(render_error("{{ 1 + 'a' }}"), HasSubstr("unsupported operand"));
  EXPECT_THAT(render_error("{{ 1 // 0 }}"), HasSubstr("division or modulo by zero"));
  EXPECT_THAT(render_error("{{ [1].append(2) }}"), HasSubstr("unsafe"));
  EXPECT_THAT(render_error("{{ {'a': 1}.a.b.c }}"), HasSubstr("has no attribute 'b'"));
  EXPECT_THAT(render_error("{{ x|nosuchfilter }}"), HasSubstr("no filter named"));
}

TEST(ChatTemplateErrors, LimitsAreErrorsNotCrashes) {
  ChatTemplateLimits small;
  small.max_output_bytes = 1000;
  small.max_loop_iterations = 50;
  small.max_call_depth = 10;
  auto run = [&](const std::string& src) -> std::string {
    try {
      ChatTemplate::parse(src).with_limits(small).render(nlohmann::json::object());
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(run("{% for i in range(100) %}{{ 'x' * 50 }}{% endfor %}"), HasSubstr("limit"));
  EXPECT_THAT(run("{% for i in range(10) %}{% for j in range(10) %}{% endfor %}{% endfor %}"),
              HasSubstr("loop iterations"));
  EXPECT_THAT(run("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
              HasSubstr("nested deeper"));
  EXPECT_THAT(run("{{ 'x' * 100000 }}"), HasSubstr("limit"));
  EXPECT_THAT(render_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
              HasSubstr("too deep"));
  EXPECT_THAT(render_error("{{ range(1000000) }}"), HasSubstr("Range too big"));
}

TEST(ChatTemplateErrors, TokenizerConfigErrorsNameTheFile) {
  try {
    TokenizerConfig::load("/nonexistent/tokenizer_config.json");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("/nonexistent/tokenizer_config.json"));
  }
  EXPECT_THROW(TokenizerConfig::from_json(nlohmann::json::parse(R"({"bos_token": 5})"), "cfg"),
               Error);
}

}  // namespace
}  // namespace attnres::testing
