// The BPE model of tokenizer.json: vocab + ranked merges, applied to one pre-tokenized word at
// a time. Mirrors HF tokenizers' BPE (merge_word / merge_all): lowest rank first, ties broken
// by the leftmost position; byte_fallback, unk fusing and ignore_merges behave the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attnres::tok {

// Transparent hashing so lookups by string_view do not allocate.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `model` is the "model" object of tokenizer.json; `origin` names the file in errors.
  BpeModel(const nlohmann::json& model, const std::string& origin);

  // Appends the ids of one pre-tokenized word. Thread-safe (the cache is locked).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr if the id has no vocab entry
  int32_t vocab_count() const { return static_cast<int32_t>(vocab_.size()); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct MergeInfo {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void tokenize_chunk(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_all(std::vector<int32_t>& symbols) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_token_ids_[256];
  // SentencePiece-style files (no pre-tokenizer) hand the whole text to the model as one word.
  // When no vocab token has "▁" after another character, no merge can cross the start of a
  // "▁word", so such a word is split there first: same ids, cacheable pieces, linear time.
  bool split_before_metaspace_ = false;  // id of "<0xAB>" or -1

  // Words seen before (like HF: only words shorter than kMaxCachedWord, bounded size).
  static constexpr size_t kMaxCachedWord = 256;
  static constexpr size_t kCacheCapacity = 100000;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace attnres::tok
