// The depth plan (docs/ATTNRES.md §2): every AttnRes variant, and the plain pre-norm residual,
// expressed as data that one forward executes. For each sublayer it says which bank
// entries the depth mix reads, where the bank grows, where the partial resets, and which
// Phase-1 group (docs/ATTNRES.md §3) computes the bank side of its softmax.
//
// Vocabulary: the *bank* is the list of completed representations (bank[0] is the token
// embedding; later entries are snapshots of x, block sums, sublayer outputs or block deltas,
// by mode); the *partial* is the running representation being accumulated (the cumulative
// stream x in 2a and the delta modes, the current block sum p in 2b). Where the partial is a
// source it is the last one, and a bias (when the mode reads one) applies to it alone.
// The open-attnres modes of docs/ATTNRES.md §2d are the same data with more switches: the partial
// not a source and added to the mix (delta modes, pre_gated), a null source prepended, the
// bank read from an offset (first_layer), a second query for the V stream (delta_v), the
// sources gated before the softmax (pre_gated), and the gate after the mix.
#pragma once

#include <string>
#include <vector>

#include "engine/model/model_config.h"

namespace attnres {

enum class SublayerKind { Attention, Mlp, Final };

struct DepthStep {
  SublayerKind kind = SublayerKind::Attention;
  int layer = 0;             // decoder layer (Final: num_layers)
  bool mixes = false;        // false: plain pre-norm, the sublayer input is the partial
  int bank_first = 0;        // first bank entry read (first_layer: 1, layer 0's MLP output)
  int num_bank_sources = 0;  // bank entries [bank_first, bank_first + n) read by the mix
  // The last of those entries that were pushed after the group's Phase 1 ran: Phase 2 merges
  // them (the full-family modes, whose bank grows at every sublayer).
  int num_newer_sources = 0;
  bool partial_is_source = true;  // false in delta modes and pre_gated
  bool adds_partial = false;      // h_mix = partial + mix (delta modes, pre_gated)
  bool null_source = false;       // a learned constant source 0 (delta modes, on request)
  bool pre_gated = false;         // sources become sigmoid(pre_gate x + b) * src
  bool gated = false;             // attnres_gate_type's gate blends x and h_mix after the mix
  int group = -1;                 // Phase-1 group this step's bank logits come from
  int slot = 0;                   // this step's row in its group's Phase-1 outputs
  int value_slot = -1;            // delta_v attention: the V stream's row in the same group
  bool push_and_reset_after_mix = false;  // 2b: bank += [partial]; partial = 0 (before f runs)
  bool push_after = false;                // 2a: bank += [partial] after the output is added
  bool push_output_after = false;         // delta modes: bank += [sublayer output]
  // delta_block: the output is also added into the open bank entry (the block's delta,
  // x - x_at_block_start, summed as it grows); commit_open_entry then makes it bank entry.
  bool accumulate_output = false;
  bool commit_open_entry = false;
};

// Consecutive steps whose bank sources start with the same entries: Phase 1 reads those
// once for all of them, at the first step; what a later step reads beyond them (entries
// pushed since) its Phase 2 merges. Where the bank does not grow inside the group (2b, a
// block of 2a) that is nothing; where it grows at every sublayer (full, delta, delta_v) the
// bank is read once per group instead of once per sublayer.
struct DepthGroup {
  int bank_first = 0;
  int num_bank_sources = 0;  // the shared prefix Phase 1 reads
  std::vector<int> steps;    // indices into DepthPlan::steps, in order
  int num_slots = 0;         // query rows: one per step, two for a delta_v attention step
};

struct DepthPlan {
  AttnResMode mode = AttnResMode::None;
  bool has_final_mix = false;  // 2b: a final mix over bank + partial before the last norm
  bool cumulative = true;      // 2a and §2d (never reset) vs 2b (block sums with reset)
  int layers_per_block = 0;
  int bank_capacity = 1;         // entries the bank reaches, the embedding included
  std::vector<DepthStep> steps;  // 2 per layer, then one Final step
  std::vector<DepthGroup> groups;

  static DepthPlan build(const ModelConfig& config, bool has_final_mix);

  // Most query rows of one group (the Phase-1 output rows to allocate).
  int max_group_size() const;
  // Human-readable listing for `attnres inspect`: per sublayer the sources it reads and
  // where the bank grows.
  std::string describe() const;
};

}  // namespace attnres
