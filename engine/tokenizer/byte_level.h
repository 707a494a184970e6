// GPT-2's reversible byte <-> printable-character mapping (bytes_to_unicode), used by the
// ByteLevel pre-tokenizer (bytes -> characters) and decoder (characters -> bytes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace attnres::tok {

// Appends the byte-level characters (UTF-8) for every byte of `bytes`.
void byte_level_encode(std::string_view bytes, std::string& out);

// Appends the bytes that `token`'s characters stand for. Returns false (appending nothing)
// when some character is not in the byte-level alphabet.
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace attnres::tok
