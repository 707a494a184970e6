// The control messages rank 0 of a multi-process job sends the other ranks (process_runner.h),
// and their byte encoding (native byte order: every rank of a job runs the same binary on the
// same kind of machine).
//   Load    build your shard of this model (the resolved RunnerArgs that decide it)
//   Step    run this step (the batch, the logit rows, the depth rows)
//   Unload  drop your shard (the command is done with it)
//   Exit    leave the worker loop: the job is ending
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/runner/runner_args.h"

namespace attnres {

enum class ControlKind : uint8_t { Load = 1, Step = 2, Unload = 3, Exit = 4 };

struct LoadMessage {
  // Rank 0's, as resolved: every rank builds its shard with the same dtypes and sizes.
  RunnerArgs args;
  int num_kv_blocks = 0;
  int block_size = 16;
  // Rank 0's ModelConfig::summary(): a rank that loads something else (another file at the
  // same path on another machine) refuses to run with it instead of computing garbage.
  std::string model_summary;
};

std::string encode_load(const LoadMessage& message);
std::string encode_step(const StepBatch& step);
std::string encode_simple(ControlKind kind);  // Unload, Exit

// Throws attnres::Error for a truncated or unknown message.
ControlKind control_kind(const std::string& message);
LoadMessage decode_load(const std::string& message);
// Decodes into `out`, reusing its vectors' capacity.
void decode_step(const std::string& message, StepBatch& out);

}  // namespace attnres
