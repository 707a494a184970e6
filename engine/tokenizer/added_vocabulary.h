// Added tokens (tokenizer.json "added_tokens"): matched in the raw text before the normalizer
// and the model run, never split, with HF's lstrip / rstrip / single_word / normalized rules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attnres::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// One piece of input after added-token extraction: either plain text (added_id < 0) that still
// goes through the pipeline, or an added token (its id).
struct Segment {
  std::string text;
  int32_t added_id = -1;
  bool at_origin = false;  // starts at byte 0 of the original input (Metaspace "first")
};

// Leftmost-longest matcher over a set of token strings (what HF builds with aho-corasick).
class TokenMatcher {
 public:
  void add(std::string pattern, size_t token_index);
  bool empty() const { return patterns_.empty(); }
  // Finds the leftmost match starting at or after `from`; among matches starting there, the
  // longest. Returns false when there is none.
  bool find(std::string_view text, size_t from, size_t* start, size_t* len, size_t* token) const;

 private:
  struct Pattern {
    std::string text;
    size_t token;
  };
  std::vector<Pattern> patterns_;
  std::vector<std::vector<uint32_t>> by_first_byte_ = std::vector<std::vector<uint32_t>>(256);
};

// Splits `text` around the tokens that `matcher` finds (HF AddedVocabulary::find_matches).
// Plain segments inherit at_origin only when they start at byte 0 and `text_at_origin`.
void split_on_added_tokens(std::string_view text, bool text_at_origin, const TokenMatcher& matcher,
                           const std::vector<AddedToken>& tokens, std::vector<Segment>& out);

}  // namespace attnres::tok
