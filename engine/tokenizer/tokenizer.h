// Hugging Face tokenizer.json in C++: the same ids as the `tokenizers` library for BPE
// tokenizers (GPT-2, Qwen2/3, Llama 3, Llama 2 / SentencePiece-style with byte fallback).
//
// Pipeline (as in HF): added tokens are cut out of the raw text first; the remaining pieces are
// normalized, pre-tokenized into words, and each word is BPE-encoded; the post-processor adds
// template special tokens. Decoding maps ids back to token strings and runs the decoder chain.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attnres {

namespace tok {
class BpeModel;
class Normalizer;
class PreTokenizer;
class Decoder;
class TokenMatcher;
struct AddedToken;
struct DecoderTraits;
}  // namespace tok

class Tokenizer {
 public:
  // Parses tokenizer.json; throws attnres::Error naming the file and what is malformed/unsupported.
  static std::shared_ptr<const Tokenizer> load(const std::string& tokenizer_json_path);
  static std::shared_ptr<const Tokenizer> from_json_string(const std::string& json,
                                                           const std::string& origin);
  ~Tokenizer();

  // Throws attnres::Error if text is not valid UTF-8 (message says so and where).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Throws attnres::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  int32_t vocab_size() const;  // max id + 1 over model vocab and added tokens
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // added token or vocab string, "" if none
  bool is_special(int32_t id) const;          // added token with special=true

  // How the vocabulary's token strings (id_to_token) spell bytes, for libraries that decode the
  // vocabulary themselves (the structured-output constraint compiler): ByteLevel (GPT-2, Qwen,
  // Llama 3), ByteFallback (SentencePiece-style "<0xAB>" tokens and the "\u2581" space), or Raw.
  enum class TokenSpelling { Raw, ByteFallback, ByteLevel };
  TokenSpelling token_spelling() const;
  // Whether decoding drops the space a Metaspace decoder prepends to the first word.
  bool prepends_space() const;

 private:
  friend class IncrementalDecoder;
  Tokenizer();
  void parse(const std::string& json, const std::string& origin);
  // Token strings of `ids` (skipping special ones if asked), after range checks.
  std::vector<std::string> id_strings(std::span<const int32_t> ids, bool skip_special) const;
  // Runs the decoder chain; `continuation`: the tokens continue an already decoded text.
  std::string decode_strings(std::vector<std::string> tokens, bool continuation) const;
  void parse_post_processor(const nlohmann::json& j);

  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::Normalizer> normalizer_;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tok::Decoder> decoder_;
  std::unique_ptr<tok::DecoderTraits> decoder_traits_;
  std::vector<tok::AddedToken> added_;  // in file order
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_map<std::string, bool> special_contents_;  // content of special added tokens
  std::unique_ptr<tok::TokenMatcher> raw_matcher_;          // tokens with normalized=false
  std::unique_ptr<tok::TokenMatcher> normalized_matcher_;   // normalized=true, content normalized
  std::vector<int32_t> template_prefix_, template_suffix_;  // post-processor special ids
  int32_t vocab_size_ = 0;
};

// Streaming detokenizer: emits text only at complete UTF-8 characters; handles byte-fallback
// (<0xAB>) tokens and Metaspace/SentencePiece leading spaces exactly as decode() of the whole
// sequence would (concatenation of all push() outputs + flush() == decode(all ids)).
class IncrementalDecoder {
 public:
  IncrementalDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special_tokens);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::string emit(bool final);

  std::shared_ptr<const Tokenizer> tok_;
  bool skip_special_;
  std::vector<std::string> window_;  // token strings since the last anchor
  bool last_is_byte_token_ = false;
  bool anchored_ = false;         // window_ continues already-emitted text
  size_t emitted_in_window_ = 0;  // bytes of decode(window_) already returned
};

}  // namespace attnres
