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

BenchPrompt make_prompt(PromptTokenizer& tokenizer, int input_len, int output_len, uint64_t seed,
                        int index) {
  if (input_len < 1) throw Error("--random-input-len must be >= 1");
  if (output_len < 1) throw Error("--random-output-len must be >= 1");
  uint64_t state = seed;
  state = splitmix64(state) ^ (0x632be59bd9b4e019ull * static_cast<uint64_t>(index + 1));
  for (int rebuild = 0; rebuild < kRebuilds; ++rebuild) {
    std::string text = random_words(std::max(1, input_len / 2), state);
    for (int step = 0; step < kAdjustments; ++step) {
      const int count = tokenizer.count_prompt(text);
      if (count == input_len) return {text, input_len, output_len};
      if (count < input_len) {
        // Each word adds at least one token; ask for about half the gap to overshoot rarely.
        text += ' ' + random_words(std::max(1, (input_len - count) / 2), state);
        continue;
      }
      std::vector<int32_t> ids = tokenizer.encode_text(text);
      const int overhead = count - static_cast<int>(ids.size());  // special / template tokens
      if (overhead >= input_len) {
        throw Error("--random-input-len " + std::to_string(input_len) +
                    " is too short: the server counts " + std::to_string(overhead) +
                    " tokens around any prompt (special tokens or the chat template)");
      }
      ids.resize(static_cast<size_t>(input_len - overhead));
      text = tokenizer.decode(ids);
    }
  }
  throw Error("could not build a prompt that the server's tokenizer counts as exactly " +
              std::to_string(input_len) + " tokens (prompt " + std::to_string(index) + ")");
}

void check_dataset_options(const DatasetOptions& options) {
  if (options.num_prompts < 1) throw Error("--num-prompts must be >= 1");
  if (options.input_len < 1) throw Error("--random-input-len must be >= 1");
  if (options.output_len < 1) throw Error("--random-output-len must be >= 1");
}

std::vector<BenchPrompt> make_dataset(PromptTokenizer& tokenizer, const DatasetOptions& options,
                                      const std::function<void(int)>& on_progress) {
  check_dataset_options(options);
  std::vector<BenchPrompt> prompts(options.num_prompts);
  std::atomic<int> next{0}, done{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    for (int i = next++; i < options.num_prompts; i = next++) {
      try {
        prompts[i] = make_prompt(tokenizer, options.input_len, options.output_len, options.seed, i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = options.num_prompts;  // stop the other workers early
        return;
      }
      const int d = ++done;
      if (on_progress) on_progress(d);
    }
  };
  const int threads = std::clamp(options.threads, 1, options.num_prompts);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return prompts;
}

}  // namespace attnres::bench
