#include "engine/sample/constraint_matcher.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "engine/core/error.h"
#include "engine/sample/compiled_constraint.h"
#include "engine/sample/token_bitmask.h"

namespace attnres {

struct ConstraintMatcher::Xgrammar {
  explicit Xgrammar(const CompiledConstraint& compiled)
      : matcher(compiled.grammar, compiled.stop_ids) {}
  xgrammar::GrammarMatcher matcher;
};

ConstraintMatcher::ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled,
                                     std::optional<int32_t> enforce_after_token)
    : xgrammar_(std::make_unique<Xgrammar>(*compiled)),
      enforce_after_token_(enforce_after_token),
      enforcing_(!enforce_after_token.has_value()),
      rows_(compiled->rows),
      mask_(static_cast<size_t>(token_bitmask_words(compiled->rows)), 0) {}

ConstraintMatcher::~ConstraintMatcher() = default;
ConstraintMatcher::ConstraintMatcher(ConstraintMatcher&&) noexcept = default;
ConstraintMatcher& ConstraintMatcher::operator=(ConstraintMatcher&&) noexcept = default;

void ConstraintMatcher::compute_mask() noexcept {
  if (!enforcing_ || mask_ready_) return;
  mask_ready_ = true;
  mask_error_.clear();
  try {
    // xgrammar writes into a DLPack view of our buffer: [1, words] int32 on the CPU.
    int64_t shape[2] = {1, static_cast<int64_t>(mask_.size())};
    DLTensor tensor{};
    tensor.data = mask_.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 2;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = shape;
    tensor.strides = nullptr;
    tensor.byte_offset = 0;
    xgrammar_->matcher.FillNextTokenBitmask(&tensor);
    if (!any_token_allowed(mask_, rows_)) {
      mask_error_ = "the output constraint allows no next token (the grammar dead-ended)";
    }
  } catch (const std::exception& e) {
    mask_error_ = std::string("the output constraint's token mask failed: ") + e.what();
  }
}

void ConstraintMatcher::apply(std::span<float> logits) {
  if (!enforcing_) return;
  compute_mask();
  check_mask();
  apply_token_bitmask(logits, mask_);
}

void ConstraintMatcher::write_mask(std::span<int32_t> words) noexcept {
  compute_mask();
  const bool usable = enforcing_ && mask_error_.empty() && words.size() == mask_.size();
  if (usable) {
    std::copy(mask_.begin(), mask_.end(), words.begin());
  } else {
    std::fill(words.begin(), words.end(), 0);
  }
}

void ConstraintMatcher::check_mask() const {
  if (enforcing_ && !mask_error_.empty()) throw Error(mask_error_);
}

void ConstraintMatcher::accept(int32_t token) {
  if (!enforcing_) {
    if (enforce_after_token_ && token == *enforce_after_token_) enforcing_ = true;
    return;
  }
  mask_ready_ = false;
  if (!xgrammar_->matcher.AcceptToken(token)) {
    throw Error("the output constraint rejects token id " + std::to_string(token) +
                " (no token both the constraint and the other sampling settings allow, e.g. "
                "min_tokens or stop_token_ids, remained)");
  }
}

bool ConstraintMatcher::terminated() const {
  return enforcing_ && xgrammar_->matcher.IsTerminated();
}

}  // namespace attnres
