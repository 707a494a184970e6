#include "clients/cli_flags/sampling_flags.h"

namespace attnres::cli {

std::vector<FlagSpec> sampling_flags() {
  return {
      {"max-tokens", "N", "tokens to generate at most (default 64)"},
      {"temperature", "T", "0 = greedy (default: generation_config.json, else 1)"},
      {"top-p", "P", "nucleus sampling mass"},
      {"top-k", "K", "keep the K most likely tokens (0 = off)"},
      {"min-p", "P", "drop tokens below P x the top probability"},
      {"repetition-penalty", "R", "penalise tokens of prompt and output (1 = off)"},
      {"presence-penalty", "X", "penalise tokens already generated, once"},
      {"frequency-penalty", "X", "penalise tokens by how often they were generated"},
      {"logit-bias", "ID:BIAS", "add BIAS to token ID's logit", true},
      {"seed", "N", "seed for reproducible sampling"},
      {"stop", "TEXT", "stop when TEXT is generated (not included in the output)", true},
      {"stop-token-ids", "IDS", "comma-separated token ids that stop generation"},
      {"ignore-eos", "", "keep generating after an end-of-sequence token"},
      {"min-tokens", "N", "generate at least N tokens before any stop"},
      {"logprobs", "K", "report the sampled token's logprob and the top K"},
  };
}

}  // namespace attnres::cli
