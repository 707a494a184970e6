// UTF-8 helpers for the Jinja interpreter: Python strings are sequences of code points, so
// len(), slicing, strip() and case mapping have to work on code points, not bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnres::jinja::utf8 {

// Splits into code points (invalid bytes become U+FFFD, never a crash).
std::vector<char32_t> decode(const std::string& s);
std::string encode(const std::vector<char32_t>& cps);
void append(std::string& out, char32_t cp);
// Byte offsets of each code point start, plus s.size() at the end.
std::vector<size_t> boundaries(const std::string& s);
size_t length(const std::string& s);

// Python str.isspace() for one code point.
bool is_space(char32_t cp);
bool is_alnum(char32_t cp);
bool is_alpha(char32_t cp);
bool is_digit(char32_t cp);
bool is_upper(char32_t cp);
bool is_lower(char32_t cp);
char32_t to_upper(char32_t cp);
char32_t to_lower(char32_t cp);
char32_t to_title(char32_t cp);

std::string upper(const std::string& s);
std::string lower(const std::string& s);

// Python str.strip/lstrip/rstrip; `chars` == nullptr means whitespace.
std::string strip(const std::string& s, const std::string* chars, bool left, bool right);

}  // namespace attnres::jinja::utf8
