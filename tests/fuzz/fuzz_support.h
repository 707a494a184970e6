// Shared pieces of the libFuzzer targets (tests/fuzz/README.md): the real tokenizer files
// and the demo model, loaded once per process. Each target feeds its input to one parser
// and accepts attnres::Error (and the front ends' ApiError), the documented way to refuse bad
// input; anything else (another exception, a crash, a sanitizer report, a leak) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/tokenizer/tokenizer.h"

namespace attnres::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The repository's files (ATTNRES_SOURCE_DIR is the source tree the target was built from).
inline std::string source_path(const std::string& relative) {
  return std::string(ATTNRES_SOURCE_DIR) + "/" + relative;
}

// A published tokenizer.json from ../shared/data/tokenizers (the Qwen3 one: byte-level BPE
// with added tokens), or the GPT-2 one shipped with the repository when shared/ is absent.
std::shared_ptr<const Tokenizer> shared_tokenizer(const std::string& name);

// The Qwen3 tokenizer, loaded once per process. The targets that use it load it from
// LLVMFuzzerInitialize: libFuzzer times every input (-timeout), and under ASan on a busy
// machine loading takes longer than one input may.
const std::shared_ptr<const Tokenizer>& qwen3_tokenizer();

}  // namespace attnres::fuzz
