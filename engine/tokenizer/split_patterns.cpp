#include "engine/tokenizer/split_patterns.h"

#include "engine/core/error.h"
#include "engine/tokenizer/unicode_util.h"

namespace attnres::tok {

const std::string_view kGpt2PatternString =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

constexpr std::string_view kQwen2PatternString =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3PatternString =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The text decoded once into code points, so the scanners can look ahead cheaply.
struct CodePoints {
  std::vector<char32_t> cp;
  std::vector<CharClass> cls;
  std::vector<size_t> offset;  // byte offset of each code point; offset[n] == text.size()

  explicit CodePoints(std::string_view text) {
    cp.reserve(text.size());
    cls.reserve(text.size());
    offset.reserve(text.size() + 1);
    size_t i = 0;
    while (i < text.size()) {
      char32_t c = 0;
      int len = decode_utf8_at(text, i, &c);
      if (len == 0) {  // callers validate; be defensive and treat the byte as "other"
        c = 0xFFFD;
        len = 1;
      }
      offset.push_back(i);
      cp.push_back(c);
      cls.push_back(classify(c));
      i += len;
    }
    offset.push_back(text.size());
  }
  size_t size() const { return cp.size(); }
  bool is(size_t k, CharClass c) const { return k < cp.size() && cls[k] == c; }
  bool is_newline(size_t k) const { return k < cp.size() && (cp[k] == '\r' || cp[k] == '\n'); }
};

// Case folding for the (?i:...) contractions: only ASCII and U+017F LATIN SMALL LETTER LONG S
// (which Unicode case-folds to 's') can fold onto the letters s, t, r, e, v, m, l, d.
char32_t fold(char32_t c, bool case_insensitive) {
  if (!case_insensitive) return c;
  if (c >= 'A' && c <= 'Z') return c + ('a' - 'A');
  if (c == 0x17F) return 's';
  return c;
}

// 's|'t|'re|'ve|'m|'ll|'d at i; returns the match end or i when none matches.
size_t match_contraction(const CodePoints& t, size_t i, bool ci) {
  const size_t n = t.size();
  if (t.cp[i] != '\'' || i + 1 >= n) return i;
  const char32_t a = fold(t.cp[i + 1], ci);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 >= n) return i;
  const char32_t b = fold(t.cp[i + 2], ci);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return i;
}

size_t run_of(const CodePoints& t, size_t j, CharClass c) {
  while (t.is(j, c)) ++j;
  return j;
}

// \s+(?!\S) followed by the \s+ fallback: a whitespace run that is followed by a non-space
// gives back its last character (so that " word" can take it), unless that would leave nothing.
size_t match_trailing_space(const CodePoints& t, size_t i) {
  const size_t e = run_of(t, i, CharClass::kSpace);
  if (e == t.size() || e - i == 1) return e;
  return e - 1;
}

size_t match_gpt2(const CodePoints& t, size_t i) {
  if (size_t e = match_contraction(t, i, false); e != i) return e;
  const bool space = t.cp[i] == ' ';
  for (CharClass c : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
    // ` ?X+`: the optional space is taken only when an X follows it.
    const size_t j = (space && t.is(i + 1, c)) ? i + 1 : i;
    if (t.is(j, c)) return run_of(t, j, c);
  }
  if (t.is(i, CharClass::kSpace)) return match_trailing_space(t, i);
  return i;
}

size_t match_qwen_llama(const CodePoints& t, size_t i, size_t max_digits) {
  if (size_t e = match_contraction(t, i, true); e != i) return e;
  const CharClass c0 = t.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0 != CharClass::kLetter && c0 != CharClass::kNumber && !t.is_newline(i) &&
      t.is(i + 1, CharClass::kLetter)) {
    return run_of(t, i + 1, CharClass::kLetter);
  }
  if (c0 == CharClass::kLetter) return run_of(t, i, CharClass::kLetter);
  // \p{N} or \p{N}{1,3}
  if (c0 == CharClass::kNumber) {
    size_t j = i;
    while (j - i < max_digits && t.is(j, CharClass::kNumber)) ++j;
    return j;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  {
    size_t j = (t.cp[i] == ' ' && t.is(i + 1, CharClass::kOther)) ? i + 1 : i;
    if (t.is(j, CharClass::kOther)) {
      j = run_of(t, j, CharClass::kOther);
      while (t.is_newline(j)) ++j;
      return j;
    }
  }
  if (c0 != CharClass::kSpace) return i;
  // \s*[\r\n]+: \s* backtracks to the last newline of the whitespace run, which [\r\n]+ takes.
  const size_t e = run_of(t, i, CharClass::kSpace);
  for (size_t k = e; k > i; --k) {
    if (t.is_newline(k - 1)) return k;
  }
  return match_trailing_space(t, i);
}

}  // namespace

SplitPattern recognise_split_pattern(std::string_view regex) {
  if (regex == kGpt2PatternString) return SplitPattern::kGpt2;
  if (regex == kQwen2PatternString) return SplitPattern::kQwen2;
  if (regex == kLlama3PatternString) return SplitPattern::kLlama3;
  throw Error("unsupported pre-tokenizer regex: " + std::string(regex));
}

std::vector<size_t> split_with_pattern(SplitPattern pattern, std::string_view text) {
  const CodePoints t(text);
  std::vector<size_t> ends;
  const size_t n = t.size();
  size_t i = 0;
  bool in_gap = false;  // an unmatched character extends the current gap piece
  while (i < n) {
    size_t e = i;
    switch (pattern) {
      case SplitPattern::kGpt2:
        e = match_gpt2(t, i);
        break;
      case SplitPattern::kQwen2:
        e = match_qwen_llama(t, i, 1);
        break;
      case SplitPattern::kLlama3:
        e = match_qwen_llama(t, i, 3);
        break;
    }
    if (e == i) {
      in_gap = true;
      ++i;
      continue;
    }
    if (in_gap) ends.push_back(t.offset[i]);
    in_gap = false;
    ends.push_back(t.offset[e]);
    i = e;
  }
  if (in_gap) ends.push_back(text.size());
  return ends;
}

}  // namespace attnres::tok
