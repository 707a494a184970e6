// Steps for the decode-graph tests (here, on the CPU, and
// tests/cpp/kernels/cuda/cuda_decode_graphs_test.cpp): one prefill step of every sequence,
// then decode rounds, each a step of one token for each sequence the round names.
#pragma once

#include <random>
#include <span>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/sched/batch_builder.h"
#include "engine/sched/block_manager.h"

namespace attnres::test {

// Rounds of 1..9 sequences, each size a few times in a row (so its bucket warms up, records
// and replays), with the contexts growing across block boundaries as they go.
inline std::vector<std::vector<int>> decode_rounds() {
  std::vector<std::vector<int>> rounds;
  auto repeat = [&](std::vector<int> seqs, int times) {
    for (int i = 0; i < times; ++i) rounds.push_back(seqs);
  };
  repeat({0}, 4);
  repeat({0, 1, 2}, 4);
  repeat({3, 4}, 3);
  repeat({0, 1, 2, 3, 4, 5, 6, 7, 8}, 2);
  repeat({5, 6, 7, 8, 1}, 4);
  repeat({2}, 3);
  repeat({0, 1, 2, 3, 4, 5, 6, 7}, 5);
  repeat({8, 0, 4}, 3);
  return rounds;
}

class DecodeSchedule {
 public:
  // num_seqs sequences with prompts of 1..max_prompt tokens.
  DecodeSchedule(int vocab, int blocks, int block_size, int num_seqs, int max_prompt)
      : vocab_(vocab), block_size_(block_size), blocks_(blocks, block_size), seqs_(num_seqs) {
    for (int s = 0; s < num_seqs; ++s) prompts_.push_back(ids(1 + (s * 7) % max_prompt));
  }

  size_t steps(const std::vector<std::vector<int>>& rounds) const { return rounds.size() + 1; }

  // The prefill step first (its logit rows: each sequence's last token), then rounds[k].
  StepBatch next(const std::vector<std::vector<int>>& rounds) {
    StepBatch batch;
    if (step_ == 0) {
      for (size_t s = 0; s < seqs_.size(); ++s) {
        batch.logit_rows.push_back(add(batch, static_cast<int>(s), prompts_[s]));
      }
    } else {
      for (int s : rounds.at(step_ - 1)) batch.logit_rows.push_back(add(batch, s, ids(1)));
    }
    ++step_;
    return batch;
  }

 private:
  std::vector<int32_t> ids(int n) {
    std::vector<int32_t> out(n);
    for (int32_t& id : out) id = static_cast<int32_t>(rng_() % vocab_);
    return out;
  }
  int32_t add(StepBatch& batch, int s, const std::vector<int32_t>& tokens) {
    blocks_.append(seqs_[s], static_cast<int>(tokens.size()));
    return add_to_batch(batch.meta, seqs_[s], tokens, block_size_);
  }

  int vocab_, block_size_;
  BlockManager blocks_;
  std::vector<SequenceBlocks> seqs_;
  std::vector<std::vector<int32_t>> prompts_;
  std::mt19937_64 rng_{11};
  size_t step_ = 0;
};

}  // namespace attnres::test
