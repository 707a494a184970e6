#include "engine/model/depth_plan.h"

#include <algorithm>
#include <sstream>

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

// Steps that read the same bank entries form a group; the bank only grows, so those steps
// are consecutive.
void build_groups(DepthPlan& plan) {
  for (int i = 0; i < static_cast<int>(plan.steps.size()); ++i) {
    DepthStep& step = plan.steps[i];
    if (!step.mixes) continue;
    if (plan.groups.empty() || plan.groups.back().num_bank_sources != step.num_bank_sources) {
      plan.groups.push_back(DepthGroup{step.num_bank_sources, {}});
    }
    DepthGroup& group = plan.groups.back();
    step.group = static_cast<int>(plan.groups.size()) - 1;
    step.slot = static_cast<int>(group.steps.size());
    group.steps.push_back(i);
  }
}

// A bank entry nobody reads (2a's snapshot after the last block) is not worth copying.
void drop_unread_pushes(DepthPlan& plan) {
  int max_read = 1;
  for (const DepthStep& s : plan.steps) max_read = std::max(max_read, s.num_bank_sources);
  int size = 1;
  for (DepthStep& s : plan.steps) {
    if (s.push_and_reset_after_mix) ++size;  // always read: the final mix sees every block
    if (s.push_after) {
      if (size >= max_read) {
        s.push_after = false;
      } else {
        ++size;
      }
    }
  }
  plan.bank_capacity = std::max(size, max_read);
}

}  // namespace

DepthPlan DepthPlan::build(const ModelConfig& config, bool has_final_mix) {
  DepthPlan plan;
  plan.mode = config.attnres_mode;
  plan.has_final_mix = has_final_mix;
  plan.cumulative = !has_final_mix;
  const int num_layers = config.num_layers;
  const bool attnres = config.attnres_mode != AttnResMode::None;
  if (has_final_mix && config.attnres_mode != AttnResMode::Block) {
    throw Error("a final depth mix (model.final_res_*) is only defined for attnres_mode \"block\"");
  }
  plan.layers_per_block = attnres ? config.layers_per_block() : 0;
  const bool full = config.attnres_mode == AttnResMode::Full;
  const int per_block = plan.layers_per_block;

  int bank_size = 1;  // the embedding
  for (int i = 0; i < num_layers; ++i) {
    DepthStep attn{SublayerKind::Attention, i};
    DepthStep mlp{SublayerKind::Mlp, i};
    if (attnres) {
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
    }
    plan.steps.push_back(attn);
    plan.steps.push_back(mlp);
  }
  DepthStep final_step{SublayerKind::Final, num_layers};
  final_step.mixes = has_final_mix;
  final_step.num_bank_sources = has_final_mix ? bank_size : 0;
  plan.steps.push_back(final_step);

  build_groups(plan);
  drop_unread_pushes(plan);
  return plan;
}

int DepthPlan::max_group_size() const {
  size_t m = 0;
  for (const DepthGroup& g : groups) m = std::max(m, g.steps.size());
  return static_cast<int>(m);
}

std::string DepthPlan::describe() const {
  std::ostringstream out;
  if (mode == AttnResMode::None) {
    out << "depth plan: none (plain pre-norm residual stream)\n";
    return out.str();
  }
  out << "depth plan: " << (mode == AttnResMode::Full ? "full" : "block") << " AttnRes, "
      << (cumulative ? "cumulative partial (bank holds snapshots of the running sum)"
                     : "block sums with reset and a final mix")
      << ", " << layers_per_block << " layers per block, bank up to " << bank_capacity
      << " entries, " << groups.size() << " Phase-1 groups\n";
  out << "sources: b0 = embedding, bN = bank entry N, p = partial (always last, bias applies "
         "to it)\n";
  for (const DepthStep& s : steps) {
    if (s.kind == SublayerKind::Final && !s.mixes) {
      out << "  final        norm(p)\n";
      continue;
    }
    char label[32];
    std::snprintf(label, sizeof(label), "%-5s L%-3d", kind_name(s.kind), s.layer);
    out << "  " << (s.kind == SublayerKind::Final ? "final       " : label) << " mix[";
    for (int j = 0; j < s.num_bank_sources; ++j) out << "b" << j << " ";
    out << "p]  group " << s.group << " slot " << s.slot;
    if (s.push_and_reset_after_mix) out << "  -> bank += p; p = 0 (new block)";
    if (s.push_after) out << "  -> bank += p (snapshot)";
    out << "\n";
  }
  return out.str();
}

}  // namespace attnres
