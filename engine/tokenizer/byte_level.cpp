#include "engine/tokenizer/byte_level.h"

#include <array>

#include "engine/tokenizer/unicode_util.h"

namespace attnres::tok {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_chars;
  std::array<int16_t, 512> char_to_byte;  // code points used are all < 512; -1 = not mapped

  Tables() {
    char_to_byte.fill(-1);
    int next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes map to themselves; the rest move to 256, 257, ... in order.
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const char32_t cp =
          printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next_extra++);
      append_utf8(byte_to_chars[b], cp);
      char_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

void byte_level_encode(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  for (unsigned char b : bytes) out += t.byte_to_chars[b];
}

bool byte_level_decode(std::string_view token, std::string& out) {
  const Tables& t = tables();
  const size_t mark = out.size();
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp = 0;
    const int len = decode_utf8_at(token, i, &cp);
    if (len == 0 || cp >= t.char_to_byte.size() || t.char_to_byte[cp] < 0) {
      out.resize(mark);
      return false;
    }
    out.push_back(static_cast<char>(t.char_to_byte[cp]));
    i += len;
  }
  return true;
}

}  // namespace attnres::tok
