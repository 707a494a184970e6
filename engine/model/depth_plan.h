// The depth plan (ATTNRES.md §2): every AttnRes variant, and the plain pre-norm residual,
// expressed as data that one forward executes. For each sublayer it says which bank
// entries the depth mix reads, where the bank grows, where the partial resets, and which
// Phase-1 group (ATTNRES.md §3) computes the bank side of its softmax.
//
// Vocabulary: the *bank* is the list of completed representations (bank[0] is the token
// embedding); the *partial* is the running representation being accumulated (the
// cumulative stream x in 2a, the current block sum p in 2b). The partial is always the
// last source of a mix, and a bias (when the checkpoint has one) applies to it alone.
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
  int num_bank_sources = 0;  // bank entries [0, n) read by the mix
  int group = -1;            // Phase-1 group this step's bank logits come from
  int slot = 0;              // this step's row in its group's Phase-1 outputs
  bool push_and_reset_after_mix = false;  // 2b: bank += [partial]; partial = 0 (before f runs)
  bool push_after = false;                // 2a: bank += [partial] after the output is added
};

// Steps that read the same bank entries: Phase 1 runs once for all of them, at the first.
struct DepthGroup {
  int num_bank_sources = 0;
  std::vector<int> steps;  // indices into DepthPlan::steps, in order
};

struct DepthPlan {
  AttnResMode mode = AttnResMode::None;
  bool has_final_mix = false;  // 2b: a final mix over bank + partial before the last norm
  bool cumulative = true;      // 2a (never reset) vs 2b (block sums with reset)
  int layers_per_block = 0;
  int bank_capacity = 1;         // entries the bank reaches, the embedding included
  std::vector<DepthStep> steps;  // 2 per layer, then one Final step
  std::vector<DepthGroup> groups;

  static DepthPlan build(const ModelConfig& config, bool has_final_mix);

  int max_group_size() const;
  // Human-readable listing for `attnres inspect`: per sublayer the sources it reads and
  // where the bank grows.
  std::string describe() const;
};

}  // namespace attnres
