// A tiny vocabulary for the structured-output tests: ids are single characters (and a few
// multi-character tokens), so a grammar's allowed-token set can be written down by hand. It
// matches the fake model of the scheduler tests (64 rows, EOS = 63) and leaves rows 60-62
// as padding beyond the tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sample/constraint_compiler.h"

namespace attnres::testing {

inline constexpr int kToyRows = 64;
inline constexpr int32_t kToyEos = 63;

// id -> text; ids >= the list's size are padding, "" is a special token.
inline const std::vector<std::string>& toy_tokens() {
  static const std::vector<std::string> tokens = [] {
    std::vector<std::string> t;
    for (char c = 'a'; c <= 'z'; ++c) t.emplace_back(1, c);  // 0-25
    for (char c = '0'; c <= '9'; ++c) t.emplace_back(1, c);  // 26-35
    for (const char* s :
         {"{",  "}",    "\"",    ":",    ",",   " ",  "[",     "]",   "-",   ".",
          "ab", "true", "false", "null", "yes", "no", "\"a\"", "{\"", "\":", "},"}) {
      t.emplace_back(s);  // 36-55
    }
    while (t.size() < 60) t.emplace_back("");  // 56-59: special
    return t;
  }();
  return tokens;
}

inline int32_t toy_id(const std::string& text) {
  const auto& t = toy_tokens();
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == text) return static_cast<int32_t>(i);
  }
  return -1;
}

// Rows 60-62 are padding; 63 is EOS (a special token in the tokenizer, so also "").
inline ConstraintVocabulary toy_constraint_vocabulary() {
  ConstraintVocabulary v;
  v.tokens = toy_tokens();
  v.rows = kToyRows;
  v.stop_ids = {kToyEos};
  return v;
}

}  // namespace attnres::testing
