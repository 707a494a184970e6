// Prompt building against fake tokenizers. The awkward one re-tokenizes a cut word
// differently (words of even length split into 2-character tokens, odd ones into 3), so a
// prompt cut to N tokens can come back as N + 1: the builder must notice and adjust, as the
// real BPE tokenizers require (vLLM's example: GPT-2's [6880, 6881] re-encodes to 3 tokens).
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "clients/bench/prompt_dataset.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

class AwkwardTokenizer : public PromptTokenizer {
 public:
  explicit AwkwardTokenizer(int overhead) : overhead_(overhead) {}

  int count_prompt(const std::string& text) override {
    ++calls_;
    return static_cast<int>(encode_text(text).size()) + overhead_;
  }

  std::vector<int32_t> encode_text(const std::string& text) override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      // A "word" is an optional leading space plus the non-space characters after it.
      size_t end = i + (text[i] == ' ' ? 1 : 0);
      while (end < text.size() && text[end] != ' ') ++end;
      const std::string word = text.substr(i, end - i);
      const size_t step = word.size() % 2 == 0 ? 2 : 3;
      for (size_t j = 0; j < word.size(); j += step) ids.push_back(id(word.substr(j, step)));
      i = end;
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string text;
    for (int32_t i : ids) text += pieces_.at(i);
    return text;
  }

  int calls() const { return calls_; }

 private:
  int32_t id(const std::string& piece) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, added] = ids_.emplace(piece, static_cast<int32_t>(pieces_.size()));
    if (added) pieces_.push_back(piece);
    return it->second;
  }

  int overhead_;
  std::atomic<int> calls_{0};
  std::mutex mutex_;
  std::map<std::string, int32_t> ids_;
  std::vector<std::string> pieces_;
};

DatasetOptions options_of(int num_prompts, int input_len, int output_len, uint64_t seed,
                          int prefix_len = 0, int turns = 1) {
  DatasetOptions options;
  options.num_prompts = num_prompts;
  options.input_len = input_len;
  options.output_len = output_len;
  options.seed = seed;
  options.prefix_len = prefix_len;
  options.turns = turns;
  return options;
}

TEST(PromptDataset, ExactLengthsWithAnAwkwardTokenizer) {
  for (int overhead : {0, 1, 7}) {
    AwkwardTokenizer tokenizer(overhead);
    for (int target : {8, 9, 17, 64, 300}) {
      for (int index = 0; index < 5; ++index) {
        const BenchPrompt p = make_prompt(tokenizer, target, 5, 3, index);
        EXPECT_EQ(tokenizer.count_prompt(p.text), target) << overhead << " " << target;
        EXPECT_EQ(p.prompt_len, target);
        EXPECT_EQ(p.output_len, 5);
      }
    }
  }
}

TEST(PromptDataset, OneTokenPrompt) {
  AwkwardTokenizer tokenizer(0);
  EXPECT_EQ(tokenizer.count_prompt(make_prompt(tokenizer, 1, 1, 0, 0).text), 1);
}

TEST(PromptDataset, DeterministicPerSeedAndIndexAndDistinct) {
  AwkwardTokenizer tokenizer(1);
  const std::string a = make_prompt(tokenizer, 40, 4, 11, 0).text;
  EXPECT_EQ(make_prompt(tokenizer, 40, 4, 11, 0).text, a);
  EXPECT_NE(make_prompt(tokenizer, 40, 4, 11, 1).text, a);
  EXPECT_NE(make_prompt(tokenizer, 40, 4, 12, 0).text, a);
  // Prompts differ from their first word: no shared prefix a server could cache.
  std::set<std::string> first_words;
  for (int i = 0; i < 20; ++i) {
    const std::string text = make_prompt(tokenizer, 40, 4, 11, i).text;
    first_words.insert(text.substr(0, text.find(' ')));
  }
  EXPECT_GE(first_words.size(), 15u);
}

TEST(PromptDataset, ParallelBuildEqualsSequential) {
  AwkwardTokenizer tokenizer(2);
  DatasetOptions options = options_of(24, 33, 7, 9);
  options.threads = 4;
  int progress_calls = 0;
  std::mutex m;
  const std::vector<BenchPrompt> prompts = make_dataset(tokenizer, options, [&](int) {
    std::lock_guard<std::mutex> lock(m);
    ++progress_calls;
  });
  ASSERT_EQ(prompts.size(), 24u);
  EXPECT_EQ(progress_calls, 24);
  for (int i = 0; i < 24; ++i) {
    EXPECT_EQ(prompts[i].text, make_prompt(tokenizer, 33, 7, 9, i).text) << i;
  }
}

TEST(PromptDataset, TooShortForTheTemplateIsAClearError) {
  AwkwardTokenizer tokenizer(7);
  try {
    make_prompt(tokenizer, 7, 4, 0, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--random-input-len 7 is too short"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_prompt(tokenizer, 0, 4, 0, 0), Error);
  EXPECT_THROW(make_prompt(tokenizer, 10, 0, 0, 0), Error);
}

// A tokenizer that never agrees with itself: the builder gives up with an error, not a loop.
class NeverExact : public AwkwardTokenizer {
 public:
  NeverExact() : AwkwardTokenizer(0) {}
  int count_prompt(const std::string& text) override {
    const int count = AwkwardTokenizer::count_prompt(text);
    return count == 20 ? 21 : count;  // 20 is asked for below
  }
};

TEST(PromptDataset, GivesUpOnATokenizerThatNeverConverges) {
  NeverExact tokenizer;
  EXPECT_THROW(make_prompt(tokenizer, 20, 4, 0, 0), Error);
}

TEST(PromptDataset, RandomWordsAreDeterministic) {
  uint64_t a = 5, b = 5;
  EXPECT_EQ(random_words(10, a), random_words(10, b));
  EXPECT_EQ(a, b);
  std::istringstream words(random_words(10, a));
  int count = 0;
  for (std::string w; words >> w;) ++count;
  EXPECT_EQ(count, 10);
}

// --random-prefix-len: every prompt starts with the same text, whose tokens are the same ids
// (what a prefix cache matches), and the server counts prefix + input_len for the whole prompt.
TEST(PromptDataset, SharedPrefixIsIdenticalAndLengthsExact) {
  for (int overhead : {0, 1, 7}) {
    AwkwardTokenizer tokenizer(overhead);
    const std::vector<BenchPrompt> prompts = make_dataset(tokenizer, options_of(12, 17, 3, 4, 40));
    const std::string prefix = make_prefix(tokenizer, 40, 4);
    const std::vector<int32_t> prefix_ids = tokenizer.encode_text(prefix);
    ASSERT_EQ(prefix_ids.size(), 40u);
    std::set<std::string> suffixes;
    for (const BenchPrompt& p : prompts) {
      EXPECT_EQ(p.prompt_len, 57);
      EXPECT_EQ(tokenizer.count_prompt(p.text), 57) << overhead;
      ASSERT_EQ(p.text.compare(0, prefix.size() + 1, prefix + ' '), 0) << p.text;
      const std::vector<int32_t> ids = tokenizer.encode_text(p.text);
      EXPECT_TRUE(std::equal(prefix_ids.begin(), prefix_ids.end(), ids.begin()));
      suffixes.insert(p.text.substr(prefix.size()));
    }
    EXPECT_EQ(suffixes.size(), prompts.size());  // each prompt's own part differs
  }
}

TEST(PromptDataset, PrefixFlagsAreCheckedByName) {
  AwkwardTokenizer tokenizer(0);
  DatasetOptions options;
  options.prefix_len = -1;
  try {
    check_dataset_options(options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--random-prefix-len"), std::string::npos);
  }
  options.prefix_len = 0;
  options.turns = 0;
  EXPECT_THROW(check_dataset_options(options), Error);
  EXPECT_THROW(make_prefix(tokenizer, 0, 0), Error);
}

// --multi-turn: num_prompts conversations of `turns` prompts; only turn 0 has the prefix, and
// a turn sent with its history (flat_prompt_text) extends the previous turn's text.
TEST(PromptDataset, MultiTurnPromptsExtendEachOther) {
  AwkwardTokenizer tokenizer(1);
  const std::vector<BenchPrompt> prompts = make_dataset(tokenizer, options_of(3, 12, 2, 0, 9, 4));
  ASSERT_EQ(prompts.size(), 12u);
  const std::string prefix = make_prefix(tokenizer, 9, 0);
  for (int c = 0; c < 3; ++c) {
    BenchPrompt turn = prompts[c * 4];
    EXPECT_EQ(turn.prompt_len, 21);
    EXPECT_EQ(turn.text.rfind(prefix, 0), 0u);
    std::string previous = flat_prompt_text(turn);
    for (int k = 1; k < 4; ++k) {
      const BenchPrompt& next = prompts[c * 4 + k];
      EXPECT_EQ(next.prompt_len, 12);
      EXPECT_EQ(tokenizer.count_prompt(next.text), 12);
      EXPECT_NE(next.text.rfind(prefix, 0), 0u);  // later turns carry no second prefix
      turn.history.push_back(turn.text);
      turn.history.push_back("answer " + std::to_string(k));
      turn.text = next.text;
      const std::string flat = flat_prompt_text(turn);
      EXPECT_EQ(flat.rfind(previous, 0), 0u) << "turn " << k << " does not extend turn " << k - 1;
      EXPECT_GT(flat.size(), previous.size());
      previous = flat;
    }
  }
}

}  // namespace
}  // namespace attnres::bench
