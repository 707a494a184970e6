// A ModelRunner that runs every step on another one, then replaces the next-token logits so
// that every sequence's answer is a given token script: how the end-to-end tests make a
// random-weight model write what a trained one would (a tool call, a <think> block) and check
// what the server does with it; everything after the forward (sampling, detokenizing, stop
// handling, parsing, the HTTP shapes) is the real server's. Enabled only by the
// ATTNRES_TEST_SCRIPTED_REPLY environment variable (the reply's text, tokenized with the
// model's tokenizer; it should end with the end-of-sequence token), which no user sets.
//
// The runner sees no sequence ids, so it follows each sequence by where its next token goes:
// a logits row at position p whose token is t continues the script from the entry recorded for
// (p, t) when the previous step emitted t there, and starts it anew otherwise (a prompt's end).
// Choices of one request (same prompt, same script) share their entries.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/tokenizer/tokenizer.h"

namespace attnres::cli {

class ScriptedReplyRunner : public ModelRunner {
 public:
  ScriptedReplyRunner(std::unique_ptr<ModelRunner> inner, std::vector<int32_t> script)
      : inner_(std::move(inner)), script_(std::move(script)) {}

  // The runner to use: `inner` itself, unless ATTNRES_TEST_SCRIPTED_REPLY is set.
  static std::unique_ptr<ModelRunner> wrap_if_requested(std::unique_ptr<ModelRunner> inner,
                                                        const Tokenizer& tokenizer) {
    const char* reply = std::getenv("ATTNRES_TEST_SCRIPTED_REPLY");
    if (!reply || !*reply) return inner;
    std::vector<int32_t> script = tokenizer.encode(reply, /*add_special_tokens=*/false);
    if (script.empty()) return inner;
    return std::make_unique<ScriptedReplyRunner>(std::move(inner), std::move(script));
  }

  int vocab_size() const override { return inner_->vocab_size(); }
  DepthAttentionLayout depth_attention_layout() const override {
    return inner_->depth_attention_layout();
  }
  // The scripted logits are on the host: the engine samples there.
  bool samples_on_device() const override { return false; }

  void execute(const StepBatch& batch, StepResult& result) override {
    inner_->execute(batch, result);
    const size_t vocab = static_cast<size_t>(vocab_size());
    std::map<Place, Progress> next_progress;
    for (size_t k = 0; k < batch.logit_rows.size(); ++k) {
      const size_t row = static_cast<size_t>(batch.logit_rows[k]);
      const Place at{batch.meta.positions[row], batch.meta.token_ids[row]};
      size_t next = 0;
      if (auto it = progress_.find(at); it != progress_.end()) {
        next = it->second.next;
        if (--it->second.sequences == 0) progress_.erase(it);
      }
      const int32_t token = script_[std::min(next, script_.size() - 1)];
      float* logits = result.logits.data() + k * vocab;
      std::fill(logits, logits + vocab, kUnchosen);
      logits[token] = 0.0f;
      if (next + 1 < script_.size()) {
        Progress& p = next_progress[{at.first + 1, token}];
        p.next = next + 1;
        ++p.sequences;
      }
    }
    for (auto& [place, p] : next_progress) progress_[place] = p;
  }

 private:
  // Far below any real logit, finite so that logprobs stay numbers.
  static constexpr float kUnchosen = -1e9f;

  std::unique_ptr<ModelRunner> inner_;
  const std::vector<int32_t> script_;
  using Place = std::pair<int32_t, int32_t>;  // (position, token)
  struct Progress {
    size_t next = 0;    // the script index to emit there
    int sequences = 0;  // how many sequences are there (the n choices of a request)
  };
  std::map<Place, Progress> progress_;
};

}  // namespace attnres::cli
