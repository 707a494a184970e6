// The decoder forward, written once against the Backend interface and driven by the
// DepthPlan: embed -> for each sublayer: depth mix fused with PreNorm (two-phase,
// docs/ATTNRES.md §3) -> attention or SwiGLU MLP -> add into the partial / grow the bank ->
// final mix (2b) -> norm -> LM head. The same code runs plain Qwen3 / Qwen2 / Llama models
// (the plan then has no mixes) and every AttnRes variant.
//
// Tensor parallelism (engine/runner) changes only where the forward communicates: a rank is
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
#include "engine/model/depth_bank.h"
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
  // Under tensor parallelism config and weights are the rank's (engine/runner/
  // tensor_parallel.h: local_config, shard_weights).
  // depth_bank_dtype: what the depth bank stores (F32, or BF16 where the backend's
  // capabilities().depth_bank_dtypes says so; throws otherwise). A BF16 bank rounds each entry to
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
  // buffer to one eager op (engine/runner/decode_graphs.h).
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
  DType depth_bank_dtype() const { return bank_.dtype(); }
  // Rows and columns of the depth-mix weight matrices; empty for a plain model.
  const DepthAttentionLayout& depth_attention_layout() const { return depth_layout_; }

 private:
  struct Scratch;
  struct RowSplit;
  struct StepMixes;
  struct DepthReport;
  RowSplit split_rows(const BatchMeta& batch) const;
  // The step's activations, each in the dtype its reader takes (Backend::linear_input_dtype).
  Scratch alloc_scratch(const RowSplit& split, int64_t hidden_rows);
  // The embedding of the rows this rank holds: the residual stream's start.
  Tensor embed(const BatchMeta& batch, const RowSplit& split, Scratch& scratch);
  // Plan step i's depth mix: runs its gates and (at a group's first step) the group's Phase 1,
  // and fills `mixes` with what Phase 2 reads. A step without a mix gets DepthMixArgs{}.
  void depth_mix(size_t i, const RowSplit& split, Scratch& scratch, StepMixes& mixes,
                 DepthReport& report);
  // The step's mix (or the partial), RMS-normed with its PreNorm gain into `normed` (delta_v's
  // attention: its V stream's into scratch.normed_v too).
  void mix_and_norm(const DepthStep& step, const StepMixes& mixes, Tensor& normed,
                    Scratch& scratch);
  // One attention or MLP sublayer: its input half, the bank's block boundary, its output
  // half, and its output into the residual stream.
  void sublayer(size_t i, const StepMixes& mixes, const BatchMeta& batch, KvCache& cache,
                const RowSplit& split, Scratch& scratch);
  // The final-normed rows the LM head reads: logit_rows of every rank's rows.
  Tensor hidden_rows(const RowSplit& split, Scratch& scratch, std::span<const int32_t> logit_rows);
  const Tensor& prenorm_gain(const DepthStep& step) const;
  // The sublayer's input with every row of the step: the local normed rows themselves, or
  // (sequence-parallel) all of them gathered from the ranks.
  // `gathered` is the all-rows buffer to gather into (scratch's, or the V stream's).
  Tensor gather_input(const RowSplit& split, Tensor& normed_local, Tensor& gathered);
  // Sums the ranks' partial sublayer outputs into the rows this rank holds.
  // `written` is where the sublayer wrote its rows (scratch.reduced, or a bank entry) when
  // the step is not sharded; the result is the summed output (`written` itself then).
  Tensor reduce_output(const RowSplit& split, Scratch& scratch, Tensor& written);
  // A sublayer runs in two halves, each choosing its fused ops. The input half: the step's
  // mix, RMS-normed, and the projections that read it (attention: q, k and v, roped, k and v
  // stored in the cache; MLP: gate and up with SwiGLU into scratch.act). The output half: the
  // rest into `out`; with a `residual`, out = sublayer output + residual, the add fused into
  // the last linear (Backend::linear_residual), and with an `entry` too, out also pushed into
  // that bank entry (Backend::linear_residual_push; DepthBank::OutputSlot says where).
  Backend::PrenormArgs prenorm_args(const DepthStep& step, const StepMixes& mixes,
                                    Scratch& scratch) const;
  void attention_input(const DepthStep& step, const StepMixes& mixes, const BatchMeta& batch,
                       KvCacheLayer& cache, const RowSplit& split, Scratch& scratch);
  void attention_output(int layer, const BatchMeta& batch, const KvCacheLayer& cache,
                        Scratch& scratch, Tensor& out, const Tensor* residual, Tensor* entry);
  void mlp_input(const DepthStep& step, const StepMixes& mixes, const RowSplit& split,
                 Scratch& scratch);
  void mlp_output(int layer, Scratch& scratch, Tensor& out, const Tensor* residual,
                  Tensor* entry);
  // Both halves of an MLP sublayer with no push-and-reset between them, after output_slot:
  // Backend::prenorm_mlp_residual where the residual add is fused and no entry is pushed from
  // the down projection, else mlp_input then mlp_output.
  void mlp(const DepthStep& step, const StepMixes& mixes, const RowSplit& split, Scratch& scratch,
           Tensor& out, const Tensor* residual, Tensor* entry);
  // The sublayer's last linear, into out or (residual given) added to the residual, the sum
  // also pushed into `entry` where that is given (only with a residual).
  void output_linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out,
                     const Tensor* residual, Tensor* entry);
  Tensor upload(const Tensor& t);
  // Depth introspection: one mix's weights (plan step i, query row `slot` of its group) for
  // the requested rows ([rows, sources], on the device), and the download of every mix's
  // into the request's host buffer.
  Tensor mix_depth_weights(size_t i, int slot, const Tensor* source_gate_logits,
                           const RowSplit& split, std::span<const int32_t> rows);
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

  // The residual stream: the bank and the partial (its buffers kept across forwards).
  DepthBank bank_;
  std::vector<Tensor> group_queries_;  // per Phase-1 group: [slots, d] f32, gain folded in
  std::vector<StepMix> step_mix_;      // per plan step
  Tensor inv_freq_;                    // [head_dim / 2] f32
  size_t weight_bytes_ = 0;
  ParallelRole parallel_;
  ForwardFootprint footprint_;
  DepthAttentionLayout depth_layout_;
};

}  // namespace attnres
