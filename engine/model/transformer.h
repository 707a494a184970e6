// The decoder forward, written once against the Backend interface and driven by the
// DepthPlan: embed -> for each sublayer: depth mix fused with PreNorm (two-phase,
// docs/ATTNRES.md §3) -> attention or SwiGLU MLP -> add into the partial / grow the bank ->
// final mix (2b) -> norm -> LM head. The same code runs plain Qwen3 / Qwen2 / Llama models
// (the plan then has no mixes) and every AttnRes variant.
//
// Tensor parallelism (engine/parallel) changes only where the forward communicates: a rank is
// given its local config and weight slices, plus a Communicator. On the ordinary path every
// rank holds every row of the step; the outputs of the row-parallel o_proj and down_proj are
// all-reduced. On the sequence-parallel path (long prefill, docs/ATTNRES.md §4) each rank holds
// 1/P of the rows of the partial, the bank and the Phase-1 state: the depth mix and PreNorm
// run on those rows, the sublayer input is all-gathered, and the sublayer output is
// reduce-scattered back to the rows' owners instead of all-reduced.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/depth_attention.h"
#include "engine/model/depth_plan.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/parallel/communicator.h"

namespace attnres {

// How a Transformer takes part in a tensor-parallel group. The default is a model alone.
struct ParallelRole {
  // Null: no communication. A group of one still communicates (the collectives are copies),
  // so the communication path can be checked on a single device.
  Communicator* comm = nullptr;
  // Steps with at least this many prefill tokens (tokens of sequences computing more than one
  // token in the step) shard the residual stream along the sequence; 0 never does.
  int sequence_parallel_min_tokens = 0;
};

// What the last forward held, for tests and the memory model (docs/PARALLELISM.md).
struct ForwardFootprint {
  int64_t rows = 0;        // rows of the step
  int64_t local_rows = 0;  // rows of the partial / bank this rank held (padding included)
  bool sequence_parallel = false;
  size_t bank_bytes = 0;  // the depth bank's allocation on this rank
};

// Depth-attention introspection (docs/ATTNRES.md §5): which rows of a step to report the depth-mix
// weights of, and where to put them.
struct DepthWeightsRequest {
  std::span<const int32_t> rows;  // rows of the step (any order, repeats allowed)
  // Filled on the host, row-major [rows.size(), layout.rows(), layout.cols()] for the
  // Transformer's depth_attention_layout(), NaN in the cells a sublayer does not have. Null:
  // computed (a tensor-parallel rank still takes part in the collectives) but not copied out.
  std::vector<float>* weights = nullptr;
};

class Transformer {
 public:
  // Uploads the weights to the backend (the CPU backend keeps them where they are: a
  // memory-mapped bf16 weight stays a memory-mapped bf16 weight) and folds each depth
  // RMSNorm gain into its pseudo-query.
  // Under tensor parallelism config and weights are the rank's (engine/parallel/
  // tensor_parallel.h: local_config, shard_weights).
  // depth_bank_dtype: what the depth bank stores (F32, or BF16 where the backend's
  // supports_depth_bank_dtype says so; throws otherwise). A BF16 bank rounds each entry to
  // nearest even as it is pushed; the partial, the Phase-1 state and the open delta_block
  // entry stay f32 (docs/ARCHITECTURE.md, "The depth bank's dtype").
  Transformer(const ModelConfig& config, const ModelWeights& weights, Backend& backend,
              ParallelRole parallel = {}, DType depth_bank_dtype = DType::F32);

  // One step over the tokens of `batch` (prefill chunks and decode tokens alike). Writes
  // their K/V into `cache` and returns the logits [logit_rows.size(), vocab] (f32, on the
  // backend's device) of the requested rows of the step. Under tensor parallelism every rank
  // calls it with the same batch and rows, and gets its vocabulary slice's logits.
  // With `depth` (and rows in it; a model with depth mixes only), also the depth-mix weights
  // of those rows; without it the forward does no extra work. Under tensor parallelism every
  // rank passes the same depth rows, and every rank gets the whole result.
  Tensor forward(const BatchMeta& batch, KvCache& cache, std::span<const int32_t> logit_rows,
                 const DepthWeightsRequest* depth = nullptr);
  // forward() in its two parts: the final-normed hidden rows [logit_rows.size(), d] (on the
  // device, f32 or the dtype Backend::linear_input_dtype picked for the LM head's input; every
  // rank gets every row), then the LM head over them (the rank's
  // vocabulary slice). Split so a step graph can hold the first and leave the large logits
  // buffer to one eager op (engine/sched/decode_graphs.h).
  Tensor forward_hidden(const BatchMeta& batch, KvCache& cache, std::span<const int32_t> logit_rows,
                        const DepthWeightsRequest* depth = nullptr);
  Tensor lm_head(const Tensor& hidden);

  const DepthPlan& plan() const { return plan_; }
  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  const Backend& backend() const { return backend_; }
  // Bytes of weights one decode step reads (the roofline numerator before the KV cache).
  size_t weight_bytes() const { return weight_bytes_; }
  const ForwardFootprint& last_footprint() const { return footprint_; }
  DType depth_bank_dtype() const { return bank_dtype_; }
  // Rows and columns of the depth-mix weight matrices; empty for a plain model.
  const DepthAttentionLayout& depth_attention_layout() const { return depth_layout_; }

 private:
  struct Scratch;
  struct RowSplit;
  RowSplit split_rows(const BatchMeta& batch) const;
  // The sublayer's input with every row of the step: the local normed rows themselves, or
  // (sequence-parallel) all of them gathered from the ranks.
  // `gathered` is the all-rows buffer to gather into (scratch's, or the V stream's).
  Tensor gather_input(const RowSplit& split, Tensor& normed_local, Tensor& gathered);
  // Sums the ranks' partial sublayer outputs into the rows this rank holds.
  // `written` is where the sublayer wrote its rows (scratch.reduced, or a bank entry) when
  // the step is not sharded; the result is the summed output (`written` itself then).
  Tensor reduce_output(const RowSplit& split, Scratch& scratch, Tensor& written);
  // A sublayer runs in two halves: its input projections (attention: q, k and v; MLP: gate
  // and up with SwiGLU into scratch.act), then the rest into `out`. The projections read the
  // normed rows (project_input; `value_input` feeds v_proj: the same tensor as `normed`
  // except under delta_v, whose V stream has its own depth mix, docs/ATTNRES.md §2d), or run
  // fused with the PreNorm that makes them (project_prenormed: Backend::prenorm_linear_*).
  void project_input(const DepthStep& step, const Tensor& normed, const Tensor& value_input,
                     Scratch& scratch);
  // An attention step's project_prenormed also ropes q, k and stores k, v in the cache
  // (Backend::prenorm_qkv_rope_store); its attention_rest is then told roped_and_stored.
  void project_prenormed(const DepthStep& step, const Backend::PrenormArgs& prenorm,
                         const BatchMeta& batch, KvCacheLayer& cache, Scratch& scratch);
  // With a `residual`, the rest's out = sublayer output + residual, the add fused into the
  // last linear (Backend::linear_residual).
  void attention_rest(int layer, const BatchMeta& batch, KvCacheLayer& cache, Scratch& scratch,
                      Tensor& out, const Tensor* residual, bool roped_and_stored);
  void mlp_rest(int layer, Scratch& scratch, Tensor& out, const Tensor* residual);
  // The sublayer's last linear, into out or (residual given) added to the residual.
  void output_linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out,
                     const Tensor* residual);
  Tensor upload(const Tensor& t);
  // Depth introspection: one mix's weights (plan step i, query row `slot` of its group) for
  // the requested rows ([rows, sources], on the device), and the download of every mix's
  // into the request's host buffer.
  Tensor mix_depth_weights(size_t i, int slot, const Tensor& bank, const Tensor& partial,
                           const Tensor* source_gate_logits, const RowSplit& split,
                           std::span<const int32_t> rows);
  void download_depth_weights(const std::vector<Tensor>& per_step,
                              const DepthWeightsRequest& depth);

  ModelConfig config_;
  Backend& backend_;
  DepthPlan plan_;
  ModelWeights weights_;  // device tensors
  // What one mixing step reads besides its query (docs/ATTNRES.md §2d), on the device.
  struct StepMix {
    float bias = 0.0f;              // on the partial's logit (block / full mixes)
    float null_logit = 0.0f;        // query . null / rms(null): a per-step constant
    float value_null_logit = 0.0f;  // the same for delta_v's V-stream query
    Tensor null_source;             // [d] f32, undefined without one
    Backend::DepthGate gate = Backend::DepthGate::None;
    float gate_blend = 0.0f;         // DepthGate::Scalar
    Tensor gate_proj, gate_bias;     // DepthGate::Vector
    Tensor pre_gate, pre_gate_bias;  // pre_gated
  };
  void load_step_mix(const ModelWeights& weights);
  Backend::DepthMixArgs mix_args(size_t i, int slot, const Tensor& m, const Tensor& s,
                                 const Tensor& o, const Tensor& query,
                                 const Tensor* gate_logits) const;

  // Kept across forwards, grown and never shrunk: the depth bank and the Phase-1 state, each
  // one flat buffer a step views in its own shape (kept_view). Allocated per step they
  // cost a zero-fill and, past glibc's mmap threshold, a page fault per 4 KB: 67 ms of
  // a 2 s 512-token 0.6B `full` prefill (docs/BENCHMARKS.md). Every entry a step reads was
  // written earlier in that step, so nothing needs clearing between steps. Allocated with
  // Backend::alloc_kept: on the CPU in huge pages, where Phase 1 and Phase 2 read them with
  // fewer TLB misses (about 2 points of `full`'s 100M prefill, docs/BENCHMARKS.md).
  // open_entry: delta_block's open entry, summed in f32 when the bank is not f32 (it is
  // rounded once, when committed).
  struct DepthWorkspace {
    Tensor bank, phase1_m, phase1_s, phase1_o, open_entry;
  };
  Tensor kept_view(Tensor& kept, const Shape& shape, DType dtype = DType::F32);
  DType bank_dtype_ = DType::F32;
  DepthWorkspace depth_workspace_;
  std::vector<Tensor> group_queries_;  // per Phase-1 group: [slots, d] f32, gain folded in
  std::vector<StepMix> step_mix_;      // per plan step
  Tensor inv_freq_;                    // [head_dim / 2] f32
  size_t weight_bytes_ = 0;
  ParallelRole parallel_;
  ForwardFootprint footprint_;
  DepthAttentionLayout depth_layout_;
};

}  // namespace attnres
