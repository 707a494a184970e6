// What attnres-client prints: the JSON documents of --json (field names of the OpenAI / vLLM
// responses: text, token_ids, finish_reason, stop_reason, usage) and the human-readable lines.
// Pure functions of the client library's values, unit-tested in tests/cpp/clients/cpp.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clients/cpp/types.h"

namespace attnres::client::cli {

nlohmann::json to_json(const Usage& usage);
nlohmann::json to_json(const GenerateResult& result);
nlohmann::json to_json(const ModelInfo& info);
nlohmann::json to_json(const TokenizeResult& result);

// One line for stderr after a generation: request id, each choice's finish reason (and
// stop reason / error), and the usage.
std::string summary_line(const GenerateResult& result);

// model-info without --json: one "name: value" line per field.
std::string model_info_text(const ModelInfo& info);

// "1,2,3": the form --prompt-ids and detokenize --ids read back.
std::string join_ids(const std::vector<int32_t>& ids);

// A JSON document as one line; invalid UTF-8 is replaced, never an exception.
std::string dump(const nlohmann::json& document);

}  // namespace attnres::client::cli
