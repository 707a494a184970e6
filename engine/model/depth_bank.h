// The residual stream of one forward as the depth plan sees it (docs/ATTNRES.md §2): the bank of
// completed representations, the partial being accumulated, delta_block's open entry and the
// Phase-1 state the depth mixes read. The Transformer says what a step does (DepthStep); the
// bank does the bookkeeping: where a sublayer's output goes, when an entry is pushed, and the
// aliasing that saves copies.
//
// Aliasing (an f32 bank, a step not sharded along the sequence):
// - full (and block at a block's end): the sum partial + output is the next bank entry. It is
//   written there directly, and the partial then *is* that entry (a view) until a step
//   changes it in place without pushing, which first takes it back into its own buffer.
// - the delta modes: the sublayer's output is itself the next entry, written there.
// - delta_block: the open entry (the block's summed outputs) is the bank's next entry itself.
// A bf16 bank stores rounded entries, so there the partial and the open entry keep their own
// f32 buffers and are copied (rounded) into the bank when pushed; a sharded step's output
// arrives by reduce-scatter into scratch, so it is copied too. Where the add and a push
// coincide on a copy, Backend::add_inplace_push does both in one pass. And where a bf16
// bank's push_and_reset will push the partial the sublayer's fused residual add writes (2b's
// last sublayer of a block: nothing changes the partial before the next step's mix pushes
// it), that linear writes the entry too (Backend::linear_residual_push), and the push only
// counts it.
//
// The buffers are kept across forwards, grown and never shrunk, each one flat allocation a
// step views in its own shape. Allocated per step they cost a zero-fill and, past glibc's
// mmap threshold, a page fault per 4 KB (67 ms of a 2 s 512-token 0.6B `full` prefill).
// Every entry a step reads was written earlier in that step, so nothing needs clearing
// between steps. Allocated with Backend::alloc_kept: on the CPU in huge pages, where Phase 1
// and Phase 2 read them with fewer TLB misses.
#pragma once

#include <optional>

#include "engine/core/backend.h"
#include "engine/model/depth_plan.h"

namespace attnres {

class DepthBank {
 public:
  // dtype: what the bank stores (F32, or BF16 rounding each entry to nearest even as it is
  // pushed); the partial, the Phase-1 state and the open entry stay f32.
  DepthBank(Backend& backend, DType dtype) : backend_(backend), dtype_(dtype) {}

  // Starts a forward whose residual stream holds `partial` ([rows, d] f32: the embedding of
  // the rows held here). Where the plan mixes, the bank is allocated for `rows` rows and its
  // entry 0 is the embedding. `sharded`: a sequence-parallel step, whose sublayer outputs
  // arrive in scratch (no output is written into the bank directly).
  void begin(const DepthPlan& plan, const Tensor& partial, bool sharded);

  DType dtype() const { return dtype_; }
  size_t bytes() const { return bank_.defined() ? bank_.nbytes() : 0; }
  // The partial: its own buffer, or the bank entry it was last pushed as.
  const Tensor& partial() const { return partial_; }
  // Bank entries [first, capacity), for the ops that take a mix's sources with their count,
  // checked filled up to filled_end.
  Tensor entries_from(int first, int filled_end) const;
  // Bank entries [first, end), checked filled.
  Tensor entries(int first, int end) const;
  // The Phase-1 state: for each query row of a group (one per mixing step, two for delta_v's
  // attention), m and s [slots, rows] and o [slots, rows, d], f32.
  struct Phase1 {
    Tensor m, s, o;
  };
  const Phase1& phase1() const { return phase1_; }

  // 2b's block boundary, after the mix and before the sublayer: bank += [partial]; partial = 0.
  // Where output_slot handed the entry to the previous step's linear, it is already written.
  void push_and_reset();

  // Where a sublayer step writes its output, chosen before it runs. `residual` non-null: the
  // sublayer's last linear adds the residual (the partial) into `out` (Backend::
  // linear_residual), which is then the new partial. `can_fuse_residual`: the backend fuses
  // the add and the output needs no sum over ranks first; the bank then fuses it where the
  // output is read only through that add (not where it is itself a bank entry or summed into
  // the open entry). `next`: the step after this one (null after the last). `entry` defined:
  // the next step's push_and_reset pushes the new partial, so the last linear also writes it
  // into this entry (Backend::linear_residual_push): a bf16 bank, a step not sharded, the
  // residual fused, this step pushing nothing itself.
  struct OutputSlot {
    Tensor out;
    const Tensor* residual = nullptr;
    Tensor entry;
  };
  OutputSlot output_slot(const DepthStep& step, const DepthStep* next, bool can_fuse_residual,
                         const Tensor& scratch);
  // After the sublayer: `out` (its output summed over the ranks; ignored where output_slot
  // fused the residual add) goes into the partial, and the bank grows as the step says.
  void add_output(const DepthStep& step, const Tensor& out);

 private:
  Tensor kept_view(Tensor& kept, const Shape& shape, DType dtype = DType::F32);
  Tensor next_entry() { return bank_.row(size_); }
  void push_partial();
  // Makes the partial its own buffer again (keep_values: with the entry's values).
  void take_back_partial(bool keep_values);
  // delta_block's open entry: the bank's next entry (f32 bank) or an f32 buffer.
  Tensor open_entry();
  void accumulate(const Tensor& out);
  void commit_open_entry();

  Backend& backend_;
  const DType dtype_;
  // Kept across forwards (see above).
  Tensor kept_bank_, kept_m_, kept_s_, kept_o_, kept_open_entry_;

  // This forward's.
  int64_t rows_ = 0, width_ = 0;
  bool sharded_ = false;
  Tensor bank_;   // [capacity, rows, d] in dtype_, undefined for a plan without mixes
  int size_ = 0;  // entries pushed so far
  Phase1 phase1_;
  Tensor own_partial_, partial_;
  bool partial_in_bank_ = false;
  bool open_entry_started_ = false;  // whether the open entry holds a sum yet
  // The next entry holds the partial already (OutputSlot::entry): push_and_reset counts it.
  bool partial_pushed_ahead_ = false;

  // The current step's choice, made in output_slot and carried out in add_output.
  struct Placement {
    bool output_into_bank = false;  // the output is the next bank entry
    bool sum_into_bank = false;     // partial + output is the next bank entry
    bool fuse_residual = false;
    std::optional<Backend::PushedRow> fused_push;  // the add and one push in one op
    bool push_ahead = false;  // the last linear writes the next step's pushed entry too
  };
  Placement placement_;
};

}  // namespace attnres
