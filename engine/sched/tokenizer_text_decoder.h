// The TextDecoder seam of the engine loop and the offline generator, filled with the
// tokenizer's IncrementalDecoder.
#pragma once

#include <memory>

#include "engine/runner/model_runner.h"
#include "engine/tokenizer/tokenizer.h"

namespace attnres {

TextDecoderFactory make_text_decoder_factory(std::shared_ptr<const Tokenizer> tokenizer);

}  // namespace attnres
