#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>

#include "engine/core/error.h"
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
      bank_dtype_(depth_bank_dtype),
      parallel_(parallel),
      depth_layout_(make_depth_attention_layout(plan_)) {
  if (!backend_.supports_depth_bank_dtype(bank_dtype_)) {
    throw Error("--depth-bank-dtype " + storage_dtype_name(bank_dtype_) + ": the " +
                backend_.name() + " backend's depth ops read an f32 bank (not yet this dtype)");
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

void Transformer::project_input(const DepthStep& step, const Tensor& normed,
                                const Tensor& value_input, Scratch& s) {
  const LayerWeights& w = weights_.layers[step.layer];
  if (step.kind == SublayerKind::Mlp) {
    backend_.linear_swiglu(normed, w.gate_proj, bias_of(w.gate_bias), w.up_proj, bias_of(w.up_bias),
                           s.gate, s.up, s.act);
    return;
  }
  // q, k and v read one input (delta_v: v its own), so one call.
  const Backend::LinearTarget qkv[] = {{&w.q_proj, bias_of(w.q_bias), &s.q},
                                       {&w.k_proj, bias_of(w.k_bias), &s.k},
                                       {&w.v_proj, bias_of(w.v_bias), &s.v}};
  const bool shared_input = value_input.data == normed.data;
  backend_.linear_many(normed, std::span(qkv, shared_input ? 3 : 2));
  if (!shared_input) backend_.linear(value_input, w.v_proj, bias_of(w.v_bias), s.v);
}

void Transformer::project_prenormed(const DepthStep& step, const Backend::PrenormArgs& prenorm,
                                    const BatchMeta& batch, KvCacheLayer& cache, Scratch& s) {
  const LayerWeights& w = weights_.layers[step.layer];
  if (step.kind == SublayerKind::Mlp) {
    backend_.prenorm_linear_swiglu(prenorm, w.gate_proj, bias_of(w.gate_bias), w.up_proj,
                                   bias_of(w.up_bias), s.gate, s.up, s.act);
    return;
  }
  const Backend::LinearTarget qkv[] = {{&w.q_proj, bias_of(w.q_bias), &s.q},
                                       {&w.k_proj, bias_of(w.k_bias), &s.k},
                                       {&w.v_proj, bias_of(w.v_bias), &s.v}};
  // RoPE and the KV store with the projections: the cache is read only by the attention,
  // which runs after this step's push-and-reset, so writing it here changes nothing.
  Backend::RopeStoreArgs rope;
  rope.head_dim = config_.head_dim;
  rope.q_gain = bias_of(w.q_norm);
  rope.k_gain = bias_of(w.k_norm);
  rope.eps = config_.rms_norm_eps;
  rope.inv_freq = &inv_freq_;
  rope.batch = &batch;
  rope.cache = &cache;
  backend_.prenorm_qkv_rope_store(prenorm, qkv, rope);
}

void Transformer::attention_rest(int layer, const BatchMeta& batch, KvCacheLayer& cache, Scratch& s,
                                 Tensor& out, const Tensor* residual, bool roped_and_stored) {
  const LayerWeights& w = weights_.layers[layer];
  if (!roped_and_stored) {
    backend_.qk_norm_rope_store(s.q, s.k, s.v, config_.head_dim, bias_of(w.q_norm),
                                bias_of(w.k_norm), config_.rms_norm_eps, inv_freq_, batch, cache);
  }
  // yarn multiplies cos and sin by an attention factor, which scales both q and k: the
  // same as scaling the attention logits by its square, so the rope op stays unscaled.
  const float attention_factor = config_.rope_attention_factor();
  const float scale =
      attention_factor * attention_factor / std::sqrt(static_cast<float>(config_.head_dim));
  backend_.attention(s.q, cache, batch, config_.head_dim, scale, s.attn);
  output_linear(s.attn, w.o_proj, w.o_bias, out, residual);
}

void Transformer::mlp_rest(int layer, Scratch& s, Tensor& out, const Tensor* residual) {
  const LayerWeights& w = weights_.layers[layer];
  output_linear(s.act, w.down_proj, w.down_bias, out, residual);
}

void Transformer::output_linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out,
                                const Tensor* residual) {
  if (residual) {
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

Tensor Transformer::mix_depth_weights(size_t i, int slot, const Tensor& bank, const Tensor& partial,
                                      const Tensor* source_gate_logits, const RowSplit& split,
                                      std::span<const int32_t> rows) {
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
  backend_.depth_weights(query, bank.rows(step.bank_first, bank.dim(0)), step.num_bank_sources,
                         partial, w.bias, config_.rms_norm_eps, local, sources);
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

Tensor Transformer::kept_view(Tensor& kept, const Shape& shape, DType dtype) {
  int64_t numel = 1;
  for (int64_t n : shape) numel *= n;
  if (!kept.defined() || kept.numel() < numel || kept.dtype != dtype) {
    kept = Tensor();  // free the smaller buffer first: the peak is the new one alone
    kept = backend_.alloc_kept({std::max<int64_t>(numel, 1)}, dtype);
  }
  return Tensor::wrap(kept.data, shape, dtype, kept.owner, kept.device);
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

Tensor Transformer::forward_hidden(const BatchMeta& batch, KvCache& cache,
                                   std::span<const int32_t> logit_rows,
                                   const DepthWeightsRequest* depth) {
  const int64_t T = batch.num_tokens;
  const int64_t d = config_.hidden_size;
  ATTNRES_CHECK(T > 0 && static_cast<int64_t>(batch.token_ids.size()) == T, "empty batch");
  const int64_t q_width = static_cast<int64_t>(config_.num_heads) * config_.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
  const int64_t ffn = config_.intermediate_size;
  const RowSplit split = split_rows(batch);
  const int64_t L = split.local;  // rows of the residual stream held here

  // The linears' inputs in the dtype the backend reads them in (Backend::linear_input_dtype:
  // bf16 where its GEMM would round them anyway). Not the sublayer inputs and the LM head's
  // rows of a sequence-parallel step: those are all-gathered (f32) first.
  const auto& layers = weights_.layers;
  const DType attn_dtype = linear_input_dtype(backend_, T, layers, {&LayerWeights::o_proj});
  const DType act_dtype = linear_input_dtype(backend_, T, layers, {&LayerWeights::down_proj});
  const DType normed_dtype =
      split.sharded
          ? DType::F32
          : linear_input_dtype(backend_, L, layers,
                               {&LayerWeights::q_proj, &LayerWeights::k_proj, &LayerWeights::v_proj,
                                &LayerWeights::gate_proj, &LayerWeights::up_proj});
  const DType normed_v_dtype =
      split.sharded ? DType::F32 : linear_input_dtype(backend_, L, layers, {&LayerWeights::v_proj});
  const DType hidden_dtype =
      split.sharded ? DType::F32
                    : backend_.linear_input_dtype(static_cast<int64_t>(logit_rows.size()),
                                                  weights_.lm_head.dtype);

  backend_.prepare_batch(batch);
  Scratch s;
  s.q = backend_.alloc({T, q_width}, DType::F32);
  s.k = backend_.alloc({T, kv_width}, DType::F32);
  s.v = backend_.alloc({T, kv_width}, DType::F32);
  s.attn = backend_.alloc({T, q_width}, attn_dtype);
  s.gate = backend_.alloc({T, ffn}, DType::F32);
  s.up = backend_.alloc({T, ffn}, DType::F32);
  s.act = backend_.alloc({T, ffn}, act_dtype);
  s.reduced = backend_.alloc({L, d}, DType::F32);
  if (split.sharded) {
    s.gathered = backend_.alloc({split.padded, d}, DType::F32);
    s.unreduced = backend_.alloc({split.padded, d}, DType::F32);
  }
  Tensor partial = backend_.alloc({L, d}, DType::F32);
  Tensor normed = backend_.alloc({L, d}, normed_dtype);
  // Where a sublayer writes its (not yet summed over ranks) output: every row of the step.
  Tensor sublayer_out = split.sharded ? s.unreduced.rows(0, T) : s.reduced;

  // The bank holds completed representations; entry 0 is the embedding, and the partial
  // starts as the embedding too (docs/ATTNRES.md §2a and §2b).
  const bool attnres = !plan_.groups.empty();
  Tensor bank, phase1_m, phase1_s, phase1_o;
  int bank_size = 0;
  if (split.sharded) {
    // Embed every row (a table lookup), keep this rank's; padding rows stay zero.
    Tensor all_rows = s.gathered.rows(0, T);
    backend_.embedding(weights_.embed_tokens, batch, all_rows);
    backend_.copy(s.gathered.rows(split.begin, split.begin + L), partial);
  } else {
    backend_.embedding(weights_.embed_tokens, batch, partial);
  }
  if (attnres) {
    const int64_t slots = plan_.max_group_size();  // query rows, V streams included
    DepthWorkspace& ws = depth_workspace_;
    bank = kept_view(ws.bank, {plan_.bank_capacity, L, d}, bank_dtype_);
    phase1_m = kept_view(ws.phase1_m, {slots, L});
    phase1_s = kept_view(ws.phase1_s, {slots, L});
    phase1_o = kept_view(ws.phase1_o, {slots, L, d});
    Tensor entry = bank.row(0);
    backend_.copy(partial, entry);
    bank_size = 1;
  }
  footprint_ = {T, L, split.sharded, bank.defined() ? bank.nbytes() : 0};
  auto push_partial = [&] {
    Tensor entry = bank.row(bank_size++);
    backend_.copy(partial, entry);
  };
  // full (and block at a block's end): the sum partial + out is the next bank entry. Written
  // there directly (an f32 bank), the partial then *is* that entry (a view) until a step
  // changes it in place without pushing, which first takes it back into its own buffer: full
  // pushes after every sublayer, so its per-sublayer copy into the bank goes away. A bf16
  // bank stores rounded entries, so there the partial keeps its own buffer and is copied.
  const bool f32_bank = bank_dtype_ == DType::F32;
  const Tensor own_partial = partial;
  bool partial_in_bank = false;
  auto take_back_partial = [&](bool keep_values) {
    if (!partial_in_bank) return;
    Tensor own = own_partial;
    if (keep_values) backend_.copy(partial, own);
    partial = own;
    partial_in_bank = false;
  };

  // Depth introspection, only when asked: each depth mix's weights of the requested rows.
  const bool report_depth = depth && !depth->rows.empty() && attnres;
  std::vector<Tensor> depth_per_step;

  // Only allocated by models whose steps need them: gate logits (sigmoid_vector, pre_gated)
  // and the V stream's sublayer input (delta_v).
  Tensor gate_logits, normed_v;
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    if (plan_.steps[i].pre_gated || step_mix_[i].gate == Backend::DepthGate::Vector) {
      gate_logits = backend_.alloc({L, d}, DType::F32);
      break;
    }
  }
  for (const DepthStep& step : plan_.steps) {
    if (step.value_slot < 0) continue;
    normed_v = backend_.alloc({L, d}, normed_v_dtype);
    if (split.sharded) s.gathered_v = backend_.alloc({split.padded, d}, DType::F32);
    break;
  }

  Tensor hidden = backend_.alloc({L, d}, hidden_dtype);
  bool open_entry_started = false;  // delta_block: whether the open entry holds a sum yet
  // delta_block's open entry: the bank's next entry itself (f32), or an f32 buffer rounded
  // into the bank when committed.
  auto open_entry = [&] {
    return f32_bank ? bank.row(bank_size) : kept_view(depth_workspace_.open_entry, {L, d});
  };
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    const DepthStep& step = plan_.steps[i];
    const StepMix& w = step_mix_[i];
    const bool final_step = step.kind == SublayerKind::Final;
    const Tensor& gain = final_step ? weights_.final_norm
                         : step.kind == SublayerKind::Attention
                             ? weights_.layers[step.layer].input_norm
                             : weights_.layers[step.layer].post_attention_norm;
    Tensor& normed_out = final_step ? hidden : normed;
    // The sublayer's projection fused with its PreNorm (Backend::prenorm_linear_*), run here,
    // before a push-and-reset changes the partial. Not where the normed rows are read again:
    // the final norm (the LM head's input), a sharded step (they are all-gathered first) and
    // delta_v's attention (two mixes feed q / k and v).
    const bool fused_projection = !final_step && !split.sharded && step.value_slot < 0;
    auto prenorm_and_project = [&](const Backend::DepthMixArgs& mix) {
      if (!fused_projection) {
        backend_.depth_phase2_prenorm(mix, partial, gain, config_.rms_norm_eps, normed_out);
        return;
      }
      Backend::PrenormArgs prenorm;
      prenorm.mix = mix;
      prenorm.partial = &partial;
      prenorm.gain = &gain;
      prenorm.eps = config_.rms_norm_eps;
      prenorm.normed = &normed_out;
      project_prenormed(step, prenorm, batch, cache.layers[step.layer], s);
    };
    if (!step.mixes) {  // plain pre-norm (or first_layer's layer 0): h = p
      prenorm_and_project(Backend::DepthMixArgs{});
    } else {
      // pre_gated: the gate on the sources; sigmoid_vector: the gate after the mix. Both are
      // computed from x, the partial before any reset.
      const Tensor* step_gate = nullptr;
      if (step.pre_gated) {
        backend_.linear(partial, w.pre_gate, &w.pre_gate_bias, gate_logits);
        step_gate = &gate_logits;
      } else if (w.gate == Backend::DepthGate::Vector) {
        backend_.linear(partial, w.gate_proj, &w.gate_bias, gate_logits);
      }
      const DepthGroup& group = plan_.groups[step.group];
      const Tensor bank_read = bank.rows(step.bank_first, plan_.bank_capacity);
      // A shared prefix of one entry: no Phase 1 where the backend mixes without it (its state
      // would be the entry itself, copied into a row per query); each step reads the entry
      // as its first newer one.
      const bool without_phase1 =
          group.num_bank_sources == 1 && !step.pre_gated && backend_.mixes_without_phase1();
      if (step.slot == 0 && !without_phase1) {  // Phase 1, once for every step of the group
        ATTNRES_CHECK(bank_size >= group.bank_first + group.num_bank_sources,
                      "bank not filled yet");
        Tensor gm = phase1_m.rows(0, group.num_slots), gs = phase1_s.rows(0, group.num_slots),
               go = phase1_o.rows(0, group.num_slots);
        backend_.depth_phase1(group_queries_[step.group], bank_read, group.num_bank_sources,
                              config_.rms_norm_eps, gm, gs, go,
                              step.pre_gated ? step_gate : nullptr);
      }
      // Bank entries pushed since the group's Phase 1 ran: this step's Phase 2 merges them.
      Tensor newer;
      if (step.num_newer_sources > 0 || without_phase1) {
        const int first = group.bank_first + (without_phase1 ? 0 : group.num_bank_sources);
        const int end = group.bank_first + group.num_bank_sources + step.num_newer_sources;
        ATTNRES_CHECK(bank_size >= end, "bank not filled yet");
        newer = bank.rows(first, end);
      }
      // The step's mix (delta_v's attention: its K stream's and its V stream's, two slots).
      Tensor ms[2], sums[2], os[2], queries[2];
      Backend::DepthMixArgs mixes[2];
      const int slots[2] = {step.slot, step.value_slot};
      for (int k = 0; k < 2 && slots[k] >= 0; ++k) {
        const int slot = slots[k];
        if (report_depth) {
          depth_per_step.push_back(
              mix_depth_weights(i, slot, bank, partial, step_gate, split, depth->rows));
        }
        ms[k] = phase1_m.row(slot), sums[k] = phase1_s.row(slot), os[k] = phase1_o.row(slot);
        queries[k] = group_queries_[step.group].row(slot);
        mixes[k] = mix_args(i, slot, ms[k], sums[k], os[k], queries[k], &gate_logits);
        mixes[k].newer = newer.defined() ? &newer : nullptr;
        if (without_phase1) mixes[k].m = mixes[k].s = mixes[k].o = nullptr;
      }
      // Phase 2 writes the sublayer's input (the V stream's into its own buffer); the two
      // streams of delta_v share their sources, so one call reads them once.
      if (step.value_slot >= 0) {
        backend_.depth_phase2_prenorm_pair(mixes[0], mixes[1], partial, gain, config_.rms_norm_eps,
                                           normed_out, normed_v);
      } else {
        prenorm_and_project(mixes[0]);
      }
    }
    if (final_step) break;

    if (step.push_and_reset_after_mix) {
      push_partial();
      take_back_partial(false);
      backend_.fill_zero(partial);
    }
    // Delta modes: the sublayer output is itself the next bank entry, so (unsharded) the
    // sublayer writes it there rather than into scratch and a copy.
    const bool output_into_bank = step.push_output_after && !split.sharded && f32_bank;
    // The cumulative modes' pushed sum, likewise (see take_back_partial).
    const bool sum_into_bank = step.push_after && !split.sharded && !output_into_bank && f32_bank;
    // The residual add as the sublayer's last linear's epilogue, where the output is read
    // only through that add: not where it is first summed over the ranks (tensor or sequence
    // parallelism), nor where it is itself a bank entry (delta modes, first_layer's layer 0)
    // or summed into the open entry (delta_block).
    const bool fuse_residual = backend_.fuses_linear_residual() && !parallel_.comm &&
                               !split.sharded && !step.push_output_after &&
                               !step.accumulate_output;
    if (fuse_residual && !sum_into_bank) take_back_partial(true);  // updated in place below
    Tensor step_out = output_into_bank || sum_into_bank ? bank.row(bank_size).reshape({L, d})
                      : fuse_residual                   ? partial
                                                        : sublayer_out;
    const Tensor* residual = fuse_residual ? &partial : nullptr;
    // Whether the residual add below also pushes the bank entry (add_inplace_push): where the
    // add is its own op and exactly one entry is pushed after it by a copy (a bf16 bank, or a
    // sharded step's f32 one).
    std::optional<Backend::PushedRow> fused_push;
    if (!fuse_residual && !sum_into_bank && !output_into_bank &&
        step.push_after != step.push_output_after) {
      fused_push = step.push_after ? Backend::PushedRow::Sum : Backend::PushedRow::Addend;
    }
    if (!fused_projection) {
      const Tensor input = gather_input(split, normed, s.gathered);
      const Tensor value_input =
          step.value_slot >= 0 ? gather_input(split, normed_v, s.gathered_v) : input;
      project_input(step, input, value_input, s);
    }
    if (step.kind == SublayerKind::Attention) {
      // fused_projection: project_prenormed already roped q, k and stored k, v.
      attention_rest(step.layer, batch, cache.layers[step.layer], s, step_out, residual,
                     fused_projection);
    } else {
      mlp_rest(step.layer, s, step_out, residual);
    }
    const Tensor out = fuse_residual ? Tensor() : reduce_output(split, s, step_out);
    if (sum_into_bank) {
      Tensor entry = bank.row(bank_size++).reshape({L, d});
      // out + partial: the same bits as partial + out
      if (!fuse_residual) backend_.add_inplace(entry, partial);
      partial = entry;
      partial_in_bank = true;
    } else {
      take_back_partial(true);
      if (fused_push) {
        // The residual add and the push it feeds in one op: the pushed row is read once. The
        // cumulative modes push the new partial, the delta modes the output.
        Tensor entry = bank.row(bank_size++);
        backend_.add_inplace_push(partial, out, entry, *fused_push);
      } else {
        if (!fuse_residual) backend_.add_inplace(partial, out);
        if (step.push_after) push_partial();
      }
    }
    if (step.push_output_after && fused_push != Backend::PushedRow::Addend) {
      // delta modes: the sublayer output itself is a source
      Tensor entry = bank.row(bank_size++);
      if (!output_into_bank) backend_.copy(out, entry);
    }
    if (step.accumulate_output) {  // delta_block: the open entry sums the block's outputs
      Tensor entry = open_entry();
      if (open_entry_started) {
        backend_.add_inplace(entry, out);
      } else {  // the kept buffer holds an earlier step's values: the first output overwrites
        backend_.copy(out, entry);
        open_entry_started = true;
      }
    }
    if (step.commit_open_entry) {
      if (!f32_bank) {
        Tensor entry = bank.row(bank_size);
        backend_.copy(open_entry(), entry);
      }
      ++bank_size;
      open_entry_started = false;
    }
  }

  if (report_depth && depth->weights) download_depth_weights(depth_per_step, *depth);

  const int64_t rows = static_cast<int64_t>(logit_rows.size());
  // A step made only of unfinished prefill chunks wants no logits: its work was the K/V.
  if (rows == 0) return backend_.alloc({0, d}, DType::F32);
  const Tensor all_hidden = gather_input(split, hidden, s.gathered);
  // Every row, in order (a decode step): the rows themselves, with no gather (and so no row
  // ids staged for the device, which a replayed step graph could not restage).
  bool every_row_in_order = rows == T;
  for (int64_t r = 0; every_row_in_order && r < rows; ++r) every_row_in_order = logit_rows[r] == r;
  if (every_row_in_order) return all_hidden;
  Tensor selected = backend_.alloc({rows, d}, all_hidden.dtype);
  backend_.gather_rows(all_hidden, logit_rows, selected);
  return selected;
}

}  // namespace attnres
