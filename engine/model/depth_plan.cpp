#include "engine/model/depth_plan.h"

#include <algorithm>
#include <sstream>

#include "engine/core/backend.h"
#include "engine/core/error.h"

namespace attnres {
namespace {

const char* kind_name(SublayerKind k) {
  switch (k) {
    case SublayerKind::Attention:
      return "attn";
    case SublayerKind::Mlp:
      return "mlp";
    case SublayerKind::Final:
      return "final";
  }
  return "?";
}

// Query rows one Phase-1 pass serves at most. The cost per step of a group of S slots over a
// bank of n entries, in bank-row reads: n / S (the shared pass) + 2 (its o row written and
// read back) + (S - 1) / 2 (the newer entries, on average, where the bank grows every
// sublayer). S = 8 is near the minimum for the 0.6B shape's n of up to 57, and bounds the
// [S, T, d] Phase-1 output (first_layer's one group would otherwise hold every sublayer).
constexpr int kMaxGroupSlots = 8;
// A group's last step may read kMaxGroupSlots - 1 newer entries, plus the group's one shared
// entry where the forward skips Phase 1 (Backend::mixes_without_phase1).
static_assert(kMaxGroupSlots <= Backend::kMaxNewerSources,
              "a step's newer entries must fit one Phase 2");

// Consecutive steps that read the same first bank entries form a group; the bank only grows,
// so the first step's sources are a prefix of every later one's. A pre-gated step's sources
// depend on its own gate: it is a group alone.
void build_groups(DepthPlan& plan) {
  bool alone = true;  // the previous group must not take more steps
  for (int i = 0; i < static_cast<int>(plan.steps.size()); ++i) {
    DepthStep& step = plan.steps[i];
    if (!step.mixes) continue;
    const int rows = step.value_slot >= 0 ? 2 : 1;
    const bool joins = !plan.groups.empty() && !alone && !step.pre_gated &&
                       plan.groups.back().bank_first == step.bank_first &&
                       plan.groups.back().num_bank_sources <= step.num_bank_sources &&
                       plan.groups.back().num_slots + rows <= kMaxGroupSlots;
    if (!joins) plan.groups.push_back(DepthGroup{step.bank_first, step.num_bank_sources, {}, 0});
    alone = step.pre_gated;
    DepthGroup& group = plan.groups.back();
    step.group = static_cast<int>(plan.groups.size()) - 1;
    step.slot = group.num_slots;
    step.num_newer_sources = step.num_bank_sources - group.num_bank_sources;
    if (step.value_slot >= 0) step.value_slot = step.slot + 1;
    group.num_slots += rows;
    group.steps.push_back(i);
  }
}

// A bank entry nobody reads (2a's snapshot after the last block, the last sublayer's output
// in the delta modes) is not worth storing.
void drop_unread_pushes(DepthPlan& plan) {
  int read_end = 1;  // entries [0, read_end) are read by some step
  for (const DepthStep& s : plan.steps) {
    if (s.mixes) read_end = std::max(read_end, s.bank_first + s.num_bank_sources);
  }
  int size = 1;
  std::vector<DepthStep*> accumulating;  // delta_block: steps adding into the open entry
  for (DepthStep& s : plan.steps) {
    if (s.push_and_reset_after_mix) ++size;  // always read: the final mix sees every block
    if (s.accumulate_output) accumulating.push_back(&s);
    for (bool* push : {&s.push_after, &s.push_output_after, &s.commit_open_entry}) {
      if (!*push) continue;
      if (size >= read_end) {
        *push = false;
        if (push == &s.commit_open_entry) {
          for (DepthStep* a : accumulating) a->accumulate_output = false;
        }
      } else {
        ++size;
      }
      if (push == &s.commit_open_entry) accumulating.clear();
    }
  }
  // Layers after the last committed block delta: their sum is never a source.
  for (DepthStep* a : accumulating) a->accumulate_output = false;
  plan.bank_capacity = std::max(size, read_end);
}

// 2a / 2b (docs/ATTNRES.md §2a, §2b): the partial is the last source; full pushes after every
// sublayer.
void add_cumulative_steps(const ModelConfig& config, DepthPlan& plan) {
  const bool full = config.attnres_mode == AttnResMode::Full;
  const int per_block = plan.layers_per_block;
  int bank_size = 1;  // the embedding
  for (int i = 0; i < config.num_layers; ++i) {
    DepthStep attn{SublayerKind::Attention, i};
    DepthStep mlp{SublayerKind::Mlp, i};
    attn.mixes = mlp.mixes = true;
    attn.num_bank_sources = bank_size;
    if (plan.cumulative) {
      attn.push_after = full;
      bank_size += attn.push_after ? 1 : 0;
      mlp.num_bank_sources = bank_size;
      mlp.push_after = full || (i + 1) % per_block == 0;
      bank_size += mlp.push_after ? 1 : 0;
    } else {
      attn.push_and_reset_after_mix = i > 0 && i % per_block == 0;
      bank_size += attn.push_and_reset_after_mix ? 1 : 0;
      mlp.num_bank_sources = bank_size;
    }
    plan.steps.push_back(attn);
    plan.steps.push_back(mlp);
  }
}

// delta, delta_block, delta_v, pre_gated (docs/ATTNRES.md §2d): h_mix = x + mix([null?] + bank).
void add_delta_steps(const ModelConfig& config, DepthPlan& plan) {
  const AttnResMode mode = config.attnres_mode;
  const bool per_block = mode == AttnResMode::DeltaBlock;
  int bank_size = 1;
  for (int i = 0; i < config.num_layers; ++i) {
    for (SublayerKind kind : {SublayerKind::Attention, SublayerKind::Mlp}) {
      DepthStep step{kind, i};
      step.mixes = true;
      step.num_bank_sources = bank_size;
      step.partial_is_source = false;
      step.adds_partial = true;
      step.null_source = attnres_is_delta(mode) && config.attnres_use_null_source;
      step.pre_gated = mode == AttnResMode::PreGated;
      step.gated = attnres_mode_has_gate(mode) && config.attnres_gate != AttnResGate::Bias;
      if (mode == AttnResMode::DeltaV && kind == SublayerKind::Attention) step.value_slot = 0;
      if (per_block) {
        step.accumulate_output = true;
        step.commit_open_entry = kind == SublayerKind::Mlp && (i + 1) % plan.layers_per_block == 0;
        bank_size += step.commit_open_entry ? 1 : 0;
      } else {
        step.push_output_after = true;
        ++bank_size;
      }
      plan.steps.push_back(step);
    }
  }
}

// first_layer (docs/ATTNRES.md §2d): layer 0 runs unmixed and stores its MLP output; every later
// sublayer mixes [out_1, x] (bank entry 1 and the partial), with no bias and no gate.
void add_first_layer_steps(const ModelConfig& config, DepthPlan& plan) {
  for (int i = 0; i < config.num_layers; ++i) {
    for (SublayerKind kind : {SublayerKind::Attention, SublayerKind::Mlp}) {
      DepthStep step{kind, i};
      step.mixes = i > 0;
      step.bank_first = 1;
      step.num_bank_sources = i > 0 ? 1 : 0;
      step.push_output_after = i == 0 && kind == SublayerKind::Mlp;
      plan.steps.push_back(step);
    }
  }
}

}  // namespace

DepthPlan DepthPlan::build(const ModelConfig& config, bool has_final_mix) {
  DepthPlan plan;
  plan.mode = config.attnres_mode;
  plan.has_final_mix = has_final_mix;
  plan.cumulative = !has_final_mix;
  const AttnResMode mode = config.attnres_mode;
  if (has_final_mix && mode != AttnResMode::Block) {
    throw Error("a final depth mix (model.final_res_*) is only defined for attnres_mode \"block\"");
  }
  plan.layers_per_block = mode != AttnResMode::None ? config.layers_per_block() : 0;
  const bool gated = attnres_mode_has_gate(mode) && config.attnres_gate != AttnResGate::Bias;
  if (mode == AttnResMode::None) {
    for (int i = 0; i < config.num_layers; ++i) {
      plan.steps.push_back(DepthStep{SublayerKind::Attention, i});
      plan.steps.push_back(DepthStep{SublayerKind::Mlp, i});
    }
  } else if (mode == AttnResMode::Block || mode == AttnResMode::Full) {
    add_cumulative_steps(config, plan);
    for (DepthStep& s : plan.steps) s.gated = gated;
  } else if (mode == AttnResMode::FirstLayer) {
    add_first_layer_steps(config, plan);
  } else {
    add_delta_steps(config, plan);
  }
  int bank_size = 1;
  for (const DepthStep& s : plan.steps) {
    bank_size += (s.push_and_reset_after_mix || s.push_after) ? 1 : 0;
  }
  DepthStep final_step{SublayerKind::Final, config.num_layers};
  final_step.mixes = has_final_mix;  // 2b only, never gated
  final_step.num_bank_sources = has_final_mix ? bank_size : 0;
  plan.steps.push_back(final_step);

  build_groups(plan);
  drop_unread_pushes(plan);
  return plan;
}

int DepthPlan::max_group_size() const {
  int m = 0;
  for (const DepthGroup& g : groups) m = std::max(m, g.num_slots);
  return m;
}

std::string DepthPlan::describe() const {
  std::ostringstream out;
  if (mode == AttnResMode::None) {
    out << "depth plan: none (plain pre-norm residual stream)\n";
    return out.str();
  }
  const bool block_or_full = mode == AttnResMode::Block || mode == AttnResMode::Full;
  out << "depth plan: " << attnres_mode_name(mode) << " AttnRes, "
      << (!block_or_full ? "running residual x, never reset"
          : cumulative   ? "cumulative partial (bank holds snapshots of the running sum)"
                         : "block sums with reset and a final mix")
      << ", " << layers_per_block << " layers per block, bank up to " << bank_capacity
      << " entries, " << groups.size() << " Phase-1 groups\n";
  out << "sources: null = null source, b0 = embedding, bN = bank entry N, p = partial (last, "
         "bias applies to it); x + mix: the partial is added, not a source\n";
  for (const DepthStep& s : steps) {
    if (s.kind == SublayerKind::Final && !s.mixes) {
      out << "  final        norm(p)\n";
      continue;
    }
    char label[32];
    std::snprintf(label, sizeof(label), "%-5s L%-3d", kind_name(s.kind), s.layer);
    out << "  " << (s.kind == SublayerKind::Final ? "final       " : label);
    if (!s.mixes) {
      out << " p (no mix)";
    } else {
      out << (s.adds_partial ? " x + mix[" : " mix[");
      if (s.null_source) out << "null ";
      for (int j = s.bank_first; j < s.bank_first + s.num_bank_sources; ++j) {
        out << "b" << j
            << (j + 1 < s.bank_first + s.num_bank_sources || s.partial_is_source ? " " : "");
      }
      out << (s.partial_is_source ? "p]" : "]") << "  group " << s.group << " slot " << s.slot;
      if (s.num_newer_sources > 0) {
        out << " (Phase 2 merges the newest " << s.num_newer_sources << ")";
      }
      if (s.value_slot >= 0) out << " (V stream: slot " << s.value_slot << ")";
      if (s.pre_gated) out << "  sources pre-gated";
      if (s.gated) out << "  gated";
    }
    if (s.push_and_reset_after_mix) out << "  -> bank += p; p = 0 (new block)";
    if (s.push_after) out << "  -> bank += p (snapshot)";
    if (s.push_output_after) out << "  -> bank += output";
    if (s.accumulate_output) out << "  -> open entry += output";
    if (s.commit_open_entry) out << "  -> bank += block delta";
    out << "\n";
  }
  return out.str();
}

}  // namespace attnres
