// The model's structured-output compiler (engine/sample/constraint_compiler.h) built from its
// tokenizer: every token's string in the tokenizer's spelling, special tokens and the padding
// rows beyond the tokenizer never allowed, the EOS ids allowed where a grammar can end.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/sample/constraint_compiler.h"
#include "engine/sample/vocabulary.h"
#include "engine/tokenizer/tokenizer.h"

namespace attnres {

ConstraintVocabulary constraint_vocabulary(const Tokenizer& tokenizer, const Vocabulary& vocabulary,
                                           const std::vector<int32_t>& eos_ids);

std::shared_ptr<const ConstraintCompiler> make_constraint_compiler(
    const Tokenizer& tokenizer, const Vocabulary& vocabulary, const std::vector<int32_t>& eos_ids);

}  // namespace attnres
