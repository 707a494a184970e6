// UTF-8 and Unicode helpers shared by the tokenizer pipeline: strict validation (encode input
// must be valid), Rust-compatible lossy decoding (HF decoders use String::from_utf8_lossy),
// and the character classes the pre-tokenizer regexes use (\p{L}, \p{N}, \s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace attnres::tok {

// Decodes the strictly valid UTF-8 sequence at s[i]. Returns its byte length (1..4) and sets
// *cp, or returns 0 when the bytes there are not a valid sequence.
int decode_utf8_at(std::string_view s, size_t i, char32_t* cp);

void append_utf8(std::string& out, char32_t cp);

// Byte offset of the first invalid UTF-8 byte, or nullopt when the whole string is valid.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// Same result as Rust's String::from_utf8_lossy: every maximal invalid subpart becomes one
// U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// The classes the split patterns distinguish. kSpace is Unicode White_Space (what Oniguruma's
// \s and Rust's char::is_whitespace mean); kLetter is \p{L}; kNumber is \p{N}.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };
CharClass classify(char32_t cp);
bool is_white_space(char32_t cp);
// Rust char::is_alphanumeric (approximated as \p{L} or \p{N}); used by single_word.
bool is_alphanumeric(char32_t cp);

// Unicode canonical composition (NFC).
std::string nfc(std::string_view s);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace attnres::tok
