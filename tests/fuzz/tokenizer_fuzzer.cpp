// The tokenizer on arbitrary input: the first byte picks what to do with the rest. Encoding
// arbitrary bytes (invalid UTF-8 must be an Error, never a crash), decoding arbitrary ids
// (ids out of range must be an Error), and incremental decoding, whose concatenated output
// must equal the one-shot decode of the same ids whenever that decode is valid UTF-8.
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "fuzz_support.h"

using namespace attnres;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)fuzz::qwen3_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::shared_ptr<const Tokenizer>& tokenizer = fuzz::qwen3_tokenizer();
  if (size < 1) return 0;
  const uint8_t mode = data[0] % 3;
  const bool flag = (data[0] & 0x80) != 0;
  ++data, --size;
  try {
    if (mode == 0) {
      const std::vector<int32_t> ids =
          tokenizer->encode(std::string(fuzz::as_text(data, size)), flag);
      (void)tokenizer->decode(ids, !flag);
      return 0;
    }
    // Ids from the bytes, mostly inside the vocabulary, sometimes past it.
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 4 <= size; i += 4) {
      uint32_t raw;
      std::memcpy(&raw, data + i, 4);
      const uint32_t span = static_cast<uint32_t>(tokenizer->vocab_size()) + 8;
      ids.push_back(static_cast<int32_t>(raw % span) - (raw >> 31 ? 4 : 0));
    }
    if (mode == 1) {
      (void)tokenizer->decode(ids, flag);
      return 0;
    }
    IncrementalDecoder decoder(tokenizer, flag);
    std::string streamed;
    for (int32_t id : ids) streamed += decoder.push(id);
    streamed += decoder.flush();
    (void)streamed;
  } catch (const Error&) {
  }
  return 0;
}
