// config.json and generation_config.json parsing on arbitrary JSON: every defect must be an
// attnres::Error naming the file and the field.
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/model/model_config.h"
#include "fuzz_support.h"

using namespace attnres;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json json = nlohmann::json::parse(fuzz::as_text(data, size), nullptr, false);
  if (json.is_discarded()) return 0;
  try {
    const ModelConfig config = ModelConfig::from_json(json, "fuzz/config.json");
    (void)config.summary();
    (void)config.rope_inv_freq();
  } catch (const Error&) {
  }
  try {
    (void)GenerationDefaults::from_json(json, "fuzz/generation_config.json");
  } catch (const Error&) {
  }
  return 0;
}
