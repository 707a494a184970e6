// The synthetic "random" data set of `attnres bench serve`: prompts that the *server's*
// tokenizer counts as exactly the requested number of tokens.
//
// vLLM's RandomDataset (vllm/benchmarks/datasets/random.py) decodes random token ids with a
// local copy of the tokenizer, re-encodes, and truncates or pads up to ten times
// (gen_prompt_decode_to_target_len), tolerating a small mismatch. We have no local tokenizer
// (the benchmark may target any model), so we ask the server (HTTP /tokenize and
// /detokenize, gRPC Tokenize / Detokenize) through the PromptTokenizer interface, and we
// insist on an exact count: a prompt that does not converge is rebuilt from fresh random
// text, and the run stops with an error if even that fails.
//
// The text is random pseudo-words (syllables drawn from a seeded generator) rather than
// random token ids: it needs no knowledge of the vocabulary (which token ids are special or
// unused), re-tokenizes stably, and differs from prompt to prompt from the first token, so no
// two prompts share a cacheable prefix. Prompt i depends only on (seed, i).
//
// "Length" is what the server counts for the whole prompt: for completions the text with the
// tokenizer's special tokens (BOS where the tokenizer adds one), for chat the rendered chat
// template around a single user message (so the template's own tokens are part of the length,
// and the server's usage.prompt_tokens equals the requested length on every backend).
//
// Shared prefix (--random-prefix-len N, vLLM's RandomDataset prefix_len): every prompt starts
// with the same random text of exactly N tokens (as the server tokenizes the text alone),
// followed by its own random words; the server counts N + input_len for the whole prompt, as
// vLLM's total_input_len = prefix_len + input_len. (vLLM's --random-range-ratio varies only
// input_len and output_len, never the prefix; we have no range ratio: every length is exact.)
//
// Multi-turn (--multi-turn T): prompt c * T + k is turn k of conversation c, the new user
// message of that turn; the runner sends it after the history of turns < k (their messages
// and the model's answers). Only turn 0 carries the shared prefix. The server counts turn 0
// as prefix + input_len; later turns' totals depend on the answers, so they are not checked.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "clients/bench/bench_types.h"

namespace attnres::bench {

// The server's view of a prompt. Implementations must be safe to call from several threads.
class PromptTokenizer {
 public:
  virtual ~PromptTokenizer() = default;
  // Tokens the server will count for `text` sent as the prompt (usage.prompt_tokens).
  virtual int count_prompt(const std::string& text) = 0;
  // The token ids of `text` alone (no special tokens, no template): what truncation cuts.
  virtual std::vector<int32_t> encode_text(const std::string& text) = 0;
  // The text of token ids (special tokens kept).
  virtual std::string decode(const std::vector<int32_t>& ids) = 0;
};

struct DatasetOptions {
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 128;
  int prefix_len = 0;  // tokens of text shared by every prompt (turn 0 of each conversation)
  int turns = 1;       // prompts per conversation; num_prompts counts conversations
  uint64_t seed = 0;
  int threads = 4;  // prompts built in parallel (each costs a few tokenizer round trips)
};

// Throws attnres::Error naming the flag for options make_dataset() would refuse.
void check_dataset_options(const DatasetOptions& options);

// Random pseudo-word text of `words` words; deterministic in `rng_state`, which it advances.
std::string random_words(int words, uint64_t& rng_state);

// The shared prefix: random text that tokenizer.encode_text() makes exactly `prefix_len`
// tokens, from the random stream of `seed` (independent of every prompt's own stream).
std::string make_prefix(PromptTokenizer& tokenizer, int prefix_len, uint64_t seed);

// One prompt of exactly `input_len` tokens as counted by `tokenizer`, built from the random
// stream `(seed, index)`; after a non-empty `prefix` (from make_prefix) the prompt is that text,
// a space and its own words, counted as prefix_len + input_len. Throws attnres::Error naming
// the problem when it cannot (e.g. the chat template alone is longer than input_len).
BenchPrompt make_prompt(PromptTokenizer& tokenizer, int input_len, int output_len, uint64_t seed,
                        int index, const std::string& prefix = "", int prefix_len = 0);

// The text sent for a prompt with history on a text-only API (completions, gRPC): the earlier
// user messages and answers, then this turn's text, separated by blank lines, so that each
// turn's text extends the previous turn's.
std::string flat_prompt_text(const BenchPrompt& prompt);

// The whole data set (num_prompts * turns prompts, conversation-major), built on
// `options.threads` threads; `on_progress(done)` is called as
// prompts complete (from any thread; may be empty).
std::vector<BenchPrompt> make_dataset(PromptTokenizer& tokenizer, const DatasetOptions& options,
                                      const std::function<void(int)>& on_progress = {});

}  // namespace attnres::bench
