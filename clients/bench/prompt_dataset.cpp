#include "clients/bench/prompt_dataset.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "engine/core/error.h"

namespace attnres::bench {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Attempts per prompt: adjustments of one text, and fresh texts. Convergence normally takes
// one or two adjustments; the limits only stop a tokenizer that never agrees with itself.
constexpr int kAdjustments = 16;
constexpr int kRebuilds = 4;

}  // namespace

std::string random_words(int words, uint64_t& rng_state) {
  static constexpr const char* kOnsets[] = {
      "b", "c", "d",  "f",  "g",  "h",  "j",  "k",  "l",  "m",  "n",  "p",  "r",  "s",  "t",  "v",
      "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr", "qu", ""};
  static constexpr const char* kNuclei[] = {"a", "e", "i", "o", "u", "ai", "ea", "ou"};
  static constexpr const char* kCodas[] = {"", "", "", "n", "r", "s", "t", "l", "m", "nd", "st"};
  std::string text;
  for (int w = 0; w < words; ++w) {
    const uint64_t r = splitmix64(rng_state);
    if (!text.empty()) text += ' ';
    const int syllables = 1 + static_cast<int>(r % 3);
    std::string word;
    uint64_t bits = r >> 2;
    for (int s = 0; s < syllables; ++s) {
      word += kOnsets[bits % std::size(kOnsets)];
      bits /= std::size(kOnsets);
      word += kNuclei[bits % std::size(kNuclei)];
      bits /= std::size(kNuclei);
      word += kCodas[bits % std::size(kCodas)];
      bits /= std::size(kCodas);
    }
    if (bits % 10 == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
    text += word;
    const uint64_t punct = (r >> 56) % 16;
    if (punct == 0) text += '.';
    if (punct == 1) text += ',';
  }
  return text;
}

namespace {

// Random words after `head` until count(text) == target, the overshoot cut at the token level
// (so never into the head: a cut that changes the head's text is retried with fresh words).
// Returns "" when the tokenizer never agreed. `own_target` is the part the words must supply
// besides the head; the error names `flag` when the server's overhead alone exceeds it.
template <typename Count>
std::string fit_text(PromptTokenizer& tokenizer, const Count& count, const std::string& head,
                     int target, int own_target, const std::string& flag, uint64_t& state) {
  const std::string lead = head.empty() ? "" : head + ' ';
  for (int rebuild = 0; rebuild < kRebuilds; ++rebuild) {
    std::string text = lead + random_words(std::max(1, own_target / 2), state);
    for (int step = 0; step < kAdjustments; ++step) {
      const int counted = count(text);
      if (counted == target) return text;
      if (counted < target) {
        // Each word adds at least one token; ask for about half the gap to overshoot rarely.
        text += ' ' + random_words(std::max(1, (target - counted) / 2), state);
        continue;
      }
      std::vector<int32_t> ids = tokenizer.encode_text(text);
      const int overhead = counted - static_cast<int>(ids.size());  // special / template tokens
      if (overhead >= own_target) {
        throw Error(flag + " " + std::to_string(own_target) +
                    " is too short: the server counts " + std::to_string(overhead) +
                    " tokens around any prompt (special tokens or the chat template)");
      }
      ids.resize(static_cast<size_t>(target - overhead));
      text = tokenizer.decode(ids);
      if (text.compare(0, lead.size(), lead) != 0) break;  // the cut reached the head
    }
  }
  return "";
}

uint64_t stream_state(uint64_t seed, uint64_t salt) {
  uint64_t state = seed;
  return splitmix64(state) ^ (0x632be59bd9b4e019ull * salt);
}

}  // namespace

std::string make_prefix(PromptTokenizer& tokenizer, int prefix_len, uint64_t seed) {
  if (prefix_len < 1) throw Error("--random-prefix-len must be >= 1");
  // Salt 0: prompt i uses i + 1, so the prefix's words are no prompt's own words.
  uint64_t state = stream_state(seed, 0);
  auto count = [&](const std::string& text) {
    return static_cast<int>(tokenizer.encode_text(text).size());
  };
  std::string text =
      fit_text(tokenizer, count, "", prefix_len, prefix_len, "--random-prefix-len", state);
  if (text.empty()) {
    throw Error("--random-prefix-len " + std::to_string(prefix_len) +
                ": could not build a prefix that the server's tokenizer counts as exactly that");
  }
  return text;
}

BenchPrompt make_prompt(PromptTokenizer& tokenizer, int input_len, int output_len, uint64_t seed,
                        int index, const std::string& prefix, int prefix_len) {
  if (input_len < 1) throw Error("--random-input-len must be >= 1");
  if (output_len < 1) throw Error("--random-output-len must be >= 1");
  uint64_t state = stream_state(seed, static_cast<uint64_t>(index + 1));
  const int target = prefix_len + input_len;
  auto count = [&](const std::string& text) { return tokenizer.count_prompt(text); };
  std::string text =
      fit_text(tokenizer, count, prefix, target, input_len, "--random-input-len", state);
  if (text.empty()) {
    throw Error("could not build a prompt that the server's tokenizer counts as exactly " +
                std::to_string(target) + " tokens (prompt " + std::to_string(index) + ")");
  }
  return {text, target, output_len, {}};
}

std::string flat_prompt_text(const BenchPrompt& prompt) {
  std::string text;
  for (const std::string& part : prompt.history) text += part + "\n\n";
  return text + prompt.text;
}

void check_dataset_options(const DatasetOptions& options) {
  if (options.num_prompts < 1) throw Error("--num-prompts must be >= 1");
  if (options.input_len < 1) throw Error("--random-input-len must be >= 1");
  if (options.output_len < 1) throw Error("--random-output-len must be >= 1");
  if (options.prefix_len < 0) throw Error("--random-prefix-len must be >= 0");
  if (options.turns < 1) throw Error("--multi-turn must be >= 1");
}

std::vector<BenchPrompt> make_dataset(PromptTokenizer& tokenizer, const DatasetOptions& options,
                                      const std::function<void(int)>& on_progress) {
  check_dataset_options(options);
  const int n = options.num_prompts * options.turns;
  const std::string prefix =
      options.prefix_len > 0 ? make_prefix(tokenizer, options.prefix_len, options.seed) : "";
  std::vector<BenchPrompt> prompts(n);
  std::atomic<int> next{0}, done{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    for (int i = next++; i < n; i = next++) {
      try {
        const bool first_turn = i % options.turns == 0;  // only turn 0 carries the prefix
        prompts[i] = make_prompt(tokenizer, options.input_len, options.output_len, options.seed, i,
                                 first_turn ? prefix : "", first_turn ? options.prefix_len : 0);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;  // stop the other workers early
        return;
      }
      const int d = ++done;
      if (on_progress) on_progress(d);
    }
  };
  const int threads = std::clamp(options.threads, 1, n);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return prompts;
}

}  // namespace attnres::bench
