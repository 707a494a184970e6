// Hand-written scanners for the pre-tokenizer regexes used by real tokenizer.json files.
// std::regex cannot express \p{L} and is slow, so (like llama.cpp) each known pattern string is
// recognised exactly and mapped to a scanner with the same leftmost-alternative, backtracking
// semantics as Oniguruma, which the HF `tokenizers` library uses.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attnres::tok {

enum class SplitPattern {
  kGpt2,    // 's|'t|... | ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kQwen2,   // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
  kLlama3,  // the same with \p{N}{1,3}
};

// The GPT-2 pattern string as it appears in tokenizer.json (also ByteLevel's built-in regex).
extern const std::string_view kGpt2PatternString;

// Maps an exact pattern string to its scanner; throws attnres::Error for anything else.
SplitPattern recognise_split_pattern(std::string_view regex);

// Splits `text` (valid UTF-8) into the pieces the regex produces with the "Isolated"
// behaviour: every match is its own piece, and any unmatched gap is a piece too.
// Returns the byte offsets where pieces end (strictly increasing, the last is text.size()).
std::vector<size_t> split_with_pattern(SplitPattern pattern, std::string_view text);

}  // namespace attnres::tok
