// bench_cpu_kernels' `quant` table: linear over block-quantized weights (Q8_B32 / Q6_B32 /
// Q4_B32 / Q4_K256) against bf16 at the 0.6B shapes (bench_quant_linear.cpp).
#pragma once

#include "kernels/cpu/cpu_backend.h"

namespace attnres {

void run_quant_linear(CpuBackend& be);

}  // namespace attnres
