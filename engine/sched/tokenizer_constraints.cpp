#include "engine/sched/tokenizer_constraints.h"

#include <string>

#include "engine/tokenizer/byte_level.h"

namespace attnres {

ConstraintVocabulary constraint_vocabulary(const Tokenizer& tokenizer, const Vocabulary& vocabulary,
                                           const std::vector<int32_t>& eos_ids) {
  ConstraintVocabulary out;
  switch (tokenizer.token_spelling()) {
    case Tokenizer::TokenSpelling::ByteLevel:
      out.spelling = ConstraintVocabulary::Spelling::ByteLevel;
      break;
    case Tokenizer::TokenSpelling::ByteFallback:
      out.spelling = ConstraintVocabulary::Spelling::ByteFallback;
      break;
    case Tokenizer::TokenSpelling::Raw:
      out.spelling = ConstraintVocabulary::Spelling::Raw;
      break;
  }
  out.prepends_space = tokenizer.prepends_space();
  out.rows = vocabulary.rows;
  out.stop_ids = eos_ids;
  out.tokens.reserve(static_cast<size_t>(vocabulary.decodable));
  std::string bytes;
  for (int32_t id = 0; id < vocabulary.decodable; ++id) {
    // "" marks a token no grammar produces: special tokens, and ids with no token.
    if (tokenizer.is_special(id)) {
      out.tokens.emplace_back();
      continue;
    }
    std::string token = tokenizer.id_to_token(id);
    // An added token's content is plain text, not in the byte-level alphabet: spell it so.
    bytes.clear();
    if (out.spelling == ConstraintVocabulary::Spelling::ByteLevel &&
        !tok::byte_level_decode(token, bytes)) {
      std::string spelled;
      tok::byte_level_encode(token, spelled);
      token = std::move(spelled);
    }
    out.tokens.push_back(std::move(token));
  }
  return out;
}

std::shared_ptr<const ConstraintCompiler> make_constraint_compiler(
    const Tokenizer& tokenizer, const Vocabulary& vocabulary, const std::vector<int32_t>& eos_ids) {
  return std::make_shared<const ConstraintCompiler>(
      constraint_vocabulary(tokenizer, vocabulary, eos_ids));
}

}  // namespace attnres
