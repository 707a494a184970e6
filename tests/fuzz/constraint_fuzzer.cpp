// Structured output's compile path on arbitrary specs: the first byte picks the kind (JSON
// schema, JSON object, regex, choice, EBNF grammar, structural tag), the rest is the spec. A spec
// either compiles or is refused with attnres::Error; a compiled one then drives a matcher a few
// steps (mask, take the first allowed token, accept). Anything else (a crash, another
// exception, a sanitizer report, a hang) is a bug. The vocabulary is small and synthetic (every
// printable ASCII character plus some JSON-ish words) so each input compiles fast.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/sample/constraint_matcher.h"
#include "engine/sample/token_bitmask.h"
#include "fuzz_support.h"

using namespace attnres;

namespace {

const ConstraintCompiler& compiler() {
  static const ConstraintCompiler instance([] {
    ConstraintVocabulary v;
    for (int c = 0x20; c < 0x7f; ++c) v.tokens.emplace_back(1, static_cast<char>(c));
    for (const char* w : {"\n", "\t", "{\"", "\":", "\",", "true", "false", "null", "\\u00e9",
                          "\xc3\xa9", "\xe2\x82\xac", "ab", "abc", "0.", "-1", "[]", "{}"}) {
      v.tokens.emplace_back(w);
    }
    v.tokens.emplace_back("");                       // a special token
    v.rows = static_cast<int>(v.tokens.size()) + 5;  // and padding rows
    v.stop_ids = {static_cast<int32_t>(v.tokens.size()) - 1};
    return v;
  }());
  return instance;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  OutputConstraint constraint;
  constraint.kind = static_cast<ConstraintKind>(data[0] % 6);
  constraint.spec = std::string(fuzz::as_text(data + 1, size - 1));
  constraint.field = "fuzz";
  std::shared_ptr<const CompiledConstraint> compiled;
  try {
    compiled = compiler().compile(constraint);
  } catch (const Error&) {
    return 0;  // refused: the documented outcome for a bad spec
  }
  ConstraintMatcher matcher(compiled, std::nullopt);
  std::vector<float> logits(static_cast<size_t>(compiler().rows()), 0.0f);
  for (int step = 0; step < 16 && !matcher.terminated(); ++step) {
    try {
      matcher.apply(logits);
    } catch (const Error&) {
      break;  // a dead end, reported as an error
    }
    int32_t token = -1;
    for (int32_t id = 0; id < compiler().rows() && token < 0; ++id) {
      if (token_allowed(matcher.mask(), id)) token = id;
    }
    if (token < 0) std::abort();  // apply() said something was allowed
    matcher.accept(token);        // the mask allowed it: a rejection here is a bug (it throws)
  }
  return 0;
}
