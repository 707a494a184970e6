#include "engine/model/depth_bank.h"

#include <algorithm>

#include "engine/core/error.h"

namespace attnres {

Tensor DepthBank::kept_view(Tensor& kept, const Shape& shape, DType dtype) {
  int64_t numel = 1;
  for (int64_t n : shape) numel *= n;
  if (!kept.defined() || kept.numel() < numel || kept.dtype != dtype) {
    kept = Tensor();  // free the smaller buffer first: the peak is the new one alone
    kept = backend_.alloc_kept({std::max<int64_t>(numel, 1)}, dtype);
  }
  return Tensor::wrap(kept.data, shape, dtype, kept.owner, kept.device);
}

void DepthBank::begin(const DepthPlan& plan, const Tensor& partial, bool sharded) {
  rows_ = partial.dim(0);
  width_ = partial.dim(1);
  sharded_ = sharded;
  own_partial_ = partial_ = partial;
  partial_in_bank_ = false;
  open_entry_started_ = false;
  partial_pushed_ahead_ = false;
  bank_ = Tensor();
  phase1_ = Phase1{};
  size_ = 0;
  if (plan.groups.empty()) return;  // a plain model: no bank
  // The bank holds completed representations; entry 0 is the embedding, and the partial
  // starts as the embedding too (docs/ATTNRES.md §2a and §2b).
  const int64_t slots = plan.max_group_size();  // query rows, V streams included
  bank_ = kept_view(kept_bank_, {plan.bank_capacity, rows_, width_}, dtype_);
  phase1_.m = kept_view(kept_m_, {slots, rows_});
  phase1_.s = kept_view(kept_s_, {slots, rows_});
  phase1_.o = kept_view(kept_o_, {slots, rows_, width_});
  push_partial();
}

Tensor DepthBank::entries_from(int first, int filled_end) const {
  ATTNRES_CHECK(size_ >= filled_end, "bank not filled yet");
  return bank_.rows(first, bank_.dim(0));
}

Tensor DepthBank::entries(int first, int end) const {
  ATTNRES_CHECK(size_ >= end, "bank not filled yet");
  return bank_.rows(first, end);
}

void DepthBank::push_partial() {
  Tensor entry = bank_.row(size_++);
  backend_.copy(partial_, entry);
}

void DepthBank::take_back_partial(bool keep_values) {
  if (!partial_in_bank_) return;
  Tensor own = own_partial_;
  if (keep_values) backend_.copy(partial_, own);
  partial_ = own;
  partial_in_bank_ = false;
}

void DepthBank::push_and_reset() {
  if (partial_pushed_ahead_) {  // the last linear wrote the partial into the entry too
    ++size_;
    partial_pushed_ahead_ = false;
  } else {
    push_partial();
  }
  take_back_partial(false);
  backend_.fill_zero(partial_);
}

DepthBank::OutputSlot DepthBank::output_slot(const DepthStep& step, const DepthStep* next,
                                             bool can_fuse_residual, const Tensor& scratch) {
  ATTNRES_CHECK(!partial_pushed_ahead_, "an entry written ahead was never pushed");
  const bool f32_bank = dtype_ == DType::F32;
  Placement& p = placement_ = Placement{};
  p.output_into_bank = step.push_output_after && !sharded_ && f32_bank;
  p.sum_into_bank = step.push_after && !sharded_ && !p.output_into_bank && f32_bank;
  p.fuse_residual = can_fuse_residual && !step.push_output_after && !step.accumulate_output;
  // Updated in place by the fused add (unless the sum goes into the bank instead).
  if (p.fuse_residual && !p.sum_into_bank) take_back_partial(true);
  // Where the add is its own op and exactly one entry is pushed after it by a copy (a bf16
  // bank, or a sharded step's f32 one): the add and the push in one op, reading the pushed
  // row once. The cumulative modes push the new partial, the delta modes the output.
  if (!p.fuse_residual && !p.sum_into_bank && !p.output_into_bank &&
      step.push_after != step.push_output_after) {
    p.fused_push = step.push_after ? Backend::PushedRow::Sum : Backend::PushedRow::Addend;
  }
  // A bf16 bank's block boundary (2b): the next step pushes the partial this step's fused
  // add writes, before anything changes it (its mix only reads it), and this step pushes
  // nothing itself, so the entry is the next one. Only a bf16 bank, whose push is a rounding
  // pass of its own (a launch on CUDA); an f32 bank's push stays the plain copy.
  p.push_ahead = !f32_bank && !sharded_ && p.fuse_residual && !p.sum_into_bank &&
                 !p.output_into_bank && !p.fused_push && !step.push_after &&
                 !step.push_output_after && !step.commit_open_entry && next != nullptr &&
                 next->push_and_reset_after_mix;
  OutputSlot slot;
  if (p.push_ahead) slot.entry = next_entry();
  slot.out = p.output_into_bank || p.sum_into_bank ? next_entry()
             : p.fuse_residual                     ? partial_
                                                   : scratch;
  slot.residual = p.fuse_residual ? &partial_ : nullptr;
  return slot;
}

void DepthBank::add_output(const DepthStep& step, const Tensor& out) {
  const Placement& p = placement_;
  if (p.sum_into_bank) {  // the output was written into the next entry: add the partial there
    Tensor entry = bank_.row(size_++);
    // out + partial: the same bits as partial + out
    if (!p.fuse_residual) backend_.add_inplace(entry, partial_);
    partial_ = entry;
    partial_in_bank_ = true;
  } else {
    take_back_partial(true);
    if (p.fused_push) {
      Tensor entry = bank_.row(size_++);
      backend_.add_inplace_push(partial_, out, entry, *p.fused_push);
    } else {
      if (!p.fuse_residual) backend_.add_inplace(partial_, out);
      if (step.push_after) push_partial();
    }
  }
  if (step.push_output_after && p.fused_push != Backend::PushedRow::Addend) {
    // The delta modes: the sublayer output itself is a source.
    Tensor entry = bank_.row(size_++);
    if (!p.output_into_bank) backend_.copy(out, entry);
  }
  if (step.accumulate_output) accumulate(out);
  if (step.commit_open_entry) commit_open_entry();
  partial_pushed_ahead_ = p.push_ahead;
}

Tensor DepthBank::open_entry() {
  return dtype_ == DType::F32 ? next_entry() : kept_view(kept_open_entry_, {rows_, width_});
}

void DepthBank::accumulate(const Tensor& out) {
  Tensor entry = open_entry();
  if (open_entry_started_) {
    backend_.add_inplace(entry, out);
  } else {  // the kept buffer holds an earlier step's values: the first output overwrites
    backend_.copy(out, entry);
    open_entry_started_ = true;
  }
}

void DepthBank::commit_open_entry() {
  if (dtype_ != DType::F32) {
    Tensor entry = next_entry();
    backend_.copy(open_entry(), entry);
  }
  ++size_;
  open_entry_started_ = false;
}

}  // namespace attnres
