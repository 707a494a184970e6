// The sampling flags (vLLM / OpenAI names) shared by `attnres generate` and
// `attnres-client generate` (clients/cpp), so both commands spell and explain them alike.
#pragma once

#include <vector>

#include "clients/cli_flags/flags.h"

namespace attnres::cli {

// --max-tokens, --temperature, --top-p, --top-k, --min-p, --repetition-penalty,
// --presence-penalty, --frequency-penalty, --logit-bias, --seed, --stop, --stop-token-ids,
// --ignore-eos, --min-tokens, --logprobs.
std::vector<FlagSpec> sampling_flags();

}  // namespace attnres::cli
