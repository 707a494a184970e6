// One sequence's structured-output state: where its output stands in the compiled grammar
// (constraint_compiler.h), the allowed-token bitmask for its next token, and the check of each
// sampled token. Lives with the sequence's sampler (SequenceOutput), so it survives preemption
// (recompute re-runs the forward over tokens the matcher already accepted, and samples nothing
// until the output resumes) and prefix-cache hits (which only skip prompt forwards); each of
// n choices has its own.
//
// The engine computes the next token's mask while the forward runs (compute_mask in the gap
// between launch and collect, engine_core.h) and applies it to the logits before sampling.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/sample/constraint_compiler.h"

namespace attnres {

class ConstraintMatcher {
 public:
  // enforce_after_token: the constraint starts after this token has been generated (the end of
  // the reasoning); unset: from the first token.
  ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled,
                    std::optional<int32_t> enforce_after_token);
  ~ConstraintMatcher();
  ConstraintMatcher(ConstraintMatcher&&) noexcept;
  ConstraintMatcher& operator=(ConstraintMatcher&&) noexcept;

  // Whether the next token is constrained.
  bool enforcing() const { return enforcing_; }
  // Computes the next token's bitmask when enforcing and not yet computed since the last
  // accept(); never throws (a failure is kept and reported by apply()).
  void compute_mask() noexcept;
  // logits [rows]: ids the constraint forbids become -inf (computing the mask if needed). Throws
  // attnres::Error when the constraint allows no token here (it dead-ended).
  void apply(std::span<float> logits);
  // The device path (SampleRow::bitmask_row): computes the mask if needed and copies it into
  // `words` (mask().size() of them), or zeros (nothing allowed) when it failed; check_mask()
  // then reports the failure. Never throws.
  void write_mask(std::span<int32_t> words) noexcept;
  // Throws what apply() throws when the computed mask failed or allows no token; nothing when
  // not enforcing.
  void check_mask() const;
  // The sampled token. Throws attnres::Error when the constraint rejects it (what the mask
  // allowed, further narrowed by min_tokens or stop settings, left nothing it accepts).
  void accept(int32_t token);
  // The grammar is complete and has accepted a stop token: nothing more may be generated.
  bool terminated() const;

  // The last computed mask (token_bitmask.h layout), for tests and the device path.
  std::span<const int32_t> mask() const { return mask_; }

 private:
  struct Xgrammar;
  std::unique_ptr<Xgrammar> xgrammar_;
  std::optional<int32_t> enforce_after_token_;
  bool enforcing_ = false;
  bool mask_ready_ = false;
  std::string mask_error_;
  int32_t rows_ = 0;
  std::vector<int32_t> mask_;
};

}  // namespace attnres
