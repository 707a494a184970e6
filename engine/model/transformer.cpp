#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>

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
// logit is (w * g) . x / rms(x): fold them once here (ATTNRES.md §3).
void fold_query(const AttnResWeights& res, int64_t d, float* out) {
  for (int64_t k = 0; k < d; ++k) {
    out[k] = element_as_float(res.proj, k) * element_as_float(res.norm, k);
  }
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
  Tensor reduced;  // [local rows, d]: the sublayer output summed over the ranks
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

Transformer::Transformer(const ModelConfig& config, const ModelWeights& weights, Backend& backend,
                         ParallelRole parallel)
    : config_(config),
      backend_(backend),
      plan_(DepthPlan::build(config, weights.final_res.has_value())),
      parallel_(parallel),
      depth_layout_(make_depth_attention_layout(plan_)) {
  weights_.embed_tokens = backend_.upload(weights.embed_tokens);
  weights_.final_norm = upload(weights.final_norm);
  weights_.lm_head = upload(weights.lm_head);  // tied: the same memory as embed_tokens
  for (const LayerWeights& src : weights.layers) {
    LayerWeights dst;
    for (auto [to, from] : {std::pair{&dst.input_norm, &src.input_norm},
                            {&dst.q_proj, &src.q_proj},
                            {&dst.k_proj, &src.k_proj},
                            {&dst.v_proj, &src.v_proj},
                            {&dst.o_proj, &src.o_proj},
                            {&dst.q_norm, &src.q_norm},
                            {&dst.k_norm, &src.k_norm},
                            {&dst.q_bias, &src.q_bias},
                            {&dst.k_bias, &src.k_bias},
                            {&dst.v_bias, &src.v_bias},
                            {&dst.o_bias, &src.o_bias},
                            {&dst.post_attention_norm, &src.post_attention_norm},
                            {&dst.gate_proj, &src.gate_proj},
                            {&dst.up_proj, &src.up_proj},
                            {&dst.down_proj, &src.down_proj},
                            {&dst.gate_bias, &src.gate_bias},
                            {&dst.up_bias, &src.up_bias},
                            {&dst.down_bias, &src.down_bias}}) {
      *to = upload(*from);
    }
    weights_.layers.push_back(std::move(dst));
  }

  const int64_t d = config_.hidden_size;
  step_bias_.assign(plan_.steps.size(), 0.0f);
  for (const DepthGroup& group : plan_.groups) {
    std::vector<float> queries(group.steps.size() * d);
    for (size_t slot = 0; slot < group.steps.size(); ++slot) {
      const int step_index = group.steps[slot];
      const AttnResWeights* res = depth_weights_of(weights, plan_.steps[step_index]);
      ATTNRES_CHECK(res != nullptr, "a mixing step without depth weights");
      fold_query(*res, d, &queries[slot * d]);
      step_bias_[step_index] = res->bias.value_or(0.0f);
    }
    Tensor q = upload(host_f32(queries, {static_cast<int64_t>(group.steps.size()), d}));
    group_queries_.push_back(q);
  }
  std::vector<float> inv_freq = config_.rope_inv_freq();
  inv_freq_ = backend_.upload(host_f32(inv_freq, {static_cast<int64_t>(inv_freq.size())}));
}

void Transformer::attention_sublayer(int layer, const Tensor& normed, const BatchMeta& batch,
                                     KvCacheLayer& cache, Scratch& s, Tensor& out) {
  const LayerWeights& w = weights_.layers[layer];
  auto bias = [](const Tensor& b) { return b.defined() ? &b : nullptr; };
  backend_.linear(normed, w.q_proj, bias(w.q_bias), s.q);
  backend_.linear(normed, w.k_proj, bias(w.k_bias), s.k);
  backend_.linear(normed, w.v_proj, bias(w.v_bias), s.v);
  backend_.qk_norm_rope(s.q, s.k, config_.head_dim, bias(w.q_norm), bias(w.k_norm),
                        config_.rms_norm_eps, inv_freq_, batch);
  backend_.store_kv(s.k, s.v, batch, cache);
  // yarn multiplies cos and sin by an attention factor, which scales both q and k: the
  // same as scaling the attention logits by its square, so the rope op stays unscaled.
  const float attention_factor = config_.rope_attention_factor();
  const float scale =
      attention_factor * attention_factor / std::sqrt(static_cast<float>(config_.head_dim));
  backend_.attention(s.q, cache, batch, config_.head_dim, scale, s.attn);
  backend_.linear(s.attn, w.o_proj, bias(w.o_bias), out);
}

void Transformer::mlp_sublayer(int layer, const Tensor& normed, Scratch& s, Tensor& out) {
  const LayerWeights& w = weights_.layers[layer];
  auto bias = [](const Tensor& b) { return b.defined() ? &b : nullptr; };
  backend_.linear(normed, w.gate_proj, bias(w.gate_bias), s.gate);
  backend_.linear(normed, w.up_proj, bias(w.up_bias), s.up);
  backend_.swiglu(s.gate, s.up, s.act);
  backend_.linear(s.act, w.down_proj, bias(w.down_bias), out);
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

Tensor Transformer::gather_input(const RowSplit& split, Tensor& normed_local, Scratch& s) {
  if (!split.sharded) return normed_local;
  parallel_.comm->all_gather(normed_local, s.gathered);
  return s.gathered.rows(0, split.rows);
}

Tensor Transformer::reduce_output(const RowSplit& split, Scratch& s) {
  if (split.sharded) {
    // Rows [T, padded) of `unreduced` are never written: they stay zero.
    parallel_.comm->reduce_scatter_sum(s.unreduced, s.reduced);
  } else if (parallel_.comm) {
    parallel_.comm->all_reduce_sum(s.reduced);
  }
  return s.reduced;
}

Tensor Transformer::step_depth_weights(size_t i, const Tensor& bank, const Tensor& partial,
                                       const RowSplit& split, std::span<const int32_t> rows) {
  const DepthStep& step = plan_.steps[i];
  const int64_t width = step.num_bank_sources + 1;
  const Tensor query = group_queries_[step.group].row(step.slot);
  Tensor local = backend_.alloc({split.local, width}, DType::F32);
  backend_.depth_weights(query, bank, step.num_bank_sources, partial, step_bias_[i],
                         config_.rms_norm_eps, local);
  Tensor all = local;
  if (split.sharded) {  // each rank holds its slice of the rows: gather them all
    all = backend_.alloc({split.padded, width}, DType::F32);
    parallel_.comm->all_gather(local, all);
  }
  Tensor picked = backend_.alloc({static_cast<int64_t>(rows.size()), width}, DType::F32);
  backend_.gather_rows(all, rows, picked);
  return picked;
}

void Transformer::download_depth_weights(const std::vector<Tensor>& per_step,
                                         const DepthWeightsRequest& depth) {
  const size_t num_rows = depth.rows.size();
  const size_t sublayers = static_cast<size_t>(depth_layout_.rows());
  const size_t cols = static_cast<size_t>(depth_layout_.cols());
  ATTNRES_CHECK(per_step.size() == sublayers, "depth weights: one tensor per mixing step");
  depth.weights->assign(num_rows * sublayers * cols, kDepthAttentionUnused);
  std::vector<float> host;
  for (size_t k = 0; k < sublayers; ++k) {
    const size_t width = static_cast<size_t>(per_step[k].dim(1));
    host.resize(num_rows * width);
    backend_.download(per_step[k], host.data());
    for (size_t r = 0; r < num_rows; ++r) {
      std::copy_n(host.data() + r * width, width,
                  depth.weights->data() + (r * sublayers + k) * cols);
    }
  }
}

Tensor Transformer::forward(const BatchMeta& batch, KvCache& cache,
                            std::span<const int32_t> logit_rows, const DepthWeightsRequest* depth) {
  const int64_t T = batch.num_tokens;
  const int64_t d = config_.hidden_size;
  ATTNRES_CHECK(T > 0 && static_cast<int64_t>(batch.token_ids.size()) == T, "empty batch");
  const int64_t q_width = static_cast<int64_t>(config_.num_heads) * config_.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config_.num_kv_heads) * config_.head_dim;
  const int64_t ffn = config_.intermediate_size;
  const RowSplit split = split_rows(batch);
  const int64_t L = split.local;  // rows of the residual stream held here

  backend_.prepare_batch(batch);
  Scratch s;
  s.q = backend_.alloc({T, q_width}, DType::F32);
  s.k = backend_.alloc({T, kv_width}, DType::F32);
  s.v = backend_.alloc({T, kv_width}, DType::F32);
  s.attn = backend_.alloc({T, q_width}, DType::F32);
  s.gate = backend_.alloc({T, ffn}, DType::F32);
  s.up = backend_.alloc({T, ffn}, DType::F32);
  s.act = backend_.alloc({T, ffn}, DType::F32);
  s.reduced = backend_.alloc({L, d}, DType::F32);
  if (split.sharded) {
    s.gathered = backend_.alloc({split.padded, d}, DType::F32);
    s.unreduced = backend_.alloc({split.padded, d}, DType::F32);
  }
  Tensor partial = backend_.alloc({L, d}, DType::F32);
  Tensor normed = backend_.alloc({L, d}, DType::F32);
  // Where a sublayer writes its (not yet summed over ranks) output: every row of the step.
  Tensor sublayer_out = split.sharded ? s.unreduced.rows(0, T) : s.reduced;

  // The bank holds completed representations; entry 0 is the embedding, and the partial
  // starts as the embedding too (ATTNRES.md §2a and §2b).
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
    const int64_t slots = plan_.max_group_size();
    bank = backend_.alloc({plan_.bank_capacity, L, d}, DType::F32);
    phase1_m = backend_.alloc({slots, L}, DType::F32);
    phase1_s = backend_.alloc({slots, L}, DType::F32);
    phase1_o = backend_.alloc({slots, L, d}, DType::F32);
    Tensor entry = bank.row(0);
    backend_.copy(partial, entry);
    bank_size = 1;
  }
  footprint_ = {T, L, split.sharded, bank.defined() ? bank.nbytes() : 0};
  auto push_partial = [&] {
    Tensor entry = bank.row(bank_size++);
    backend_.copy(partial, entry);
  };

  // Depth introspection, only when asked: each mixing step's weights of the requested rows.
  const bool report_depth = depth && !depth->rows.empty() && attnres;
  std::vector<Tensor> depth_per_step;

  Tensor hidden = backend_.alloc({L, d}, DType::F32);
  for (size_t i = 0; i < plan_.steps.size(); ++i) {
    const DepthStep& step = plan_.steps[i];
    Backend::DepthMixArgs mix;
    mix.mix_eps = config_.rms_norm_eps;
    Tensor m, sum, o, query;
    if (step.mixes) {
      const DepthGroup& group = plan_.groups[step.group];
      if (step.slot == 0) {  // Phase 1, once for every step of the group
        ATTNRES_CHECK(bank_size >= group.num_bank_sources, "bank not filled yet");
        const int64_t n_steps = static_cast<int64_t>(group.steps.size());
        Tensor gm = phase1_m.rows(0, n_steps), gs = phase1_s.rows(0, n_steps),
               go = phase1_o.rows(0, n_steps);
        backend_.depth_phase1(group_queries_[step.group], bank, group.num_bank_sources,
                              config_.rms_norm_eps, gm, gs, go);
      }
      m = phase1_m.row(step.slot);
      sum = phase1_s.row(step.slot);
      o = phase1_o.row(step.slot);
      query = group_queries_[step.group].row(step.slot);
      mix.m = &m;
      mix.s = &sum;
      mix.o = &o;
      mix.query = &query;
      mix.bias = step_bias_[i];
    }
    if (report_depth && step.mixes) {
      depth_per_step.push_back(step_depth_weights(i, bank, partial, split, depth->rows));
    }
    // Phase 2 (or, for a plain model, just the PreNorm) writes the sublayer's input.
    const bool final_step = step.kind == SublayerKind::Final;
    const Tensor& gain = final_step ? weights_.final_norm
                         : step.kind == SublayerKind::Attention
                             ? weights_.layers[step.layer].input_norm
                             : weights_.layers[step.layer].post_attention_norm;
    backend_.depth_phase2_prenorm(mix, partial, gain, config_.rms_norm_eps,
                                  final_step ? hidden : normed);
    if (step.kind == SublayerKind::Final) break;

    if (step.push_and_reset_after_mix) {
      push_partial();
      backend_.fill_zero(partial);
    }
    const Tensor input = gather_input(split, normed, s);
    if (step.kind == SublayerKind::Attention) {
      attention_sublayer(step.layer, input, batch, cache.layers[step.layer], s, sublayer_out);
    } else {
      mlp_sublayer(step.layer, input, s, sublayer_out);
    }
    backend_.add_inplace(partial, reduce_output(split, s));
    if (step.push_after) push_partial();
  }

  if (report_depth && depth->weights) download_depth_weights(depth_per_step, *depth);

  const int64_t rows = static_cast<int64_t>(logit_rows.size());
  const int64_t vocab = config_.vocab_size;
  // A step made only of unfinished prefill chunks wants no logits: its work was the K/V.
  if (rows == 0) return backend_.alloc({0, vocab}, DType::F32);
  const Tensor all_hidden = gather_input(split, hidden, s);
  Tensor selected = backend_.alloc({rows, d}, DType::F32);
  backend_.gather_rows(all_hidden, logit_rows, selected);
  Tensor logits = backend_.alloc({rows, vocab}, DType::F32);
  backend_.linear(selected, weights_.lm_head, nullptr, logits);
  return logits;
}

}  // namespace attnres
