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
  DatasetOptions options;
  options.num_prompts = 24;
  options.input_len = 33;
  options.output_len = 7;
  options.seed = 9;
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

}  // namespace
}  // namespace attnres::bench
