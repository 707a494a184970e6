#include "engine/tokenizer/added_vocabulary.h"

#include "engine/tokenizer/unicode_util.h"

namespace attnres::tok {
namespace {

// The last / first character of a string, decoded (0 when empty).
char32_t last_char(std::string_view s) {
  if (s.empty()) return 0;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  char32_t cp = 0;
  decode_utf8_at(s, i, &cp);
  return cp;
}

char32_t first_char(std::string_view s) {
  if (s.empty()) return 0;
  char32_t cp = 0;
  decode_utf8_at(s, 0, &cp);
  return cp;
}

// Byte index where the trailing whitespace of s begins (s.size() if none).
size_t trailing_space_start(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    char32_t cp = 0;
    decode_utf8_at(s, j, &cp);
    if (!is_white_space(cp)) break;
    i = j;
  }
  return i;
}

// Byte length of the leading whitespace of s.
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp = 0;
    int len = decode_utf8_at(s, i, &cp);
    if (len == 0 || !is_white_space(cp)) break;
    i += len;
  }
  return i;
}

}  // namespace

void TokenMatcher::add(std::string pattern, size_t token_index) {
  if (pattern.empty()) return;  // an empty token can never be matched
  by_first_byte_[static_cast<unsigned char>(pattern[0])].push_back(
      static_cast<uint32_t>(patterns_.size()));
  patterns_.push_back({std::move(pattern), token_index});
}

bool TokenMatcher::find(std::string_view text, size_t from, size_t* start, size_t* len,
                        size_t* token) const {
  for (size_t i = from; i < text.size(); ++i) {
    const auto& candidates = by_first_byte_[static_cast<unsigned char>(text[i])];
    size_t best_len = 0;
    for (uint32_t c : candidates) {
      const std::string& p = patterns_[c].text;
      if (p.size() > best_len && text.compare(i, p.size(), p) == 0) {
        best_len = p.size();
        *token = patterns_[c].token;
      }
    }
    if (best_len > 0) {
      *start = i;
      *len = best_len;
      return true;
    }
  }
  return false;
}

void split_on_added_tokens(std::string_view text, bool text_at_origin, const TokenMatcher& matcher,
                           const std::vector<AddedToken>& tokens, std::vector<Segment>& out) {
  size_t offset = 0;  // end of what has been emitted
  size_t search = 0;  // where the matcher continues (it does not see lstrip/rstrip changes)
  auto emit_text = [&](size_t a, size_t b) {
    if (b > a) out.push_back({std::string(text.substr(a, b - a)), -1, text_at_origin && a == 0});
  };
  size_t start = 0, len = 0, index = 0;
  while (!matcher.empty() && matcher.find(text, search, &start, &len, &index)) {
    search = start + len;
    const AddedToken& tok = tokens[index];
    size_t stop = start + len;
    if (tok.single_word) {
      const bool space_before = start == 0 || !is_alphanumeric(last_char(text.substr(0, start)));
      const bool space_after =
          stop == text.size() || !is_alphanumeric(first_char(text.substr(stop)));
      if (!space_before || !space_after) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), offset);
    if (tok.rstrip) stop += leading_space_len(text.substr(stop));
    emit_text(offset, start);
    out.push_back({std::string(text.substr(start, stop - start)), tok.id, false});
    offset = stop;
  }
  emit_text(offset, text.size());
}

}  // namespace attnres::tok
