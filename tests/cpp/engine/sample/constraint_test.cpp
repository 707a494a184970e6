// Structured output's pieces: the token bitmask against a per-id reference, and the compiler
// and matcher over a toy vocabulary (toy_constraint_vocabulary.h) whose allowed-token sets can
// be written down by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/sample/constraint_matcher.h"
#include "engine/sample/json_schema_support.h"
#include "engine/sample/token_bitmask.h"
#include "toy_constraint_vocabulary.h"

namespace attnres {
namespace {

using testing::kToyEos;
using testing::kToyRows;
using testing::toy_constraint_vocabulary;
using testing::toy_id;
using testing::toy_tokens;

TEST(TokenBitmask, MasksExactlyTheClearBitsOnRandomRows) {
  std::mt19937 rng(7);
  for (const int rows : {1, 31, 32, 33, 64, 100, 1000}) {
    std::vector<float> logits(static_cast<size_t>(rows));
    std::normal_distribution<float> normal;
    for (float& x : logits) x = normal(rng);
    std::vector<int32_t> mask(static_cast<size_t>(token_bitmask_words(rows)));
    for (int32_t& w : mask) w = static_cast<int32_t>(rng());
    if (rows > 40) mask[1] = -1;  // an all-allowed word (the fast path)
    std::vector<float> masked = logits;
    apply_token_bitmask(masked, mask);
    bool any = false;
    for (int i = 0; i < rows; ++i) {
      const bool allowed = (static_cast<uint32_t>(mask[i / 32]) >> (i % 32)) & 1u;
      any = any || allowed;
      if (allowed) {
        EXPECT_EQ(masked[i], logits[i]) << "rows " << rows << " id " << i;
      } else {
        EXPECT_TRUE(std::isinf(masked[i]) && masked[i] < 0) << "rows " << rows << " id " << i;
      }
    }
    EXPECT_EQ(any_token_allowed(mask, rows), any);
  }
}

TEST(TokenBitmask, AnyTokenAllowedIgnoresBitsPastTheRows) {
  std::vector<int32_t> mask = {0, static_cast<int32_t>(0xffff0000u)};
  EXPECT_FALSE(any_token_allowed(mask, 48));
  EXPECT_TRUE(any_token_allowed(mask, 49));
}

OutputConstraint constraint(ConstraintKind kind, std::string spec) {
  OutputConstraint c;
  c.kind = kind;
  c.spec = std::move(spec);
  c.field = "test_field";
  return c;
}

std::set<int32_t> allowed_ids(const ConstraintMatcher& m) {
  std::set<int32_t> ids;
  for (int32_t id = 0; id < kToyRows; ++id) {
    if (token_allowed(m.mask(), id)) ids.insert(id);
  }
  return ids;
}

std::set<int32_t> ids_of(std::initializer_list<const char*> texts) {
  std::set<int32_t> ids;
  for (const char* t : texts) ids.insert(toy_id(t));
  return ids;
}

class ConstraintTest : public ::testing::Test {
 protected:
  ConstraintCompiler compiler{toy_constraint_vocabulary()};
};

TEST_F(ConstraintTest, RegexAllowsOnlyItsPrefixesAndEosAtTheEnd) {
  ConstraintMatcher m(compiler.compile(constraint(ConstraintKind::Regex, "a[bc]+")), std::nullopt);
  ASSERT_TRUE(m.enforcing());
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m), ids_of({"a", "ab"}));
  m.accept(toy_id("a"));
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m), ids_of({"b", "c"}));  // no EOS: "a" alone does not match
  m.accept(toy_id("c"));
  m.compute_mask();
  std::set<int32_t> expected = ids_of({"b", "c"});
  expected.insert(kToyEos);  // the regex can end here
  EXPECT_EQ(allowed_ids(m), expected);
  EXPECT_FALSE(m.terminated());
  m.accept(kToyEos);
  EXPECT_TRUE(m.terminated());
}

TEST_F(ConstraintTest, ApplyMasksLogitsAndNeverAllowsPaddingOrSpecialRows) {
  ConstraintMatcher m(compiler.compile(constraint(ConstraintKind::Grammar, R"(root ::= [a-z]+)")),
                      std::nullopt);
  std::vector<float> logits(kToyRows, 1.0f);
  m.apply(logits);  // computes the mask itself
  for (int32_t id = 0; id < kToyRows; ++id) {
    const bool letter = id < 26 || toy_tokens()[static_cast<size_t>(id)] == "ab" ||
                        toy_tokens()[static_cast<size_t>(id)] == "true" ||
                        toy_tokens()[static_cast<size_t>(id)] == "false" ||
                        toy_tokens()[static_cast<size_t>(id)] == "null" ||
                        toy_tokens()[static_cast<size_t>(id)] == "yes" ||
                        toy_tokens()[static_cast<size_t>(id)] == "no";
    EXPECT_EQ(std::isfinite(logits[static_cast<size_t>(id)]), letter) << "id " << id;
  }
}

TEST_F(ConstraintTest, RejectedTokenThrows) {
  ConstraintMatcher m(compiler.compile(constraint(ConstraintKind::Regex, "[0-9]+")), std::nullopt);
  EXPECT_THROW(m.accept(toy_id("a")), Error);
}

TEST_F(ConstraintTest, ChoiceAllowsExactlyTheChoices) {
  ConstraintMatcher m(compiler.compile(constraint(ConstraintKind::Choice, R"(["yes", "no"])")),
                      std::nullopt);
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m), ids_of({"y", "n", "yes", "no"}));
  m.accept(toy_id("no"));
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m), std::set<int32_t>{kToyEos});
}

TEST_F(ConstraintTest, JsonSchemaStartsWithAnObject) {
  ConstraintMatcher m(
      compiler.compile(constraint(
          ConstraintKind::JsonSchema,
          R"({"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]})")),
      std::nullopt);
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m), ids_of({"{", "{\""}));
  for (const char* t : {"{\"", "a", "\":"}) m.accept(toy_id(t));
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m), ids_of({" "}));  // one space after a colon, no free whitespace
  for (const char* t : {" ", "true", "}"}) m.accept(toy_id(t));
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m), std::set<int32_t>{kToyEos});
}

TEST_F(ConstraintTest, EnforcementStartsAfterTheGivenToken) {
  const int32_t end_of_reasoning = toy_id(".");
  ConstraintMatcher m(compiler.compile(constraint(ConstraintKind::Regex, "[0-9]")),
                      end_of_reasoning);
  EXPECT_FALSE(m.enforcing());
  std::vector<float> logits(kToyRows, 0.0f);
  m.apply(logits);  // not yet enforcing: untouched
  for (float x : logits) EXPECT_EQ(x, 0.0f);
  m.accept(toy_id("x"));  // free text
  EXPECT_FALSE(m.enforcing());
  m.accept(end_of_reasoning);
  EXPECT_TRUE(m.enforcing());
  m.compute_mask();
  EXPECT_EQ(allowed_ids(m).size(), 10u);
}

TEST(JsonSchemaSupport, FindsIgnoredKeywordsWhereSchemasNestButNotInPropertyNames) {
  EXPECT_EQ(unsupported_json_schema_keyword(
                R"({"type":"object","properties":{"x":{"anyOf":[{"type":"integer"},)"
                R"({"type":"array","contains":{"type":"integer"}}]}}})"),
            "'contains' at /properties/x/anyOf/1");
  // Properties may be called like keywords.
  EXPECT_EQ(unsupported_json_schema_keyword(
                R"({"type":"object","properties":{"not":{"type":"string"},"if":{}}})"),
            std::nullopt);
  EXPECT_EQ(unsupported_json_schema_keyword(R"({"type":"number","multipleOf":0.5})"),
            "'multipleOf' on a number at /");
  EXPECT_EQ(unsupported_json_schema_keyword("not json"), std::nullopt);
}

TEST_F(ConstraintTest, CompiledGrammarsAreCachedByKindAndSpec) {
  auto a = compiler.compile(constraint(ConstraintKind::Regex, "ab"));
  auto b = compiler.compile(constraint(ConstraintKind::Regex, "ab"));
  auto c = compiler.compile(constraint(ConstraintKind::Grammar, "root ::= \"ab\""));
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
}

// A schema whose JSON nests `depth` levels: {"type":"array","items": ... {} ...}.
OutputConstraint deep_schema(int depth) {
  std::string spec;
  for (int i = 1; i < depth; ++i) spec += R"({"type":"array","items":)";
  spec += "{}";
  spec += std::string(static_cast<size_t>(depth - 1), '}');
  return constraint(ConstraintKind::JsonSchema, spec);
}

TEST(JsonSchemaSupport, NestingDepthCountsBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": "[[{{\"}"}]})"), 3);
  EXPECT_EQ(json_nesting_depth("\"x\""), 0);
}

TEST_F(ConstraintTest, SchemasUpToTheNestingLimitCompile) {
  ASSERT_EQ(json_nesting_depth(deep_schema(kMaxConstraintNesting).spec), kMaxConstraintNesting);
  EXPECT_NO_THROW(compiler.compile(deep_schema(kMaxConstraintNesting)));
}

// Each bad spec throws an Error that starts with the constraint's field.
TEST_F(ConstraintTest, BadSpecsThrowNamingTheField) {
  const std::vector<OutputConstraint> bad = {
      constraint(ConstraintKind::JsonSchema, "{not json"),
      constraint(ConstraintKind::JsonSchema, R"({"type": "bogus"})"),
      // A keyword xgrammar would skip: refused rather than silently not enforced.
      constraint(ConstraintKind::JsonSchema,
                 R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})"),
      constraint(ConstraintKind::JsonSchema, R"({"not": {"type": "string"}})"),
      constraint(ConstraintKind::Regex, "(ab"),
      constraint(ConstraintKind::Grammar, "root ::= undefined_rule"),
      constraint(ConstraintKind::Grammar, "this is not a grammar"),
      constraint(ConstraintKind::Choice, "[]"), constraint(ConstraintKind::Choice, "[1, 2]"),
      constraint(ConstraintKind::StructuralTag, R"({"type": "nope"})"),
      constraint(ConstraintKind::Regex, std::string(kMaxConstraintSpecBytes + 1, 'a')),
      deep_schema(kMaxConstraintNesting + 1),  // at 2000 levels a compile takes minutes
  };
  for (const OutputConstraint& c : bad) {
    try {
      compiler.compile(c);
      ADD_FAILURE() << "compiled: " << c.spec.substr(0, 80);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("test_field: ", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace attnres
