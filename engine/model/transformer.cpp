#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "engine/model/depth_attention_layout.h"

namespace attnres {

namespace {

Tensor host_f32(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::copy(values.begin(), values.end(), t.ptr<float>());
  return t;
}

// The depth RMSNorm's gain g and the pseudo-query w only ever appear as w . (g * x), so the
// logit is (w * g) . x / rms(x): fold them once here (docs/ATTNRES.md §3).
void fold_query(const AttnResWeights& res, int64_t d, float* out) {
  for (int64_t k = 0; k < d; ++k) {
    out[k] = element_as_float(res.proj, k) * element_as_float(res.norm, k);
  }
}

// query . v / rms(v) for the null source v: its logit never changes (docs/ATTNRES.md §2d).
float constant_logit(const float* query, const Tensor& v, int64_t d, float eps) {
  double dot = 0.0, ss = 0.0;
  for (int64_t k = 0; k < d; ++k) {
    const double x = element_as_float(v, k);
    dot += query[k] * x;
    ss += x * x;
  }
  return static_cast<float>(dot / std::sqrt(ss / static_cast<double>(d) + eps));
}

Tensor widened(const Tensor& t) {
  std::vector<float> values(t.numel());
  for (int64_t k = 0; k < t.numel(); ++k) values[k] = element_as_float(t, k);
  return host_f32(values, {t.numel()});
}

const Tensor* bias_of(const Tensor& b) { return b.defined() ? &b : nullptr; }

// The dtype a linear input of `rows` rows is allocated in when `readers` of every layer read it:
// the one the backend answers for all of them (Backend::linear_input_dtype), F32 when they
// disagree.
DType linear_input_dtype(const Backend& backend, int64_t rows,
                         const std::vector<LayerWeights>& layers,
                         std::initializer_list<Tensor LayerWeights::*> readers) {
  std::optional<DType> common;
  for (const LayerWeights& layer : layers) {
    for (Tensor LayerWeights::*reader : readers) {
      const DType dtype = backend.linear_input_dtype(rows, (layer.*reader).dtype);
      if (common && *common != dtype) return DType::F32;
      common = dtype;
    }
  }
  return common.value_or(DType::F32);
}

const AttnResWeights* depth_weights_of(const ModelWeights& w, const DepthStep& step) {
  if (step.kind == SublayerKind::Final) return w.final_res ? &*w.final_res : nullptr;
  const LayerWeights& layer = w.layers[step.layer];
  const auto& res = step.kind == SublayerKind::Attention ? layer.attn_res : layer.mlp_res;
  return res ? &*res : nullptr;
}

}  // namespace

// Per-step activations. Allocated per forward: on the CPU an allocation is noise next to
// the matmuls; the CUDA backend's caching allocator makes it cheap there.
struct Transformer::Scratch {
  Tensor q, k, v, attn, gate, up, act;
  // Sequence-parallel only: every row of the step (padded to a multiple of the group size)
  // for the gathered sublayer input and the not-yet-reduced sublayer output.
  Tensor gathered, unreduced;
  Tensor gathered_v;  // delta_v under sequence parallelism: the V stream's gathered input
  Tensor reduced;     // [local rows, d]: the sublayer output summed over the ranks
  // Where a sublayer writes its (not yet summed over ranks) output: every row of the step.
  Tensor sublayer_out;
  Tensor normed;    // [local rows, d]: the sublayer input, the mix RMS-normed
  Tensor normed_v;  // delta_v: the V stream's sublayer input
  // sigmoid_vector's and pre_gated's gate logits, computed from the partial.
  Tensor gate_logits;
  Tensor hidden;  // the final norm's output
};

// One step's depth mixes (delta_v's attention: its K stream's and its V stream's, two slots):
// the arguments Phase 2 reads and the views they point at. Filled in place, never copied.
struct Transformer::StepMixes {
  StepMixes() = default;
  StepMixes(const StepMixes&) = delete;
  StepMixes& operator=(const StepMixes&) = delete;
  Backend::DepthMixArgs args[2];
  Tensor m[2], s[2], o[2], query[2], newer;
};

// Depth introspection, only when asked: each depth mix's weights of the requested rows.
struct Transformer::DepthReport {
  const DepthWeightsRequest* request = nullptr;  // null: nothing reported
  std::vector<Tensor> per_mix;
};

// Which rows of the step this rank holds in the partial, the bank and the Phase-1 state.
struct Transformer::RowSplit {
  int64_t rows = 0;      // T: rows of the step
  int64_t padded = 0;    // T rounded up to a multiple of the group size (sharded), else T
  int64_t begin = 0;     // first row this rank holds
  int64_t local = 0;     // rows this rank holds (padded / P, or T)
  bool sharded = false;  // sequence-parallel step
};

Tensor Transformer::upload(const Tensor& t) {
  if (!t.defined()) return t;
  weight_bytes_ += t.nbytes();
  return backend_.upload(t);
}

// Folds every query of every Phase-1 group (a delta_v attention step has a second one, its V
// stream's) and gathers what each mixing step reads besides: bias, null source and its
// constant logits, gate, pre-gate.
void Transformer::load_step_mix(const ModelWeights& weights) {
  const int64_t d = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  step_mix_.assign(plan_.steps.size(), StepMix{});
  for (const DepthGroup& group : plan_.groups) {
    std::vector<float> queries(static_cast<size_t>(group.num_slots) * d);
    for (int step_index : group.steps) {
      const DepthStep& step = plan_.steps[step_index];
      const AttnResWeights* res = depth_weights_of(weights, step);
      ATTNRES_CHECK(res != nullptr, "a mixing step without depth weights");
      StepMix& mix = step_mix_[step_index];
      float* query = &queries[static_cast<size_t>(step.slot) * d];
      fold_query(*res, d, query);
      mix.bias = step.partial_is_source ? res->bias.value_or(0.0f) : 0.0f;
      if (step.null_source) {
        ATTNRES_CHECK(res->null_source.defined(), "a null-source step without a null source");
        mix.null_source = upload(widened(res->null_source));
        mix.null_logit = constant_logit(query, res->null_source, d, eps);
      }
      if (step.value_slot >= 0) {
        const auto& v_res = weights.layers[step.layer].v_res;
        ATTNRES_CHECK(v_res.has_value(), "a V-stream mix without v_res weights");
        float* value_query = &queries[static_cast<size_t>(step.value_slot) * d];
        fold_query(*v_res, d, value_query);
        if (step.null_source) {
          mix.value_null_logit = constant_logit(value_query, res->null_source, d, eps);
        }
      }
      if (step.gated && res->gate_blend) {
        mix.gate = Backend::DepthGate::Scalar;
        mix.gate_blend = *res->gate_blend;
      } else if (step.gated) {
        ATTNRES_CHECK(res->gate_proj.defined(), "a gated step without gate weights");
        mix.gate = Backend::DepthGate::Vector;
        mix.gate_proj = upload(res->gate_proj);
        mix.gate_bias = upload(res->gate_bias);
      }
      if (step.pre_gated) {
        mix.pre_gate = upload(res->pre_gate);
        mix.pre_gate_bias = upload(res->pre_gate_bias);
      }
    }
    group_queries_.push_back(upload(host_f32(queries, {group.num_slots, d})));
  }
}

Backend::DepthMixArgs Transformer::mix_args(size_t i, int slot, const Tensor& m, const Tensor& s,
                                            const Tensor& o, const Tensor& query,
                                            const Tensor* gate_logits) const {
  const DepthStep& step = plan_.steps[i];
  const StepMix& w = step_mix_[i];
  Backend::DepthMixArgs mix;
  mix.mix_eps = config_.rms_norm_eps;
  mix.m = &m;
  mix.s = &s;
  mix.o = &o;
  mix.query = &query;
  mix.bias = w.bias;
  mix.partial_is_source = step.partial_is_source;
  mix.adds_partial = step.adds_partial;
  if (step.null_source) {
    mix.null_source = &w.null_source;
    mix.null_logit = slot == step.value_slot ? w.value_null_logit : w.null_logit;
  }
  mix.gate = w.gate;
  mix.gate_blend = w.gate_blend;
  mix.gate_logits = w.gate == Backend::DepthGate::Vector ? gate_logits : nullptr;
  return mix;
}

Transformer::Transformer(const ModelConfig& config, const ModelWeights& weights, Backend& backend,
                         ParallelRole parallel, DType depth_bank_dtype)
    : config_(config),
      backend_(backend),
      plan_(DepthPlan::build(config, weights.final_res.has_value())),
      bank_(backend, depth_bank_dtype),
      parallel_(parallel),
      depth_layout_(make_depth_attention_layout(plan_)) {
  if (!backend_.capabilities().depth_bank_dtypes.contains(depth_bank_dtype)) {
    throw Error("--depth-bank-dtype " + storage_dtype_name(depth_bank_dtype) + ": the " +
                backend_.name() + " backend's depth ops read an f32 bank (not yet this dtype)");
  }
  const auto backend_reads = [&](DType f) {
    return backend_.capabilities().weight_dtypes.contains(f);
  };
  if (weights.quant_format &&
      !std::ranges::all_of(recipe_formats(*weights.quant_format), backend_reads)) {
    throw Error("--quantization " + quant_format_name(*weights.quant_format) +
                " is not supported by the " + backend_.name() + " backend yet");
  }
  weights_.embed_tokens = backend_.upload(weights.embed_tokens);
  weights_.final_norm = upload(weights.final_norm);
  // A tied LM head is the embedding's memory: upload it once (a second upload is a second
  // copy on a GPU, 311 MB at 0.6B). Decode reads all of it, so it counts in weight_bytes_.
  if (weights.lm_head.data == weights.embed_tokens.data &&
      weights.lm_head.dtype == weights.embed_tokens.dtype &&
      weights.lm_head.shape == weights.embed_tokens.shape) {
    weights_.lm_head = weights_.embed_tokens;
    weight_bytes_ += weights_.lm_head.nbytes();
  } else {
    weights_.lm_head = upload(weights.lm_head);
  }
  for (const LayerWeights& src : weights.layers) {
    LayerWeights dst;
    for (auto [to, from] : {std::pair{&dst.input_norm, &src.input_norm},
                            {&dst.q_proj, &src.q_proj},
                            {&dst.k_proj, &src.k_proj},
                            {&dst.v_proj, &src.v_proj},
                            {&dst.o_proj, &src.o_proj},
                            {&dst.q_norm, &src.q_norm},
                            {&dst.k_norm, &src.k_norm},
                            {&dst.post_attention_norm, &src.post_attention_norm},
                            {&dst.gate_proj, &src.gate_proj},
                            {&dst.up_proj, &src.up_proj},
                            {&dst.down_proj, &src.down_proj}}) {
      *to = upload(*from);
    }
    // Biases in f32 (exact: a linear adds the bias widened to f32 anyway), the type a GEMM
    // epilogue takes (kernels/cuda/cuda_lt_gemm.h).
    for (auto [to, from] : {std::pair{&dst.q_bias, &src.q_bias},
                            {&dst.k_bias, &src.k_bias},
                            {&dst.v_bias, &src.v_bias},
                            {&dst.o_bias, &src.o_bias},
                            {&dst.gate_bias, &src.gate_bias},
                            {&dst.up_bias, &src.up_bias},
                            {&dst.down_bias, &src.down_bias}}) {
      if (from->defined()) *to = upload(widened(*from));
    }
    weights_.layers.push_back(std::move(dst));
  }

  load_step_mix(weights);
  std::vector<float> inv_freq = config_.rope_inv_freq();
  inv_freq_ = backend_.upload(host_f32(inv_freq, {static_cast<int64_t>(inv_freq.size())}));
}

Backend::PrenormArgs Transformer::prenorm_args(const DepthStep& step, const StepMixes& mixes,
                                               Scratch& s) const {
  Backend::PrenormArgs prenorm;
  prenorm.mix = mixes.args[0];
  prenorm.partial = &bank_.partial();
  prenorm.gain = &prenorm_gain(step);
  prenorm.eps = config_.rms_norm_eps;
  prenorm.normed = &s.normed;
  return prenorm;
}

void Transformer::attention_input(const DepthStep& step, const StepMixes& mixes,
                                  const BatchMeta& batch, KvCacheLayer& cache,
                                  const RowSplit& split, Scratch& s) {
  const LayerWeights& w = weights_.layers[step.layer];
  const Backend::LinearTarget qkv[] = {{&w.q_proj, bias_of(w.q_bias), &s.q},
                                       {&w.k_proj, bias_of(w.k_bias), &s.k},
                                       {&w.v_proj, bias_of(w.v_bias), &s.v}};
  // The PreNorm, q / k / v, the per-head norms, RoPE and the KV store as one op
  // (Backend::prenorm_qkv_rope_store), where the normed rows are read only by the
  // projections: not where they are all-gathered first (a sharded step), nor under delta_v,
  // whose V stream has its own mix (docs/ATTNRES.md §2d).
  if (!split.sharded && step.value_slot < 0) {
    Backend::RopeStoreArgs rope;
    rope.head_dim = config_.head_dim;
    rope.q_gain = bias_of(w.q_norm);
    rope.k_gain = bias_of(w.k_norm);
    rope.eps = config_.rms_norm_eps;
    rope.inv_freq = &inv_freq_;
    rope.batch = &batch;
    rope.cache = &cache;
    backend_.prenorm_qkv_rope_store(prenorm_args(step, mixes, s), qkv, rope);
    return;
  }
  mix_and_norm(step, mixes, s.normed, s);
  const Tensor input = gather_input(split, s.normed, s.gathered);
  // q, k and v read one input (delta_v: v its own), so one call.
  if (step.value_slot < 0) {
    backend_.linear_many(input, qkv);
  } else {
    backend_.linear_many(input, std::span(qkv, 2));
    backend_.linear(gather_input(split, s.normed_v, s.gathered_v), w.v_proj, bias_of(w.v_bias),
                    s.v);
  }
  backend_.qk_norm_rope_store(s.q, s.k, s.v, config_.head_dim, bias_of(w.q_norm), bias_of(w.k_norm),
                              config_.rms_norm_eps, inv_freq_, batch, cache);
}

void Transformer::attention_output(int layer, const BatchMeta& batch, const KvCacheLayer& cache,
                                   Scratch& s, Tensor& out, const Tensor* residual,
                                   Tensor* entry) {
  // yarn multiplies cos and sin by an attention factor, which scales both q and k: the
  // same as scaling the attention logits by its square, so the rope op stays unscaled.
  const float attention_factor = config_.rope_attention_factor();
  const float scale =
      attention_factor * attention_factor / std::sqrt(static_cast<float>(config_.head_dim));
  backend_.attention(s.q, cache, batch, config_.head_dim, scale, s.attn);
  const LayerWeights& w = weights_.layers[layer];
  output_linear(s.attn, w.o_proj, w.o_bias, out, residual, entry);
}

void Transformer::mlp_input(const DepthStep& step, const StepMixes& mixes, const RowSplit& split,
                            Scratch& s) {
  const LayerWeights& w = weights_.layers[step.layer];
  // The PreNorm, gate, up and SwiGLU as one op (Backend::prenorm_linear_swiglu), unless the
  // normed rows are all-gathered first (a sharded step).
  if (!split.sharded) {
    backend_.prenorm_linear_swiglu(prenorm_args(step, mixes, s), w.gate_proj, bias_of(w.gate_bias),
                                   w.up_proj, bias_of(w.up_bias), s.gate, s.up, s.act);
    return;
  }
  mix_and_norm(step, mixes, s.normed, s);
  backend_.linear_swiglu(gather_input(split, s.normed, s.gathered), w.gate_proj,
                         bias_of(w.gate_bias), w.up_proj, bias_of(w.up_bias), s.gate, s.up, s.act);
}

void Transformer::mlp_output(int layer, Scratch& s, Tensor& out, const Tensor* residual,
                             Tensor* entry) {
  const LayerWeights& w = weights_.layers[layer];
  output_linear(s.act, w.down_proj, w.down_bias, out, residual, entry);
}

void Transformer::mlp(const DepthStep& step, const StepMixes& mixes, const RowSplit& split,
                      Scratch& s, Tensor& out, const Tensor* residual, Tensor* entry) {
  // The residual add fused (so neither sharded nor tensor-parallel: output_slot's condition)
  // and no bank entry to write: the sublayer whole in one op, which CUDA may run as one launch.
  // output_slot queues no op before the input half here unless it fuses, and then only the
  // partial's copy into its own buffer, which the PreNorm then reads: the same values.
  if (residual && !entry && !split.sharded) {
    const LayerWeights& w = weights_.layers[step.layer];
    backend_.prenorm_mlp_residual(prenorm_args(step, mixes, s), w.gate_proj, bias_of(w.gate_bias),
                                  w.up_proj, bias_of(w.up_bias), s.gate, s.up, s.act, w.down_proj,
                                  bias_of(w.down_bias), *residual, out);
    return;
  }
  mlp_input(step, mixes, split, s);
  mlp_output(step.layer, s, out, residual, entry);
}

void Transformer::output_linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out,
                                const Tensor* residual, Tensor* entry) {
  ATTNRES_CHECK(!entry || residual, "a pushed entry without the residual add");
  if (entry) {
    backend_.linear_residual_push(x, w, bias_of(bias), *residual, out, *entry);
  } else if (residual) {
    backend_.linear_residual(x, w, bias_of(bias), *residual, out);
  } else {
    backend_.linear(x, w, bias_of(bias), out);
  }
}

Transformer::RowSplit Transformer::split_rows(const BatchMeta& batch) const {
  RowSplit split;
  split.rows = split.padded = split.local = batch.num_tokens;
  if (!parallel_.comm || parallel_.sequence_parallel_min_tokens <= 0) return split;
  int64_t prefill_tokens = 0;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int64_t n = batch.query_start[s + 1] - batch.query_start[s];
    if (n > 1) prefill_tokens += n;
  }
  if (prefill_tokens < parallel_.sequence_parallel_min_tokens) return split;
  const int64_t P = parallel_.comm->size();
  split.sharded = true;
  split.padded = (split.rows + P - 1) / P * P;
  split.local = split.padded / P;
  split.begin = split.local * parallel_.comm->rank();
  return split;
}

Tensor Transformer::gather_input(const RowSplit& split, Tensor& normed_local, Tensor& gathered) {
  if (!split.sharded) return normed_local;
  parallel_.comm->all_gather(normed_local, gathered);
  return gathered.rows(0, split.rows);
}

Tensor Transformer::reduce_output(const RowSplit& split, Scratch& s, Tensor& written) {
  if (split.sharded) {
    // Rows [T, padded) of `unreduced` are never written: they stay zero.
    parallel_.comm->reduce_scatter_sum(s.unreduced, s.reduced);
    return s.reduced;
  }
  if (parallel_.comm) parallel_.comm->all_reduce_sum(written);
  return written;
}

Tensor Transformer::mix_depth_weights(size_t i, int slot, const Tensor* source_gate_logits,
                                      const RowSplit& split, std::span<const int32_t> rows) {
  const DepthStep& step = plan_.steps[i];
  const StepMix& w = step_mix_[i];
  Backend::DepthSourceSwitches sources;
  sources.partial_is_source = step.partial_is_source;
  sources.has_null = step.null_source;
  sources.null_logit = slot == step.value_slot ? w.value_null_logit : w.null_logit;
  sources.source_gate_logits = source_gate_logits;
  const int64_t width = sources.width(step.num_bank_sources);
  const Tensor query = group_queries_[step.group].row(slot);
  Tensor local = backend_.alloc({split.local, width}, DType::F32);
  const Tensor bank = bank_.entries_from(step.bank_first, step.bank_first + step.num_bank_sources);
  backend_.depth_weights(query, bank, step.num_bank_sources, bank_.partial(), w.bias,
                         config_.rms_norm_eps, local, sources);
  Tensor all = local;
  if (split.sharded) {  // each rank holds its slice of the rows: gather them all
    all = backend_.alloc({split.padded, width}, DType::F32);
    parallel_.comm->all_gather(local, all);
  }
  Tensor picked = backend_.alloc({static_cast<int64_t>(rows.size()), width}, DType::F32);
  backend_.gather_rows(all, rows, picked);
  return picked;
}

void Transformer::download_depth_weights(const std::vector<Tensor>& per_mix,
                                         const DepthWeightsRequest& depth) {
  const size_t num_rows = depth.rows.size();
  const size_t mixes = static_cast<size_t>(depth_layout_.rows());
  const size_t cols = static_cast<size_t>(depth_layout_.cols());
  ATTNRES_CHECK(per_mix.size() == mixes, "depth weights: one tensor per depth mix");
  depth.weights->assign(num_rows * mixes * cols, kDepthAttentionUnused);
  std::vector<float> host;
  for (size_t k = 0; k < mixes; ++k) {
    const std::vector<int>& columns = depth_layout_.row_columns[k];
    const size_t width = static_cast<size_t>(per_mix[k].dim(1));
    ATTNRES_CHECK(columns.size() == width, "depth weights: layout and op disagree on sources");
    host.resize(num_rows * width);
    backend_.download(per_mix[k], host.data());
    for (size_t r = 0; r < num_rows; ++r) {
      float* dst = depth.weights->data() + (r * mixes + k) * cols;
      for (size_t j = 0; j < width; ++j) dst[columns[j]] = host[r * width + j];
    }
  }
}

Tensor Transformer::forward(const BatchMeta& batch, KvCache& cache,
                            std::span<const int32_t> logit_rows, const DepthWeightsRequest* depth) {
  const Tensor hidden = forward_hidden(batch, cache, logit_rows, depth);
  if (hidden.dim(0) == 0) return backend_.alloc({0, config_.vocab_size}, DType::F32);
  return lm_head(hidden);
}

Tensor Transformer::lm_head(const Tensor& hidden) {
  Tensor logits = backend_.alloc({hidden.dim(0), config_.vocab_size}, DType::F32);
  backend_.linear(hidden, weights_.lm_head, nullptr, logits);
  return logits;
}

// The forward (docs/ATTNRES.md §2, §3): embed; then for each step of the depth plan, the depth mix
// over the bank and the partial, RMS-normed, feeds an attention or MLP sublayer whose output
// goes into the partial and the bank; the last step's mix, normed by the final norm, is the
// LM head's input.
Tensor Transformer::forward_hidden(const BatchMeta& batch, KvCache& cache,
                                   std::span<const int32_t> logit_rows,
                                   const DepthWeightsRequest* depth) {
  const int64_t T = batch.num_tokens;
  ATTNRES_CHECK(T > 0 && static_cast<int64_t>(batch.token_ids.size()) == T, "empty batch");
  const RowSplit split = split_rows(batch);
  backend_.prepare_batch(batch);
  Scratch s = alloc_scratch(split, static_cast<int64_t>(logit_rows.size()));
  bank_.begin(plan_, embed(batch, split, s), split.sharded);
  footprint_ = {T, split.local, split.sharded, bank_.bytes()};
  DepthReport report;
  if (depth && !depth->rows.empty() && !plan_.groups.empty()) report.request = depth;

  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    StepMixes mixes;
    depth_mix(i, split, s, mixes, report);
    if (plan_.steps[i].kind == SublayerKind::Final) {
      mix_and_norm(plan_.steps[i], mixes, s.hidden, s);
    } else {
      sublayer(i, mixes, batch, cache, split, s);
    }
  }

  if (report.request && depth->weights) download_depth_weights(report.per_mix, *depth);
  return hidden_rows(split, s, logit_rows);
}

Transformer::Scratch Transformer::alloc_scratch(const RowSplit& split, int64_t hidden_rows) {
  const int64_t T = split.rows, L = split.local;
  const int64_t d = config_.hidden_size;
  const int64_t q_width = static_cast<int64_t>(config_.num_heads) * config_.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
  const int64_t ffn = config_.intermediate_size;
  // The linears' inputs in the dtype the backend reads them in (Backend::linear_input_dtype:
  // bf16 where its GEMM would round them anyway). Not the sublayer inputs and the LM head's
  // rows of a sequence-parallel step: those are all-gathered (f32) first.
  const auto& layers = weights_.layers;
  const auto local_input_dtype = [&](std::initializer_list<Tensor LayerWeights::*> readers) {
    return split.sharded ? DType::F32 : linear_input_dtype(backend_, L, layers, readers);
  };
  Scratch s;
  s.q = backend_.alloc({T, q_width}, DType::F32);
  s.k = backend_.alloc({T, kv_width}, DType::F32);
  s.v = backend_.alloc({T, kv_width}, DType::F32);
  s.attn = backend_.alloc({T, q_width},
                          linear_input_dtype(backend_, T, layers, {&LayerWeights::o_proj}));
  s.gate = backend_.alloc({T, ffn}, DType::F32);
  s.up = backend_.alloc({T, ffn}, DType::F32);
  s.act =
      backend_.alloc({T, ffn}, linear_input_dtype(backend_, T, layers, {&LayerWeights::down_proj}));
  s.reduced = backend_.alloc({L, d}, DType::F32);
  if (split.sharded) {
    s.gathered = backend_.alloc({split.padded, d}, DType::F32);
    s.unreduced = backend_.alloc({split.padded, d}, DType::F32);
  }
  s.sublayer_out = split.sharded ? s.unreduced.rows(0, T) : s.reduced;
  s.normed = backend_.alloc(
      {L, d},
      local_input_dtype({&LayerWeights::q_proj, &LayerWeights::k_proj, &LayerWeights::v_proj,
                         &LayerWeights::gate_proj, &LayerWeights::up_proj}));
  // Only allocated by models whose steps read them.
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    if (plan_.steps[i].pre_gated || step_mix_[i].gate == Backend::DepthGate::Vector) {
      s.gate_logits = backend_.alloc({L, d}, DType::F32);
      break;
    }
  }
  for (const DepthStep& step : plan_.steps) {
    if (step.value_slot < 0) continue;
    s.normed_v = backend_.alloc({L, d}, local_input_dtype({&LayerWeights::v_proj}));
    if (split.sharded) s.gathered_v = backend_.alloc({split.padded, d}, DType::F32);
    break;
  }
  const DType hidden_dtype =
      split.sharded ? DType::F32 : backend_.linear_input_dtype(hidden_rows, weights_.lm_head.dtype);
  s.hidden = backend_.alloc({L, d}, hidden_dtype);
  return s;
}

Tensor Transformer::embed(const BatchMeta& batch, const RowSplit& split, Scratch& s) {
  Tensor partial = backend_.alloc({split.local, config_.hidden_size}, DType::F32);
  if (split.sharded) {
    // Embed every row (a table lookup), keep this rank's; padding rows stay zero.
    Tensor all_rows = s.gathered.rows(0, split.rows);
    backend_.embedding(weights_.embed_tokens, batch, all_rows);
    backend_.copy(s.gathered.rows(split.begin, split.begin + split.local), partial);
  } else {
    backend_.embedding(weights_.embed_tokens, batch, partial);
  }
  return partial;
}

void Transformer::depth_mix(size_t i, const RowSplit& split, Scratch& s, StepMixes& mixes,
                            DepthReport& report) {
  const DepthStep& step = plan_.steps[i];
  if (!step.mixes) return;  // plain pre-norm (or first_layer's layer 0): h = p
  const StepMix& w = step_mix_[i];
  // pre_gated: the gate on the sources; sigmoid_vector: the gate after the mix. Both are
  // computed from x, the partial before any reset.
  const Tensor* source_gate = nullptr;
  if (step.pre_gated) {
    backend_.linear(bank_.partial(), w.pre_gate, &w.pre_gate_bias, s.gate_logits);
    source_gate = &s.gate_logits;
  } else if (w.gate == Backend::DepthGate::Vector) {
    backend_.linear(bank_.partial(), w.gate_proj, &w.gate_bias, s.gate_logits);
  }
  const DepthGroup& group = plan_.groups[step.group];
  const DepthBank::Phase1& phase1 = bank_.phase1();
  // A shared prefix of one entry: no Phase 1 where the backend mixes without it (its state
  // would be the entry itself, copied into a row per query); each step reads the entry
  // as its first newer one.
  const bool without_phase1 = group.num_bank_sources == 1 && !step.pre_gated &&
                              backend_.capabilities().mixes_without_phase1;
  const int shared_end = group.bank_first + group.num_bank_sources;
  if (step.slot == 0 && !without_phase1) {  // Phase 1, once for every step of the group
    Tensor gm = phase1.m.rows(0, group.num_slots), gs = phase1.s.rows(0, group.num_slots),
           go = phase1.o.rows(0, group.num_slots);
    backend_.depth_phase1(group_queries_[step.group],
                          bank_.entries_from(step.bank_first, shared_end), group.num_bank_sources,
                          config_.rms_norm_eps, gm, gs, go, source_gate);
  }
  // Bank entries pushed since the group's Phase 1 ran: this step's Phase 2 merges them.
  if (step.num_newer_sources > 0 || without_phase1) {
    const int first = without_phase1 ? group.bank_first : shared_end;
    mixes.newer = bank_.entries(first, shared_end + step.num_newer_sources);
  }
  const int slots[2] = {step.slot, step.value_slot};
  for (int k = 0; k < 2 && slots[k] >= 0; ++k) {
    const int slot = slots[k];
    if (report.request) {
      report.per_mix.push_back(
          mix_depth_weights(i, slot, source_gate, split, report.request->rows));
    }
    mixes.m[k] = phase1.m.row(slot), mixes.s[k] = phase1.s.row(slot);
    mixes.o[k] = phase1.o.row(slot);
    mixes.query[k] = group_queries_[step.group].row(slot);
    Backend::DepthMixArgs& args = mixes.args[k];
    args = mix_args(i, slot, mixes.m[k], mixes.s[k], mixes.o[k], mixes.query[k], &s.gate_logits);
    args.newer = mixes.newer.defined() ? &mixes.newer : nullptr;
    if (without_phase1) args.m = args.s = args.o = nullptr;
  }
}

const Tensor& Transformer::prenorm_gain(const DepthStep& step) const {
  if (step.kind == SublayerKind::Final) return weights_.final_norm;
  const LayerWeights& layer = weights_.layers[step.layer];
  return step.kind == SublayerKind::Attention ? layer.input_norm : layer.post_attention_norm;
}

void Transformer::mix_and_norm(const DepthStep& step, const StepMixes& mixes, Tensor& normed,
                               Scratch& s) {
  const float eps = config_.rms_norm_eps;
  if (step.value_slot >= 0) {
    // The two streams of delta_v share their sources, so one call reads them once.
    backend_.depth_phase2_prenorm_pair(mixes.args[0], mixes.args[1], bank_.partial(),
                                       prenorm_gain(step), eps, normed, s.normed_v);
  } else {
    backend_.depth_phase2_prenorm(mixes.args[0], bank_.partial(), prenorm_gain(step), eps, normed);
  }
}

void Transformer::sublayer(size_t i, const StepMixes& mixes, const BatchMeta& batch, KvCache& cache,
                           const RowSplit& split, Scratch& s) {
  const DepthStep& step = plan_.steps[i];
  KvCacheLayer& layer_cache = cache.layers[step.layer];
  const bool attention = step.kind == SublayerKind::Attention;
  // An MLP whose halves are adjacent (no push-and-reset between) runs in mlp(), after the
  // bank has said where its output goes: whole where the residual add is fused.
  const bool mlp_whole = !attention && !step.push_and_reset_after_mix;
  // The input half reads the partial (the mix's last source, the residual): before a
  // push-and-reset changes it.
  if (attention) {
    attention_input(step, mixes, batch, layer_cache, split, s);
  } else if (!mlp_whole) {
    mlp_input(step, mixes, split, s);
  }
  if (step.push_and_reset_after_mix) bank_.push_and_reset();
  // The residual add as the last linear's epilogue, where the output needs no sum over the
  // ranks first (tensor or sequence parallelism); the bank says where the output goes, and
  // whether the last linear also writes the entry the next step's push_and_reset pushes.
  const bool can_fuse_residual =
      backend_.capabilities().fuses_linear_residual && !parallel_.comm && !split.sharded;
  const DepthStep* next = i + 1 < plan_.steps.size() ? &plan_.steps[i + 1] : nullptr;
  DepthBank::OutputSlot slot = bank_.output_slot(step, next, can_fuse_residual, s.sublayer_out);
  Tensor out = slot.out;
  Tensor* entry = slot.entry.defined() ? &slot.entry : nullptr;
  if (attention) {
    attention_output(step.layer, batch, layer_cache, s, out, slot.residual, entry);
  } else if (mlp_whole) {
    mlp(step, mixes, split, s, out, slot.residual, entry);
  } else {
    mlp_output(step.layer, s, out, slot.residual, entry);
  }
  bank_.add_output(step, slot.residual ? Tensor() : reduce_output(split, s, out));
}

Tensor Transformer::hidden_rows(const RowSplit& split, Scratch& s,
                                std::span<const int32_t> logit_rows) {
  const int64_t rows = static_cast<int64_t>(logit_rows.size());
  // A step made only of unfinished prefill chunks wants no logits: its work was the K/V.
  if (rows == 0) return backend_.alloc({0, config_.hidden_size}, DType::F32);
  const Tensor all_hidden = gather_input(split, s.hidden, s.gathered);
  // Every row, in order (a decode step): the rows themselves, with no gather (and so no row
  // ids staged for the device, which a replayed step graph could not restage).
  bool every_row_in_order = rows == split.rows;
  for (int64_t r = 0; every_row_in_order && r < rows; ++r) every_row_in_order = logit_rows[r] == r;
  if (every_row_in_order) return all_hidden;
  Tensor selected = backend_.alloc({rows, config_.hidden_size}, all_hidden.dtype);
  backend_.gather_rows(all_hidden, logit_rows, selected);
  return selected;
}

}  // namespace attnres
