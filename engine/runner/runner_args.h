// RunnerArgs: the settings a ModelRunner is built from, every one of them decided: no "auto"
// and no flag spellings. engine/sched/model_execution.h resolves them once from EngineArgs (the
// attnres flags) against the model and the backend; everything in engine/runner reads them
// from here, and rank 0 of a multi-process job sends them to the other ranks as they are
// (process_control.h), so that every rank builds what rank 0 sized.
#pragma once

#include <string>

#include "engine/core/dtype.h"

namespace attnres {

struct RunnerArgs {
  std::string model;             // what load_model_arg loads: a directory, builtin:NAME, "" = demo
  std::string device = "cpu";    // a registered backend name
  int threads = 0;               // CPU threads, 0 = all cores (shared among the ranks)
  int tensor_parallel_size = 1;  // ranks; checked against the model's head counts
  // Prefill steps with at least this many prefill tokens run sequence-parallel (0: never).
  int sequence_parallel_min_tokens = 128;
  DType kv_cache_dtype = DType::F32;    // F32, or BF16 where the backend's attention takes it
  DType depth_bank_dtype = DType::F32;  // F32, or BF16 where the backend's depth ops take it
  bool bf16_linear_inputs = false;      // linears round their input rows to bf16
  // Decode steps of up to this many sequences replay a step graph where the backend records
  // them (decode_graphs.h); 0: every step eagerly.
  int max_graph_batch = 256;
};

}  // namespace attnres
