// bench_cuda_backend's prefill figures (bench_cuda_prefill.cpp).
#pragma once

#include <string>
#include <vector>

#include "engine/model/loaded_model.h"

namespace attnres {

// A built-in shape by name, or a Hugging Face directory (an argument with a '/').
LoadedModel load_bench_model(const std::string& arg);

// Prints, for each prompt length, the prefill time, tokens/s and FLOP rate of `model` against
// the bf16 GEMM rate measured in the same run. chunk 0: each prompt in one forward.
// linear_inputs: "bfloat16" / "float32" (Backend::set_bf16_linear_inputs, what
// --linear-input-dtype sets), "both" (each length timed both ways in the same run, and the
// ratio), "" (what --linear-input-dtype auto picks: bfloat16 for bf16 weights).
void bench_prefill(const std::string& model, const std::vector<int>& lengths, int chunk, int iters,
                   const std::string& linear_inputs = "");

}  // namespace attnres
