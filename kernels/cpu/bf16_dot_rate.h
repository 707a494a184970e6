// How much faster this core multiplies bf16 pairs with vdpbf16ps than f32 with FMAs: the
// ratio of multiply-adds per second, measured once per process (a few hundred microseconds
// of register-only loops on the calling thread). CpuBackend::bf16_linear_inputs_faster, and
// so --linear-input-dtype auto, reads it.
//
// Why measure rather than look the CPU up: the instruction's rate is a property of the core,
// not of the flag that says it exists. Zen 4 issues one 512-bit vdpbf16ps per cycle, as many
// as FMAs, i.e. twice the multiply-adds (measured: 3.67 G/s each); a 2-core Xeon VM issues one
// every two cycles against two FMAs per cycle, half the rate (docs/perf-log/cpu-engine.md). Both
// loops are timed alternately and the fastest round of each kept, so a neighbour on the core slows
// both alike.
#pragma once

namespace attnres::cpu {

// 0 where the build has no AVX512_BF16 (cpu_linear_dot.h: kHasBf16Dot).
double bf16_dot_speedup();

}  // namespace attnres::cpu
