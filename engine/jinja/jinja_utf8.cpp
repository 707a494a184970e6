#include "engine/jinja/jinja_utf8.h"

#include <utf8proc.h>

#include <algorithm>

namespace attnres::jinja::utf8 {

std::vector<char32_t> decode(const std::string& s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(static_cast<char32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

void append(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append(out, cp);
  return out;
}

std::vector<size_t> boundaries(const std::string& s) {
  std::vector<size_t> out;
  const auto* base = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  size_t pos = 0;
  while (pos < s.size()) {
    out.push_back(pos);
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n =
        utf8proc_iterate(base + pos, static_cast<utf8proc_ssize_t>(s.size() - pos), &cp);
    pos += n <= 0 ? 1 : static_cast<size_t>(n);
  }
  out.push_back(s.size());
  return out;
}

size_t length(const std::string& s) { return boundaries(s).size() - 1; }

bool is_space(char32_t c) {
  // The exact set Python's str.isspace() accepts.
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

static utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_alpha(char32_t c) {
  auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
         cat == UTF8PROC_CATEGORY_LT || cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_LO;
}
bool is_digit(char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }
bool is_alnum(char32_t c) {
  auto cat = category(c);
  return is_alpha(c) || cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
         cat == UTF8PROC_CATEGORY_NO;
}
bool is_upper(char32_t c) { return utf8proc_isupper(static_cast<utf8proc_int32_t>(c)); }
bool is_lower(char32_t c) { return utf8proc_islower(static_cast<utf8proc_int32_t>(c)); }
char32_t to_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

static bool is_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char ch) { return (ch & 0x80) == 0; });
}

std::string upper(const std::string& s) {
  if (is_ascii(s)) {
    std::string out = s;
    for (char& ch : out)
      if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 32);
    return out;
  }
  std::string out;
  for (char32_t cp : decode(s)) append(out, to_upper(cp));
  return out;
}

std::string lower(const std::string& s) {
  if (is_ascii(s)) {
    std::string out = s;
    for (char& ch : out)
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch + 32);
    return out;
  }
  std::string out;
  for (char32_t cp : decode(s)) append(out, to_lower(cp));
  return out;
}

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<char32_t> cps = decode(s);
  std::vector<char32_t> set;
  if (chars) set = decode(*chars);
  auto strippable = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_space(c);
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  return encode(std::vector<char32_t>(cps.begin() + begin, cps.begin() + end));
}

}  // namespace attnres::jinja::utf8
