// Builds the depth-attention layout (engine/core/depth_attention.h) of a DepthPlan: one row
// per mixing step with its label and source count, and a label per source slot. Only the
// plan is read, so the labels say what the engine actually mixes (a bank entry dropped by
// the plan because nobody reads it never becomes a column).
#pragma once

#include "engine/core/depth_attention.h"
#include "engine/model/depth_plan.h"

namespace attnres {

// Empty for a plan without mixes (a plain pre-norm model).
DepthAttentionLayout make_depth_attention_layout(const DepthPlan& plan);

}  // namespace attnres
