#include "fuzz_support.h"

#include <filesystem>

namespace attnres::fuzz {

std::shared_ptr<const Tokenizer> shared_tokenizer(const std::string& name) {
  const std::string shared = source_path("../shared/data/tokenizers/" + name + "/tokenizer.json");
  const std::string path = std::filesystem::exists(shared)
                               ? shared
                               : source_path("engine/model/assets/gpt2/tokenizer.json");
  return Tokenizer::load(path);
}

const std::shared_ptr<const Tokenizer>& qwen3_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tokenizer = shared_tokenizer("qwen3");
  return tokenizer;
}

}  // namespace attnres::fuzz
