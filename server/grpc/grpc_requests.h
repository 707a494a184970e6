// proto -> engine: turns a GenerateRequest into an EngineRequest. Problems with the input
// itself (none given, empty, token ids outside the vocabulary) are reported here, naming the
// proto field; the sampling fields keep the HTTP API's names, so their range checks are left to
// EngineCore::submit (SamplingParams::validate), which answers with the same messages as HTTP.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "attnres/v1/generate.pb.h"
#include "engine/sample/sampling_params.h"
#include "engine/sample/vocabulary.h"
#include "engine/sched/engine_core.h"
#include "engine/tokenizer/tokenizer.h"

namespace attnres::server {

// What the Generate handler needs beyond the EngineRequest.
struct GrpcGenerateRequest {
  EngineRequest engine;    // request_id is left as the client sent it (may be empty)
  bool stream = false;     // chunks per step, or only the completions
  bool detokenize = true;  // text in the responses
};

// Fields the client left unset keep `defaults` (the model's generation_config.json values).
// Throws attnres::Error for a negative logprobs (the engine would read -1 as "none").
SamplingParams to_sampling_params(const v1::SamplingParams& proto, SamplingParams defaults);
// The request's structured-output constraint (the `constraint` oneof); none when unset or
// json_object is false. Its spec is checked when the engine compiles it.
std::optional<OutputConstraint> to_output_constraint(const v1::SamplingParams& proto);

// Throws attnres::Error naming the field for an invalid input (INVALID_ARGUMENT).
GrpcGenerateRequest to_engine_request(const v1::GenerateRequest& proto,
                                      const SamplingParams& defaults, const Tokenizer& tokenizer,
                                      const Vocabulary& vocabulary);

}  // namespace attnres::server
