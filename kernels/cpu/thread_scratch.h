// cpu::thread_scratch: a kernel's per-thread working buffer, kept across calls and aligned
// to a cache line.
//
// Why not a std::vector per call: glibc hands out 16-byte aligned blocks wherever the heap
// has room, so whether a buffer's 64-byte vectors straddle two cache lines changed with
// everything else the process had allocated. The packed GEMM reads its weight panel on
// every FMA step: with the panel 16, 32 or 48 bytes off a cache line a [128 x 1024] x
// [1024 x 3072] GEMM took 8-12% longer than with it aligned, and in one process the same
// shapes ran 3-6% slower in one model than in the next (issue #19, docs/BENCHMARKS.md).
#pragma once

#include <cstddef>

namespace attnres::cpu {

// One buffer per user and thread: a kernel's buffers never overlap another's, even if one
// kernel's task ever ran inside another's.
enum class ScratchSlot {
  GemmPanel,
  GemmPartials,
  LinearInput,   // a linear's x rounded to bf16 (bf16 linear inputs)
  QuantInput,    // a linear's x quantized to int8 blocks (quantized weights)
  DepthLogits,   // Phase 1: a token's logits, then softmax weights
  DepthSigmoid,  // Phase 1, pre_gated: sigmoid(gate logits) of a token
  DepthRows,     // Phase 2 into bf16 outs: a token's h rows in f32, before the rounding
  kCount
};

// The calling thread's buffer for `slot`, with room for at least `floats` floats and 64-byte
// aligned; its contents are unspecified. It stays valid until this thread asks for the same
// slot with a larger size (the buffer grows to the largest request and is kept until the
// thread exits).
float* thread_scratch(ScratchSlot slot, size_t floats);

}  // namespace attnres::cpu
