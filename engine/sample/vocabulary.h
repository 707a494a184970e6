// Which token ids a sequence may produce. A checkpoint's LM head often has more rows than its
// tokenizer has tokens (every Qwen3 checkpoint: 151936 rows, 151669 tokens): the extra rows are
// padding, with no text. Sampling one would leave the detokenizer nothing to say, so the
// engine masks them before sampling (as vLLM and llama.cpp do) and requests that name them
// (prompt ids, logit_bias, allowed_token_ids, stop_token_ids) are refused with the id named.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace attnres {

struct Vocabulary {
  int rows = 0;       // logits per position: the model's vocab_size
  int decodable = 0;  // ids [0, decodable) have text; [decodable, rows) are padding rows

  // Every row decodable (tests, and models served without text).
  static Vocabulary all_rows(int rows) { return {rows, rows}; }
  // The model's rows, of which the tokenizer knows the first tokenizer_size.
  static Vocabulary of(int model_rows, int tokenizer_size);

  bool has_padding() const { return decodable < rows; }
  bool contains(int32_t id) const { return id >= 0 && id < decodable; }
  // Throws attnres::Error "field F: got X, expected a token id in [0, N)" (and why) unless
  // the tokenizer can decode id.
  void check(const std::string& field, int32_t id) const;
  // logits [rows]: the padding rows' logits become -inf.
  void mask_padding(std::span<float> logits) const;
};

}  // namespace attnres
