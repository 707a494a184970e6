#include "engine/jinja/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "engine/core/error.h"
#include "engine/jinja/jinja_utf8.h"

namespace attnres::jinja {
namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// jinja2 normalizes \r\n and \r to \n and drops one trailing newline (keep_trailing_newline).
std::string normalize(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string rstrip_ws(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && is_ws(s[end - 1])) --end;
  return s.substr(0, end);
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit_data(src_.substr(pos_), pos_);
        break;
      }
      char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign =
          after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      if (kind == '%') {
        size_t raw_end = match_keyword_tag(tag, "raw", /*end_tag=*/false);
        if (raw_end != std::string::npos) {
          emit_data(apply_lstrip(src_.substr(pos_, tag - pos_), sign, kind), pos_);
          pos_ = raw_end;
          line_starting_ = src_[raw_end - 1] == '\n';
          lex_raw_body(tag);
          continue;
        }
      }
      emit_data(apply_lstrip(src_.substr(pos_, tag - pos_), sign, kind), pos_);
      pos_ = after + (sign ? 1 : 0);
      if (kind == '#') {
        lex_comment(tag);
      } else {
        push(kind == '{' ? TokenType::kVarBegin : TokenType::kBlockBegin, "", tag);
        lex_tag(kind == '{', tag);
      }
    }
    push(TokenType::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    int line, col;
    position(offset, line, col);
    throw Error("chat template syntax error at " + describe_position(line, col) + ": " + what);
  }

  void position(size_t offset, int& line, int& col) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t idx = static_cast<size_t>(it - line_starts_.begin()) - 1;
    line = static_cast<int>(idx) + 1;
    col = static_cast<int>(offset - line_starts_[idx]) + 1;
  }

  void push(TokenType type, std::string value, size_t offset) {
    Token t{type, std::move(value), 1, 1};
    position(offset, t.line, t.column);
    tokens_.push_back(std::move(t));
  }

  void emit_data(std::string text, size_t offset) {
    if (!text.empty()) push(TokenType::kData, std::move(text), offset);
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // jinja2's OptionalLStrip: '-' strips all whitespace before the tag; otherwise, for block
  // and comment tags, lstrip_blocks removes spaces/tabs between the line start and the tag.
  std::string apply_lstrip(std::string text, char sign, char kind) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign == '+' || kind == '{') return text;
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos > 0 || line_starting_) {
      bool all_ws = l_pos < text.size();
      for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
      if (all_ws) text.resize(l_pos);
    }
    return text;
  }

  // Matches `{%[-+]?\s*<word>\s*` followed by a block end at `at`; returns the offset just
  // past the block end (with the trim_blocks/`-` suffix rules), or npos.
  size_t match_keyword_tag(size_t at, const char* word, bool end_tag) const {
    size_t i = at + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    size_t n = std::strlen(word);
    if (src_.compare(i, n, word) != 0) return std::string::npos;
    i += n;
    if (i < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[i])) || src_[i] == '_')) {
      return std::string::npos;
    }
    while (i < src_.size() && is_ws(src_[i])) ++i;
    if (end_tag && src_.compare(i, 3, "+%}") == 0) return i + 3;
    if (src_.compare(i, 3, "-%}") == 0) {
      i += 3;
      while (i < src_.size() && is_ws(src_[i])) ++i;
      return i;
    }
    if (src_.compare(i, 2, "%}") == 0) {
      i += 2;
      // {% raw %} takes no trim_blocks newline in jinja2; {% endraw %} does.
      if (end_tag && i < src_.size() && src_[i] == '\n') ++i;
      return i;
    }
    return std::string::npos;
  }

  void lex_raw_body(size_t raw_tag) {
    for (size_t i = pos_; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t end = match_keyword_tag(i, "endraw", /*end_tag=*/true);
      if (end == std::string::npos) continue;
      char sign = src_[i + 2] == '-' || src_[i + 2] == '+' ? src_[i + 2] : 0;
      emit_data(apply_lstrip(src_.substr(pos_, i - pos_), sign, '%'), pos_);
      pos_ = end;
      line_starting_ = src_[end - 1] == '\n';
      return;
    }
    fail(raw_tag, "missing end of raw directive ({% endraw %})");
  }

  void lex_comment(size_t tag) {
    for (size_t i = pos_; i + 1 < src_.size(); ++i) {
      if ((src_[i] == '+' || src_[i] == '-') && src_.compare(i + 1, 2, "#}") == 0) {
        pos_ = i + 3;
        if (src_[i] == '-')
          while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
        line_starting_ = src_[pos_ - 1] == '\n';
        return;
      }
      if (src_.compare(i, 2, "#}") == 0) {
        pos_ = i + 2;
        if (pos_ < src_.size() && src_[pos_] == '\n') ++pos_;  // trim_blocks
        line_starting_ = src_[pos_ - 1] == '\n';
        return;
      }
    }
    fail(tag, "missing end of comment tag ('#}')");
  }

  // Returns true (and consumes it) when the tag's end delimiter starts at pos_.
  bool try_tag_end(bool variable) {
    const char* close = variable ? "}}" : "%}";
    if (!variable && src_.compare(pos_, 3, "+%}") == 0) {
      push(TokenType::kBlockEnd, "", pos_);
      pos_ += 3;
    } else if (src_[pos_] == '-' && src_.compare(pos_ + 1, 2, close) == 0) {
      push(variable ? TokenType::kVarEnd : TokenType::kBlockEnd, "", pos_);
      pos_ += 3;
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
    } else if (src_.compare(pos_, 2, close) == 0) {
      push(variable ? TokenType::kVarEnd : TokenType::kBlockEnd, "", pos_);
      pos_ += 2;
      if (!variable && pos_ < src_.size() && src_[pos_] == '\n') ++pos_;  // trim_blocks
    } else {
      return false;
    }
    line_starting_ = src_[pos_ - 1] == '\n';
    return true;
  }

  void lex_tag(bool variable, size_t tag) {
    std::vector<char> brackets;
    while (true) {
      if (pos_ >= src_.size()) {
        fail(tag, variable ? "unexpected end of template, expected '}}'"
                           : "unexpected end of template, expected '%}'");
      }
      if (brackets.empty() && try_tag_end(variable)) return;
      char c = src_[pos_];
      if (is_ws(c)) {
        ++pos_;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t start = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
          ++pos_;
        }
        push(TokenType::kName, src_.substr(start, pos_ - start), start);
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(brackets);
      }
    }
  }

  void lex_number() {
    size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    // jinja2: no float right after a dot, so `foo.0.1` is two item lookups.
    bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t save = pos_++;
      if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
      if (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) {
        is_float = true;
        digits();
      } else {
        pos_ = save;
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    push(is_float ? TokenType::kFloat : TokenType::kInteger, text, start);
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python's "unicode-escape" decoding, which jinja2 applies to string literals.
  void lex_string() {
    size_t start = pos_;
    char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail(start, "unterminated string literal");
      char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) fail(start, "unterminated string literal");
      char e = src_[pos_++];
      switch (e) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int i = 0; i < n; ++i) {
            int h = pos_ < src_.size() ? hex_value(src_[pos_]) : -1;
            if (h < 0) fail(pos_, "truncated \\" + std::string(1, e) + " escape in string");
            cp = cp * 16 + static_cast<char32_t>(h);
            ++pos_;
          }
          if (cp > 0x10FFFF) fail(pos_, "illegal Unicode character in string escape");
          utf8::append(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++i) {
              cp = cp * 8 + static_cast<char32_t>(src_[pos_++] - '0');
            }
            utf8::append(out, cp);
          } else {
            out += '\\';  // unknown escapes stay as written, like Python
            out += e;
          }
      }
    }
    push(TokenType::kString, std::move(out), start);
  }

  void lex_operator(std::vector<char>& brackets) {
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        push(TokenType::kOperator, op, pos_);
        pos_ += 2;
        return;
      }
    }
    char c = src_[pos_];
    if (!std::strchr("+-/*%~[](){}><=.:|,;", c)) {
      fail(pos_, std::string("unexpected char '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(pos_, std::string("unexpected '") + c + "'");
      if (brackets.back() != c) {
        fail(pos_, std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
      }
      brackets.pop_back();
    }
    push(TokenType::kOperator, std::string(1, c), pos_);
    ++pos_;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::string describe_position(int line, int column) {
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace attnres::jinja
