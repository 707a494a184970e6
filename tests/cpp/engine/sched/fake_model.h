// A fake forward for the scheduler tests that still depends on the paged KV cache: it keeps a
// slot -> token "cache", writes each step's tokens at batch.slot_mapping, and computes every
// requested row's next token from the context it reads back through the block table. A
// bookkeeping bug (a wrong slot, a block shared by two live sequences, a preempted sequence
// not fully recomputed) changes the tokens, so "same tokens as the reference" is a real check.
//
// The reference (reference_tokens) computes the same function on the plain token list,
// independently of the scheduler: what the request generates when it runs alone.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/runner/model_runner.h"

namespace attnres::testing {

inline constexpr int kVocab = 64;
inline constexpr int32_t kEos = kVocab - 1;  // never produced by next_token()

// The "model": a position-weighted checksum of the context. Never kEos.
inline int32_t next_token(std::span<const int32_t> context) {
  int64_t sum = 7;
  for (size_t i = 0; i < context.size(); ++i) sum += (static_cast<int64_t>(i) + 1) * context[i];
  return static_cast<int32_t>(sum % (kVocab - 1));
}

// What greedy decoding of `max_tokens` tokens gives for `prompt` when run alone.
inline std::vector<int32_t> reference_tokens(std::vector<int32_t> prompt, int max_tokens) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    out.push_back(next_token(prompt));
    prompt.push_back(out.back());
  }
  return out;
}

// The fake "depth-attention weights" of the forward at the last position of `context`: cell
// (sublayer k, column c) is a checksum of the context mixed with k and c, and NaN for c > k %
// cols (so NaN cells must survive the engine's averaging as NaN).
inline float fake_depth_weight(std::span<const int32_t> context, int k, int c, int cols) {
  if (c > k % cols) return std::numeric_limits<float>::quiet_NaN();
  int64_t sum = 3;
  for (size_t i = 0; i < context.size(); ++i) sum += (static_cast<int64_t>(i) + 2) * context[i];
  return static_cast<float>((sum + 7 * k + 5 * c) % 101) / 100.0f;
}

class FakeRunner : public ModelRunner {
 public:
  FakeRunner(int num_blocks, int block_size)
      : block_size_(block_size), slots_(static_cast<size_t>(num_blocks) * block_size, -1) {}

  int vocab_size() const override { return kVocab; }

  void execute(const StepBatch& step, StepResult& result) override {
    const BatchMeta& batch = step.meta;
    const std::vector<int32_t>& logit_rows = step.logit_rows;
    if (fail_on_call_ >= 0 && calls_ == fail_on_call_) throw std::runtime_error("device lost");
    ++calls_;
    batch_sizes_.push_back(batch.num_tokens);
    logit_row_counts_.push_back(static_cast<int>(logit_rows.size()));
    depth_row_counts_.push_back(static_cast<int>(step.depth_rows.size()));
    for (int t = 0; t < batch.num_tokens; ++t)
      slots_.at(batch.slot_mapping[t]) = batch.token_ids[t];
    std::vector<float>& logits = result.logits;
    logits.assign(logit_rows.size() * kVocab, 0.0f);
    for (size_t i = 0; i < logit_rows.size(); ++i) {
      const int row = logit_rows[i];
      int s = 0;
      while (batch.query_start[s + 1] <= row) ++s;
      const int position = batch.positions[row];
      if (allow_inner_rows_) {
        EXPECT_LT(position, batch.context_len[s]) << "logits requested beyond the sequence";
      } else {
        EXPECT_EQ(position + 1, batch.context_len[s]) << "logits requested for a non-final row";
      }
      const std::vector<int32_t> context = context_of(batch, row);
      const int32_t next =
          eos_after_ > 0 && position + 1 >= eos_after_ ? kEos : next_token(context);
      fill_row(std::span(logits).subspan(i * kVocab, kVocab), next);
      if (edit_row_) edit_row_(context, std::span(logits).subspan(i * kVocab, kVocab));
    }
    result.depth_weights.clear();
    result.sampled_ids.clear();
    if (step.wants_depth_weights()) {
      EXPECT_FALSE(depth_layout_.empty()) << "depth weights asked of a runner without a layout";
      const int rows = depth_layout_.rows(), cols = depth_layout_.cols();
      for (const int32_t row : step.depth_rows) {
        const std::vector<int32_t> context = context_of(batch, row);
        for (int k = 0; k < rows; ++k)
          for (int c = 0; c < cols; ++c)
            result.depth_weights.push_back(fake_depth_weight(context, k, c, cols));
      }
    }
  }

  // Called on every logits row after it is filled, with the row's context: lets a test make
  // the model misbehave for some sequences (NaN, a padding id that would win).
  using RowEditor = std::function<void(const std::vector<int32_t>& context, std::span<float> row)>;
  void set_row_editor(RowEditor edit) { edit_row_ = std::move(edit); }

  // Depth-attention weights: a runner with a layout of rows x cols reports
  // fake_depth_weight() of each requested row's context.
  void set_depth_layout(int rows, int cols) {
    depth_layout_ = {};
    for (int k = 0; k < rows; ++k) {
      depth_layout_.sublayers.push_back("sublayer " + std::to_string(k));
      depth_layout_.row_sources.push_back(k % cols + 1);
    }
    for (int c = 0; c < cols; ++c) depth_layout_.sources.push_back("source " + std::to_string(c));
  }
  DepthAttentionLayout depth_attention_layout() const override { return depth_layout_; }
  // Per execute: how many depth rows it was asked for.
  const std::vector<int>& depth_row_counts() const { return depth_row_counts_; }

  // Make the logits a smooth function of the chosen token, so seeded random sampling has a
  // real distribution to draw from (the chosen token is still the argmax).
  void set_smooth_logits(bool smooth) { smooth_ = smooth; }
  // Emit kEos for the token at sequence position >= n (context length n).
  void set_eos_after(int n) { eos_after_ = n; }
  void set_fail_on_call(int call) { fail_on_call_ = call; }
  // Prompt logprobs ask for the logits of rows before a chunk's last one.
  void set_allow_inner_rows(bool allow) { allow_inner_rows_ = allow; }
  const std::vector<int>& batch_sizes() const { return batch_sizes_; }
  const std::vector<int>& logit_row_counts() const { return logit_row_counts_; }

  // The logits execute() gives a row whose context predicts `chosen`.
  std::vector<float> logits_for(int32_t chosen) const {
    std::vector<float> row(kVocab);
    fill_row(row, chosen);
    return row;
  }

 private:
  // The tokens of `row`'s sequence up to and including it, read back through the cache.
  std::vector<int32_t> context_of(const BatchMeta& batch, int row) const {
    int s = 0;
    while (batch.query_start[s + 1] <= row) ++s;
    std::vector<int32_t> context;
    for (int p = 0; p <= batch.positions[row]; ++p) {
      const int32_t block = batch.block_tables[s].at(p / block_size_);
      context.push_back(slots_.at(static_cast<size_t>(block) * block_size_ + p % block_size_));
    }
    return context;
  }

  void fill_row(std::span<float> row, int32_t chosen) const {
    for (int v = 0; v < kVocab; ++v) {
      row[v] = smooth_ ? static_cast<float>((v * 37 + chosen * 11) % 13) * 0.25f : 0.0f;
    }
    row[chosen] = smooth_ ? 4.0f : 10.0f;
  }

  int block_size_;
  std::vector<int32_t> slots_;
  bool smooth_ = false;
  bool allow_inner_rows_ = false;
  int eos_after_ = 0;
  int fail_on_call_ = -1;
  int calls_ = 0;
  std::vector<int> batch_sizes_;
  std::vector<int> logit_row_counts_;
  std::vector<int> depth_row_counts_;
  DepthAttentionLayout depth_layout_;
  RowEditor edit_row_;
};

inline std::vector<int32_t> iota_prompt(int length, int32_t first) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i) prompt.push_back((first + i) % (kVocab - 1));
  return prompt;
}

}  // namespace attnres::testing
