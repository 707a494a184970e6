// The CPU implementation of attnres::Backend (engine/core/backend.h): f32 activations,
// F32 / BF16 / F16 weights read as stored (and the block-quantized formats), threads of
// its own cpu::WorkerPool. It is the reference every other backend is tested against. Backend
// checks each op's operands (backend.cpp); the bodies here check that they are CPU tensors. The
// ops are defined across several files by theme:
//   cpu_backend.cpp      memory ops, factory, thread count
//   cpu_linear.cpp       linear: GEMV (decode, R <= 8) and packed GEMM (prefill)
//   cpu_linear_quant.cpp linear over block-quantized weights (int8 activations): Q8_B32,
//                        Q4_B32, Q4_K256; cpu_linear_q6.cpp Q6_B32, cpu_linear_q6k.cpp
//                        Q6_K256; quant_kernel_driver.h their shared work split and stores
//   cpu_attention.cpp    store_kv, paged causal GQA attention
//   cpu_norm_rope.cpp    rms_norm, qk_norm_rope
//   cpu_depth_mix.cpp    depth_phase1, depth_phase2_prenorm(_pair) (docs/ATTNRES.md §3)
//   cpu_depth_weights.cpp  depth_weights (introspection, docs/ATTNRES.md §5)
//   cpu_elementwise.cpp  embedding, swiglu, add_inplace(_push), gather_rows
//   cpu_sampling.cpp     sample (the host Sampler's pipeline per row, engine/sample/sample_row.h)
// Each op opens at most one parallel region on the backend's pool (worker_pool.h), all
// threads_ or one: a backend, like its pool, is used by one thread at a time (the engine
// thread or its tensor-parallel rank's); each backend has its own threads.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "engine/core/backend.h"
#include "kernels/cpu/worker_pool.h"

namespace attnres {

// The CPU backend's capabilities, the one object its instances and its registration share:
// a KV cache and a depth bank of F32 or BF16 (store_kv and copy round to nearest even, the ops
// widen in registers); Phase 2 mixes without a Phase-1 state; bf16 linear inputs where the
// build has AVX512_BF16, preferred where this core's vdpbf16ps does at least 1.5x the
// multiply-adds per second of its f32 FMAs (bf16_dot_rate.h: measured once, on first use).
const BackendCapabilities& cpu_backend_capabilities();

class CpuBackend : public Backend {
 public:
  // num_threads <= 0: cpu::default_thread_count() (OMP_NUM_THREADS, else the CPUs this
  // process may run on).
  // Batch-invariant: every row of `linear` is computed with the same arithmetic whatever the
  // number of rows (cpu_linear.cpp), so a request's logits do not depend on what it is
  // batched with, and a prompt's prefill rounds exactly like decoding it token by token.
  explicit CpuBackend(int num_threads = 0);

  Device device() const override { return Device::CPU; }
  std::string name() const override;
  // cpu_backend_capabilities(), above.
  const BackendCapabilities& capabilities() const override { return cpu_backend_capabilities(); }
  int num_threads() const { return threads_; }
  // bf16 linear inputs (Backend::set_bf16_linear_inputs): with bf16 weights, linear rounds x
  // to bf16 and computes its dot products with vdpbf16ps (cpu_linear_dot.h: Bf16Dot), in the
  // GEMV and the GEMM alike, so batch invariance holds in either setting; over a bf16 KV
  // cache, attention then rounds q and its softmax weights to bf16 as well
  // (cpu_attention_bf16.h). Supported where the build has AVX512_BF16.
  static bool bf16_linear_inputs_supported();
  // Whether bf16 linear inputs are the faster choice here: supported, and this core's
  // vdpbf16ps does at least 1.5x the multiply-adds per second of its f32 FMAs
  // (bf16_dot_rate.h: 2x on Zen 4, 0.5x on a core that issues one every two cycles).
  static bool bf16_linear_inputs_faster();
  // BF16 with bf16 linear inputs and bf16 weights: the producers of a linear's input rows
  // (rms_norm, depth_phase2_prenorm, attention, swiglu) then write them rounded, as CUDA's
  // do, instead of linear rounding an f32 copy in a pass of its own. The same bits.
  DType linear_input_dtype(int64_t rows, DType weight_dtype) const override;

  Tensor alloc(const Shape& shape, DType dtype) override;
  Tensor alloc_kept(const Shape& shape, DType dtype) override;
  Tensor upload(const Tensor& host) override;
  void download(const Tensor& src, void* host_dst) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void fill_zero(Tensor& dst) override;
  void synchronize() override {}

 protected:
  // The op bodies (Backend checks the operands first: backend.cpp).
  void embedding_impl(const Tensor& table, const BatchMeta& batch, Tensor& out) override;
  void rms_norm_impl(const Tensor& x, const Tensor& gain, float eps, Tensor& out) override;
  void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) override;
  // With bf16 linear inputs, x is rounded once for all the targets (or gate and up), not once
  // per weight; the same bits as one linear per target.
  void linear_many_impl(const Tensor& x, std::span<const LinearTarget> targets) override;
  void linear_swiglu_impl(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                          const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                          Tensor& out) override;
  void qk_norm_rope_impl(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                         const Tensor* k_gain, float eps, const Tensor& inv_freq,
                         const BatchMeta& batch) override;
  void store_kv_impl(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                     KvCacheLayer& cache) override;
  void attention_impl(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                      int head_dim, float scale, Tensor& out) override;
  void swiglu_impl(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void add_inplace_impl(Tensor& x, const Tensor& y) override;
  void add_inplace_push_impl(Tensor& x, const Tensor& y, Tensor& entry, PushedRow pushed) override;
  void gather_rows_impl(const Tensor& x, std::span<const int32_t> rows, Tensor& out) override;
  void depth_phase1_impl(const Tensor& queries, const Tensor& bank, int n, float eps, Tensor& m,
                         Tensor& s, Tensor& o, const Tensor* source_gate_logits) override;
  void depth_phase2_prenorm_impl(const DepthMixArgs& mix, const Tensor& partial,
                                 const Tensor& prenorm_gain, float norm_eps, Tensor& out) override;
  void depth_phase2_prenorm_pair_impl(const DepthMixArgs& a, const DepthMixArgs& b,
                                      const Tensor& partial, const Tensor& prenorm_gain,
                                      float norm_eps, Tensor& out_a, Tensor& out_b) override;
  void depth_weights_impl(const Tensor& query, const Tensor& bank, int n, const Tensor& partial,
                          float bias, float eps, Tensor& out,
                          const DepthSourceSwitches& sources) override;
  void sample_impl(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) override;

 private:
  // Whether linear_many rounds x once for all of targets: bf16 linear inputs, bf16 weights.
  bool rounds_linear_inputs(std::span<const LinearTarget> targets) const;

  // The rotary cos / sin table of the last qk_norm_rope call: every layer of a forward asks
  // for the same positions and inverse frequencies, so only the first computes it.
  struct RopeTable {
    std::vector<int32_t> positions;
    std::vector<float> inv_freq;
    std::vector<float> cos, sin;  // [T, hd / 2]
  };
  // rope_table_ for these positions and frequencies, recomputed when either differs.
  const RopeTable& rope_table(const std::vector<int32_t>& positions, std::vector<float> inv_freq);

  std::unique_ptr<cpu::WorkerPool> pool_;
  int threads_;  // pool_->size()
  RopeTable rope_table_;
};

std::unique_ptr<Backend> make_cpu_backend(int num_threads = 0);

// Internal helpers shared by the op files (not part of the Backend interface).
namespace cpu {
// Rows of a tensor viewed as a matrix: all dimensions but the last.
int64_t rows_of(const Tensor& t);
// Checks t lives on the CPU (or is empty): the one operand fact Backend leaves to the bodies.
void check_on_cpu(const Tensor& t, const char* what);
// f32 copy of a CPU vector of n values of a float dtype (gains, inv_freq, biases; Backend
// checked the count and the dtype).
std::vector<float> widen_vector(const Tensor& t, int64_t n, const char* what);
}  // namespace cpu

}  // namespace attnres
