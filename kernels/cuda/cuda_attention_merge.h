// Attention's last-block merge lever (ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE; NOTES.md "GEMV
// levers"): flash-decoding (cuda_attention.cu) with the split merge done by the last split CTA
// of each (row, grid column) to finish, instead of by the merge kernel: a launch fewer per
// split attention, the same bits (the merge kernel's code reads every split in split order).
// The CTAs count themselves in on an int32 counter per (row, grid column); the last to count
// merges and puts the counter back to 0, so the counters are 0 between launches and a graph
// replays with them as an eager launch does.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {

struct AttentionSplitCounters {
  int32_t* counters = nullptr;  // device, `capacity` int32, all 0 before a launch
  int64_t capacity = 0;
};

// The counters a launch of `args` uses: one per (row, grid column); 0 without splits.
int64_t attention_split_counters_needed(const PagedAttentionArgs& args);
// The most counters any plan_attention_splits plan for sm_count SMs needs (it splits only a
// batch of fewer CTAs than it aims for): a buffer of this many serves every planned launch.
int64_t attention_split_counter_bound(int sm_count);

// launch_paged_attention with the last-block merge where `counters` has at least
// attention_split_counters_needed(args) counters; otherwise (no splits, no counters, too few)
// exactly launch_paged_attention(args, stream).
void launch_paged_attention(const PagedAttentionArgs& args, const AttentionSplitCounters& counters,
                            cudaStream_t stream);

}  // namespace attnres::cuda
