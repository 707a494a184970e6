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
void bench_prefill(const std::string& model, const std::vector<int>& lengths, int chunk, int iters);

}  // namespace attnres
