#include "engine/sched/tokenizer_text_decoder.h"

namespace attnres {
namespace {

class IncrementalTextDecoder : public TextDecoder {
 public:
  IncrementalTextDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
      : decoder_(std::move(tokenizer), skip_special_tokens) {}
  std::string push(int32_t token) override { return decoder_.push(token); }
  std::string flush() override { return decoder_.flush(); }

 private:
  IncrementalDecoder decoder_;
};

}  // namespace

TextDecoderFactory make_text_decoder_factory(std::shared_ptr<const Tokenizer> tokenizer) {
  return [tokenizer](const SamplingParams& params) -> std::unique_ptr<TextDecoder> {
    return std::make_unique<IncrementalTextDecoder>(tokenizer, params.skip_special_tokens);
  };
}

}  // namespace attnres
