// The op interface the transformer forward is written against. A backend owns device
// memory and implements each op for its device; the forward never branches on the device.
// kernels/cpu (the reference for every other backend) and kernels/cuda implement it.
//
// Conventions for every op:
// - Activations are f32 (a linear's input rows may be bf16 where linear_input_dtype says so),
//   contiguous, row-major; "T" is the number of tokens in the step
//   (all sequences of the batch concatenated), d the hidden size.
// - Weights are of a dtype in capabilities().weight_dtypes (F32, BF16, F16; the CPU's also
//   the block-quantized Q8_B32 / Q4_B32) and are read as stored (never widened in memory).
// - Outputs are preallocated by the caller with the right shape; ops never allocate them.
// - Each op is a public non-virtual function that checks its operands once, for every
//   backend (backend.cpp: shapes and dtypes against each other and the batch, which tensors
//   may alias which; ATTNRES_CHECK, a mismatch is a bug), then calls its body: the protected
//   virtual `<op>_impl` (linear -> linear_impl), which a backend overrides. A body checks only
//   what is its device's own (that the tensors live on its device, the dtypes and sizes its
//   kernels take). The fused ops' bodies default to the composition their comments give.
// - What a backend can do (cache and bank dtypes, fusions, graphs) is its capabilities():
//   one BackendCapabilities per backend, the registry's too (backend_capabilities.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/backend_capabilities.h"
#include "engine/core/error.h"
#include "engine/core/sample_row.h"
#include "engine/core/tensor.h"

namespace attnres {

// Per-step batch layout, built on the host by whoever schedules the step. Tokens of
// sequence s occupy rows [query_start[s], query_start[s+1]) of every [T, ...] activation.
struct BatchMeta {
  int num_tokens = 0;                 // T
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T] absolute position of each token in its sequence
  std::vector<int32_t> slot_mapping;  // [T] KV cache slot (block * block_size + offset) to write
  std::vector<int32_t> query_start;   // [num_seqs + 1]
  std::vector<int32_t> context_len;   // [num_seqs] tokens in the cache once this step is written
  std::vector<std::vector<int32_t>> block_tables;  // [num_seqs][blocks] physical block ids
  int num_seqs() const { return static_cast<int>(context_len.size()); }
};

// One layer's paged KV cache: K and V are [num_blocks, block_size, num_kv_heads, head_dim],
// F32 or BF16 (KvCache::allocate asks capabilities().kv_cache_dtypes first).
struct KvCacheLayer {
  Tensor k;
  Tensor v;
  int block_size() const { return static_cast<int>(k.dim(1)); }
};

// Which sources Backend::depth_weights reports beside the bank (docs/ATTNRES.md §2d); see there.
// At namespace scope so it can be a default argument of the member function.
struct DepthSourceSwitches {
  bool partial_is_source = true;
  bool has_null = false;
  float null_logit = 0.0f;
  const Tensor* source_gate_logits = nullptr;
  int width(int n) const { return n + (has_null ? 1 : 0) + (partial_is_source ? 1 : 0); }
};

// Work recorded once from a backend's queue and replayed (CUDA: a CUDA graph). A replay runs
// exactly the recorded device work on the recorded buffers, reading the batch metadata last
// staged by prepare_batch (one of the recorded layout) and nothing else of the host: none of
// the ops' host-side checks run again. engine/runner/decode_graphs.h is the user.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void replay() = 0;
  // True once no replay can run whatever batch is staged (CUDA: a larger batch regrew a
  // staging buffer the graph's copies read): capture again.
  virtual bool stale() const { return false; }
};

struct SampleBatch {
  std::vector<SampleRow> rows;     // rows[i] samples row i of the logits
  std::vector<int32_t> token_ids;  // every row's prompt, output and blocked ids
  // Ids at or past this are padding rows with no text (Vocabulary::decodable): never sampled.
  int32_t decodable = 0;
  // Structured output: [rows of masks, (vocab + 31) / 32] int32, the allowed-token bitmasks
  // that rows with SampleRow::bitmask_row >= 0 read (xgrammar's layout: bit id % 32 of word
  // id / 32, set = allowed). A few KB: it goes up with the parameters.
  std::vector<int32_t> bitmask;
  void clear() {
    rows.clear();
    token_ids.clear();
    bitmask.clear();
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // What this backend can do (backend_capabilities.h): the same object its registration gives
  // the registry. The default: f32 everywhere, the composed ops.
  virtual const BackendCapabilities& capabilities() const {
    static const BackendCapabilities defaults;
    return defaults;
  }

  // bf16 linear inputs, the one switch of --linear-input-dtype (the engine resolves the flag,
  // "auto" included, and sets it on every backend it builds: BackendOptions). On: a linear
  // with bf16 weights meets its input rows rounded to bf16 (round to nearest even, as
  // f32_to_bf16), and linear_input_dtype may answer BF16. What that changes per backend: the
  // CPU computes those dot products with vdpbf16ps and, over a bf16 KV cache, rounds the
  // attention's q and softmax weights to bf16 too; CUDA, whose cuBLASLt GEMM (more than 8 rows)
  // reads bf16 either way, has the producers write the rows in bf16 instead of linear
  // converting them: the same bits. Off by default (f32 inputs). Throws where
  // capabilities().bf16_linear_inputs is false.
  void set_bf16_linear_inputs(bool on) {
    ATTNRES_CHECK(!on || capabilities().bf16_linear_inputs,
                  name() + " does not take bf16 linear inputs");
    bf16_linear_inputs_ = on;
  }
  bool bf16_linear_inputs() const { return bf16_linear_inputs_; }

  // The dtype the forward allocates a linear's input rows in (the normed rows, the attention
  // and SwiGLU outputs, the LM head's rows), for `rows` rows read by weights of `weight_dtype`.
  // F32, the default: f32 activations everywhere, as the conventions above say. BF16: a
  // backend whose GEMM reads bf16 activations anyway (CUDA above 8 rows with bf16 weights;
  // the CPU with bf16 linear inputs and bf16 weights) has the producers write them rounded to
  // nearest even (as f32_to_bf16) and skips its own conversion, so its GEMMs see the same
  // bits; only with bf16_linear_inputs() on. Where it answers BF16 for a tensor, these ops
  // take that tensor (or a view of it) in BF16: out of rms_norm, depth_phase2_prenorm (then
  // not aliasing the partial), attention and swiglu, and so of linear_swiglu and
  // prenorm_linear_swiglu (the SwiGLU output); x and out of gather_rows; x of linear,
  // linear_residual, linear_many and linear_swiglu; `normed` of prenorm_linear_*. The forward
  // asks only for tensors every reader of which is one of those.
  virtual DType linear_input_dtype(int64_t rows, DType weight_dtype) const {
    (void)rows;
    (void)weight_dtype;
    return DType::F32;
  }

  // --- memory ---
  // A zero-filled tensor on this backend's device.
  virtual Tensor alloc(const Shape& shape, DType dtype) = 0;
  // The same, for a buffer kept across steps and read many times per step (the depth bank and
  // the Phase-1 state: engine/model/depth_bank.h). The CPU puts those of 1 MB and more in huge
  // pages (HugePageArena says why); the default is alloc.
  virtual Tensor alloc_kept(const Shape& shape, DType dtype) { return alloc(shape, dtype); }
  // A host tensor made usable by the ops (CPU: the same memory, no copy; a mmap'd bf16
  // weight stays a mmap'd bf16 weight).
  virtual Tensor upload(const Tensor& host) = 0;
  // Copy a device tensor into host memory of nbytes() bytes.
  virtual void download(const Tensor& src, void* host_dst) = 0;
  // Same shape; the same dtype, or F32 into BF16 (rounded to nearest even, as f32_to_bf16)
  // where capabilities().depth_bank_dtypes has BF16: how an entry enters a bf16 depth bank.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void fill_zero(Tensor& dst) = 0;
  // Waits for queued work (a no-op on the CPU).
  virtual void synchronize() = 0;
  // Called once at the start of each forward step with that step's batch, before any op
  // that takes it: a device backend uploads the metadata (positions, slots, block tables)
  // here once instead of in every op. The CPU reads the host vectors directly.
  virtual void prepare_batch(const BatchMeta& batch) { (void)batch; }

  // --- step graphs (optional: backends whose per-op launch cost is worth removing;
  // capabilities().step_graphs) ---
  // Records what `record` queues on this backend (nothing runs: replay it to run it). Warm up
  // first: run the same step once eagerly so every buffer it allocates is cached. Throws
  // where unsupported, or when `record` does something a graph cannot replay.
  virtual std::unique_ptr<StepGraph> capture_step_graph(const std::function<void()>& record) {
    (void)record;
    throw std::logic_error(name() + ": this backend does not record step graphs");
  }

  // --- ops ---
  // out[t] = table[ids[t]] widened to f32. table [V, d]; out [T, d].
  void embedding(const Tensor& table, const BatchMeta& batch, Tensor& out);

  // out = x / sqrt(mean(x^2) + eps) * gain, per row. Accumulate in f32 or wider. x, out [R, n];
  // gain [n] (any dtype). x and out may alias.
  void rms_norm(const Tensor& x, const Tensor& gain, float eps, Tensor& out);

  // out = x W^T (+ bias). x [R, in] f32 (or linear_input_dtype's: BF16 only with BF16
  // weights); w [out, in]; bias [out] (any float dtype) or null. out [R, out] f32, not
  // aliasing x.
  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out);

  // A sublayer's last linear with the residual add as its epilogue:
  //   out = (x W^T (+ bias)) + residual
  // the bias added first, exactly as linear() into a scratch and then add_inplace (the
  // default, so the CPU's bits are those of the separate ops; fp addition commutes, so
  // residual + y and y + residual are the same bits). residual, out [R, out] f32; out may be
  // residual itself (the partial sum updated in place) or not overlap it at all; neither may
  // alias x. A device backend fuses the add into the linear's launch (CUDA: <= 8 rows).
  void linear_residual(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual,
                       Tensor& out);

  // linear_residual that also pushes a depth-bank entry: out as linear_residual writes it,
  // then entry = out converted as copy() converts it (entry F32, or BF16 where
  // capabilities().depth_bank_dtypes has BF16). The default is exactly linear_residual then
  // copy; a device backend may store the entry from the linear's epilogue instead of reading
  // out back (CUDA: a lever). entry [R, out] must not overlap x, residual or out.
  void linear_residual_push(const Tensor& x, const Tensor& w, const Tensor* bias,
                            const Tensor& residual, Tensor& out, Tensor& entry);

  // Several linears of one input: outs[i] = x W_i^T (+ b_i), exactly as one linear() per
  // target (the default). A device backend runs them as one launch (a layer's q, k and v
  // projections of a decode step). Each out must not alias x.
  struct LinearTarget {
    const Tensor* w = nullptr;
    const Tensor* bias = nullptr;
    Tensor* out = nullptr;
  };
  void linear_many(const Tensor& x, std::span<const LinearTarget> targets);

  // The MLP's input half: out = silu(x Wg^T (+ bg)) * (x Wu^T (+ bu)), exactly as the two
  // linears into gate and up followed by swiglu (the default; gate and up [R, n] are its
  // scratch). A device backend may skip the scratch and fuse it into one launch.
  void linear_swiglu(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                     const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up, Tensor& out);

  // In place on q [T, Hq * hd] and k [T, Hkv * hd]: optional per-head RMSNorm (Qwen3's
  // q_norm / k_norm, gains [hd], null to skip), then rotary embedding in the rotate-half
  // (NeoX / HF Llama) layout at batch.positions with inverse frequencies inv_freq [hd / 2]
  // (f32). The angle position * inv_freq is formed in at least f32 (the CPU uses double, so
  // long contexts stay accurate).
  void qk_norm_rope(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain, const Tensor* k_gain,
                    float eps, const Tensor& inv_freq, const BatchMeta& batch);

  // Write this step's k, v [T, Hkv * hd] (f32) into the cache at batch.slot_mapping, converted
  // to the cache's dtype (bf16: round to nearest even). Every slot must lie inside the cache
  // (there is no padding slot).
  void store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch, KvCacheLayer& cache);

  // qk_norm_rope, then store_kv of the roped k and v: exactly those two calls (the default).
  // A device backend does both in one launch (q and k still hold their roped values after it,
  // as after the two calls; the attention reads q and the cache).
  void qk_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, int head_dim, const Tensor* q_gain,
                          const Tensor* k_gain, float eps, const Tensor& inv_freq,
                          const BatchMeta& batch, KvCacheLayer& cache);

  // Causal GQA attention of q [T, Hq * hd] over each sequence's cached keys/values
  // (positions 0..positions[t] inclusive, read through block_tables), scaled by `scale`.
  // out [T, Hq * hd].
  void attention(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch, int head_dim,
                 float scale, Tensor& out);

  // out = silu(gate) * up. gate, up, out [R, n].
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);

  // x += y, same shape.
  void add_inplace(Tensor& x, const Tensor& y);

  // A residual add that also pushes a depth-bank entry: x += y, then entry = the new x
  // (PushedRow::Sum: the cumulative modes' partial) or y (PushedRow::Addend: the delta modes'
  // sublayer output), converted as copy() converts (entry F32, or BF16 where
  // capabilities().depth_bank_dtypes has BF16). The default is exactly add_inplace then copy; a
  // backend may do both in one pass, reading y once instead of reading a row back to copy it.
  enum class PushedRow { Sum, Addend };
  void add_inplace_push(Tensor& x, const Tensor& y, Tensor& entry, PushedRow pushed);

  // out[i] = x[rows[i]]. x [R, n]; out [rows.size(), n]; out must not alias x.
  void gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out);

  // --- sampling (docs/ENGINE_CONTRACT.md, "Where sampling happens") ---
  // Samples rows [0, batch.rows.size()) of logits [>= rows, vocab] (f32) into out[i]: a token
  // id, or a kSample* code. Bit for bit what the host Sampler picks for the same row, uniform
  // and parameters on the CPU; within f32 rounding of its CDF on a device (kernels/cuda/
  // NOTES.md, "Sampling"). The sampled rows of logits are scratch: overwritten. Every id in
  // batch.token_ids must lie in [0, vocab) (a violation throws: it is a bug of the caller).
  void sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out);
  // The asynchronous form (async scheduling, docs/ENGINE_CONTRACT.md): sample_async queues the
  // same work and may return before the ids exist; they are in `out` once wait_sampled()
  // returns. `logits` and `out` must stay alive until then; `batch` is read before it returns.
  // One at a time: wait_sampled() before the next sample or sample_async. The defaults run
  // sample() at once (capabilities().samples_asynchronously false: nothing to overlap).
  void sample_async(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out);
  virtual void wait_sampled() {}

  // --- depth attention (docs/ATTNRES.md §3, §2d) ---
  // Phase 1, once per block, for the S sublayers that read the same bank:
  //   logit[l, j, t] = queries[l] . bank[j, t] / rms(bank[j, t])   (rms with eps)
  //   m[l, t] = max_j logit;  s[l, t] = sum_j exp(logit - m);  o[l, t] = sum_j exp(logit - m)
  //   bank[j, t]
  // queries [S, d] f32 (projection already multiplied by the norm gain); bank [>= n, T, d]
  // with its first n entries live (n >= 1), F32 or a dtype of capabilities().depth_bank_dtypes
  // (every bank read below, here and in the other depth ops, sees the stored value widened
  // exactly); m, s [S, T]; o [S, T, d]. source_gate_logits [T, d] (pre_gated, docs/ATTNRES.md §2d),
  // when given: every source is first replaced by sigmoid(source_gate_logits[t]) * bank[j, t]
  // (logit, rms and o all see it).
  void depth_phase1(const Tensor& queries, const Tensor& bank, int n, float eps, Tensor& m,
                    Tensor& s, Tensor& o, const Tensor* source_gate_logits = nullptr);

  // Phase 2 fused with the sublayer's PreNorm. For each token, over the extra sources the
  // bank's Phase-1 state (m, s, o) does not hold:
  //   the newer bank entries b_k (pushed after the group's Phase 1 ran; docs/ATTNRES.md §3's
  //   Phase 2 generalised from one intra-block partial to a few): logit
  //   n_k = query . b_k / rms(b_k), as in Phase 1 (no bias)
  //   the partial p, when partial_is_source: logit q = query . p / rms(p) + bias
  //   the null source v, when given: logit null_logit (a per-step constant)
  //   M = max(m, n_k?, q?, null_logit?);  h_mix = (e^(m-M) o + sum_k e^(n_k-M) b_k + e^(q-M) p
  //   + e^(c-M) v) / (e^(m-M) s + sum_k e^(n_k-M) + e^(q-M) + e^(c-M))   (absent terms dropped)
  //   adds_partial (delta modes, pre_gated): h_mix += p
  //   gate Scalar: h = p + gate_blend (h_mix - p); Vector: h = p + sigmoid(gate_logits) * (h_mix
  //   - p); None: h = h_mix
  //   out = rms_norm(h, prenorm_gain, eps)
  // m, s [T] and o [T, d] are one sublayer's rows of the Phase-1 outputs; when m and newer are
  // both null there is no mix and h = p. m, s and o all null with newer given (where
  // capabilities().mixes_without_phase1): there is no Phase-1 state, every bank source is a newer
  // entry (the terms of m, s and o drop out above). p (the partial) [T, d]; query [d] f32, the
  // step's (the newer entries' and the partial's). newer [k, T, d] (the bank's dtype) with 1 <= k
  // <= kMaxNewerSources, or null. The bias applies to the partial's logit only (bank logits never
  // carry one). out may alias p.
  static constexpr int kMaxNewerSources = 8;
  enum class DepthGate { None, Scalar, Vector };
  struct DepthMixArgs {
    const Tensor* m = nullptr;
    const Tensor* s = nullptr;
    const Tensor* o = nullptr;
    // The step's query; needed when the partial is a source or there are newer entries.
    const Tensor* query = nullptr;
    const Tensor* newer = nullptr;  // bank entries the group's Phase 1 did not read
    float bias = 0.0f;
    float mix_eps = 1e-6f;  // the depth RMSNorm's eps
    bool partial_is_source = true;
    bool adds_partial = false;
    const Tensor* null_source = nullptr;  // [d] f32
    float null_logit = 0.0f;
    DepthGate gate = DepthGate::None;
    float gate_blend = 0.0f;
    const Tensor* gate_logits = nullptr;  // [T, d] f32, gate Vector
  };
  void depth_phase2_prenorm(const DepthMixArgs& mix, const Tensor& partial,
                            const Tensor& prenorm_gain, float norm_eps, Tensor& out);
  // Two Phase-2 mixes of one step over the same partial, prenorm gain and sources, differing
  // only in their query, Phase-1 rows (m, s, o) and null logit: delta_v's K and V streams
  // (docs/ATTNRES.md §2d), whose queries are neighbouring rows of the group's. The same as
  // depth_phase2_prenorm(a, ..., out_a) then depth_phase2_prenorm(b, ..., out_b) (the
  // default); out_a and out_b overlap neither each other nor the partial. A backend may read
  // the shared sources once for both.
  void depth_phase2_prenorm_pair(const DepthMixArgs& a, const DepthMixArgs& b,
                                 const Tensor& partial, const Tensor& prenorm_gain, float norm_eps,
                                 Tensor& out_a, Tensor& out_b);

  // The depth-mix weights of one mixing step, for introspection (docs/ATTNRES.md §5; the forward
  // runs it only when a request asked). For each token t, over the sources in the code's
  // order: [null source, when null_logit is set] + bank[0, n) + [partial, when
  // partial_is_source]:
  //   logit_j = query . src_j / rms(src_j)  (+ bias on the partial's logit; null: null_logit)
  //   out[t, j] = softmax_j(logit)
  // rms with `eps` (the depth RMSNorm's), query [d] f32 (gain folded in, as for Phase 2);
  // bank [>= n, T, d] with its first n entries live (n >= 1); partial [T, d]; out [T, width]
  // with width = n + (null ? 1 : 0) + (partial source ? 1 : 0). source_gate_logits [T, d]:
  // as in depth_phase1 (pre_gated), the bank sources are gated first.
  using DepthSourceSwitches = attnres::DepthSourceSwitches;
  void depth_weights(const Tensor& query, const Tensor& bank, int n, const Tensor& partial,
                     float bias, float eps, Tensor& out, const DepthSourceSwitches& sources = {});

  // A sublayer's PreNorm fused with the projection that reads it (decode's launch count): the
  // arguments of depth_phase2_prenorm (mix = DepthMixArgs{}: the plain pre-norm, h = p), with
  // `normed` [T, d] the scratch the default writes the sublayer input into. Its contents after
  // a prenorm_* call are unspecified (a fusing backend never writes it): a caller that reads
  // the normed rows afterwards calls depth_phase2_prenorm itself.
  struct PrenormArgs {
    DepthMixArgs mix;
    const Tensor* partial = nullptr;
    const Tensor* gain = nullptr;
    float eps = 1e-6f;
    Tensor* normed = nullptr;
  };
  // depth_phase2_prenorm into normed, then linear_many of it (the default): out_i = normed
  // W_i^T (+ b_i). A device backend may compute the normed rows inside the projection.
  void prenorm_linear_many(const PrenormArgs& in, std::span<const LinearTarget> targets);
  // depth_phase2_prenorm into normed, then linear_swiglu of it (the default).
  void prenorm_linear_swiglu(const PrenormArgs& in, const Tensor& w_gate, const Tensor* b_gate,
                             const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                             Tensor& out);
  // The MLP sublayer whole, its residual add included: prenorm_linear_swiglu into gate, up and
  // act, then linear_residual(act, w_down, b_down, residual, out) (the default: exactly those
  // two calls, so the same bits). The forward calls it where the two halves are adjacent (no
  // bank push between) and the residual add is fused (out the partial, or the bank entry the
  // sum goes into). out may be the residual, which may be the PreNorm's partial: a fusing
  // backend reads every row it needs of the partial before it writes any of out (CUDA: <= 8
  // rows, one persistent launch under CudaBackend::set_persistent_mlp).
  void prenorm_mlp_residual(const PrenormArgs& in, const Tensor& w_gate, const Tensor* b_gate,
                            const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                            Tensor& act, const Tensor& w_down, const Tensor* b_down,
                            const Tensor& residual, Tensor& out);
  // The attention sublayer's front whole: prenorm_linear_many into q, k and v (qkv: the q, k,
  // v targets in that order, of one input), then qk_norm_rope_store of them (the default:
  // exactly those two calls). A device backend runs the per-head norms, RoPE and the cache
  // store as the projection's epilogue (CUDA: <= 8 rows, one launch for PreNorm, q / k / v,
  // RoPE and the store). q and k hold their roped values after it, v its projection.
  struct RopeStoreArgs {
    int head_dim = 0;
    const Tensor* q_gain = nullptr;  // null: no per-head norm
    const Tensor* k_gain = nullptr;
    float eps = 1e-6f;
    const Tensor* inv_freq = nullptr;
    const BatchMeta* batch = nullptr;
    KvCacheLayer* cache = nullptr;
  };
  void prenorm_qkv_rope_store(const PrenormArgs& in, std::span<const LinearTarget, 3> qkv,
                              const RopeStoreArgs& rope);

 protected:
  // sample's operand checks, for a backend's own entry point that runs its sample body without
  // the public op (CUDA's sample with a chosen CTA split).
  static void check_sample_operands(const Tensor& logits, const SampleBatch& batch,
                                    std::span<int32_t> out);

  // --- the op bodies (the conventions at the top) ---
  // The fused ops' defaults call the plain ops' bodies: the fused op's checks cover theirs.
  virtual void embedding_impl(const Tensor& table, const BatchMeta& batch, Tensor& out) = 0;
  virtual void rms_norm_impl(const Tensor& x, const Tensor& gain, float eps, Tensor& out) = 0;
  virtual void linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) = 0;
  virtual void linear_residual_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                                    const Tensor& residual, Tensor& out) {
    if (out.data == residual.data) {
      Tensor y = alloc(out.shape, DType::F32);
      linear_impl(x, w, bias, y);
      add_inplace_impl(out, y);
    } else {
      linear_impl(x, w, bias, out);
      add_inplace_impl(out, residual);
    }
  }
  virtual void linear_residual_push_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                                         const Tensor& residual, Tensor& out, Tensor& entry) {
    linear_residual_impl(x, w, bias, residual, out);
    copy(out, entry);
  }
  virtual void linear_many_impl(const Tensor& x, std::span<const LinearTarget> targets) {
    for (const LinearTarget& t : targets) linear_impl(x, *t.w, t.bias, *t.out);
  }
  virtual void linear_swiglu_impl(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                                  const Tensor& w_up, const Tensor* b_up, Tensor& gate, Tensor& up,
                                  Tensor& out) {
    linear_impl(x, w_gate, b_gate, gate);
    linear_impl(x, w_up, b_up, up);
    swiglu_impl(gate, up, out);
  }
  virtual void qk_norm_rope_impl(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                                 const Tensor* k_gain, float eps, const Tensor& inv_freq,
                                 const BatchMeta& batch) = 0;
  virtual void store_kv_impl(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                             KvCacheLayer& cache) = 0;
  virtual void qk_norm_rope_store_impl(Tensor& q, Tensor& k, const Tensor& v, int head_dim,
                                       const Tensor* q_gain, const Tensor* k_gain, float eps,
                                       const Tensor& inv_freq, const BatchMeta& batch,
                                       KvCacheLayer& cache) {
    qk_norm_rope_impl(q, k, head_dim, q_gain, k_gain, eps, inv_freq, batch);
    store_kv_impl(k, v, batch, cache);
  }
  virtual void attention_impl(const Tensor& q, const KvCacheLayer& cache, const BatchMeta& batch,
                              int head_dim, float scale, Tensor& out) = 0;
  virtual void swiglu_impl(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  virtual void add_inplace_impl(Tensor& x, const Tensor& y) = 0;
  virtual void add_inplace_push_impl(Tensor& x, const Tensor& y, Tensor& entry, PushedRow pushed) {
    add_inplace_impl(x, y);
    copy(pushed == PushedRow::Sum ? x : y, entry);
  }
  virtual void gather_rows_impl(const Tensor& x, std::span<const int32_t> rows, Tensor& out) = 0;
  virtual void sample_impl(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) = 0;
  virtual void sample_async_impl(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) {
    sample_impl(logits, batch, out);
  }
  virtual void depth_phase1_impl(const Tensor& queries, const Tensor& bank, int n, float eps,
                                 Tensor& m, Tensor& s, Tensor& o,
                                 const Tensor* source_gate_logits) = 0;
  virtual void depth_phase2_prenorm_impl(const DepthMixArgs& mix, const Tensor& partial,
                                         const Tensor& prenorm_gain, float norm_eps,
                                         Tensor& out) = 0;
  virtual void depth_phase2_prenorm_pair_impl(const DepthMixArgs& a, const DepthMixArgs& b,
                                              const Tensor& partial, const Tensor& prenorm_gain,
                                              float norm_eps, Tensor& out_a, Tensor& out_b) {
    depth_phase2_prenorm_impl(a, partial, prenorm_gain, norm_eps, out_a);
    depth_phase2_prenorm_impl(b, partial, prenorm_gain, norm_eps, out_b);
  }
  virtual void prenorm_linear_many_impl(const PrenormArgs& in,
                                        std::span<const LinearTarget> targets) {
    depth_phase2_prenorm_impl(in.mix, *in.partial, *in.gain, in.eps, *in.normed);
    linear_many_impl(*in.normed, targets);
  }
  virtual void prenorm_linear_swiglu_impl(const PrenormArgs& in, const Tensor& w_gate,
                                          const Tensor* b_gate, const Tensor& w_up,
                                          const Tensor* b_up, Tensor& gate, Tensor& up,
                                          Tensor& out) {
    depth_phase2_prenorm_impl(in.mix, *in.partial, *in.gain, in.eps, *in.normed);
    linear_swiglu_impl(*in.normed, w_gate, b_gate, w_up, b_up, gate, up, out);
  }
  virtual void prenorm_mlp_residual_impl(const PrenormArgs& in, const Tensor& w_gate,
                                         const Tensor* b_gate, const Tensor& w_up,
                                         const Tensor* b_up, Tensor& gate, Tensor& up, Tensor& act,
                                         const Tensor& w_down, const Tensor* b_down,
                                         const Tensor& residual, Tensor& out) {
    prenorm_linear_swiglu_impl(in, w_gate, b_gate, w_up, b_up, gate, up, act);
    linear_residual_impl(act, w_down, b_down, residual, out);
  }
  virtual void prenorm_qkv_rope_store_impl(const PrenormArgs& in,
                                           std::span<const LinearTarget, 3> qkv,
                                           const RopeStoreArgs& rope) {
    prenorm_linear_many_impl(in, qkv);
    qk_norm_rope_store_impl(*qkv[0].out, *qkv[1].out, *qkv[2].out, rope.head_dim, rope.q_gain,
                            rope.k_gain, rope.eps, *rope.inv_freq, *rope.batch, *rope.cache);
  }
  virtual void depth_weights_impl(const Tensor& query, const Tensor& bank, int n,
                                  const Tensor& partial, float bias, float eps, Tensor& out,
                                  const DepthSourceSwitches& sources) = 0;

 private:
  bool bf16_linear_inputs_ = false;
};

}  // namespace attnres
