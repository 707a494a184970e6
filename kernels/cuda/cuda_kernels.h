// Host-side launchers of the CUDA kernels, callable from g++-compiled code (the op bodies,
// cuda_*_ops.cpp).
// Each launcher takes raw device pointers and sizes already validated by the op that calls
// it, launches on `stream` (always the last argument), and checks the launch
// (cudaGetLastError) so that a bad configuration throws attnres::Error at once.
// All activations are f32, except the outputs that take an `out_dtype` (F32 or BF16: a linear's
// input rows written in bf16, Backend::linear_input_dtype; cuda_activation.cuh); `void*` +
// DType arguments are weights / gains read as stored.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/core/dtype.h"
#include "engine/core/sample_row.h"

namespace attnres::cuda {

// --- cuda_elementwise.cu ---
// out[t, :] = table[ids[t], :] widened to f32. table [V, d].
void launch_embedding(const void* table, DType table_dtype, const int32_t* ids, int64_t num_tokens,
                      int64_t d, float* out, cudaStream_t stream);
// out = silu(gate) * up over n elements; out F32 or BF16 (rounded from the f32 value).
void launch_swiglu(const float* gate, const float* up, void* out, DType out_dtype, int64_t n,
                   cudaStream_t stream);
// x += y over n elements.
void launch_add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);
// out row i = x row rows[i]; rows are row_bytes each (any dtype).
void launch_gather_rows(const void* x, const int32_t* rows, int64_t num_rows, size_t row_bytes,
                        void* out, cudaStream_t stream);
// out[i] = x[i] rounded to `dtype` (BF16 or F16; round to nearest even; BF16 with
// round_to_bf16_bits, the rounding of the producers that write bf16 activations).
void launch_convert_from_f32(const float* x, void* out, DType dtype, int64_t n,
                             cudaStream_t stream);
// An entry entering a bf16 depth bank (CudaBackend::copy): out[i] = x[i] rounded to bf16
// exactly as f32_to_bf16 (engine/core/dtype.h) rounds it, NaN payloads included.
void launch_round_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);
// out[r, c] += bias[c] for r < rows, c < n.
void launch_add_bias(float* out, const void* bias, DType bias_dtype, int64_t rows, int64_t n,
                     cudaStream_t stream);

// --- cuda_gemv.cu ---
// Decode-sized linear, rows <= kMaxGemvRows: out[r, o] = x[r] . w[o] (+ bias[o]) with x
// kept f32 (bias may be null). x [rows, K] f32, w [N, K] F32 / BF16 / F16, out [rows, N].
constexpr int64_t kMaxGemvRows = 8;
void launch_gemv(const float* x, int64_t rows, const void* w, DType w_dtype, const void* bias,
                 DType bias_dtype, int64_t K, int64_t N, float* out, cudaStream_t stream);
// out [rows, N] = (x w^T (+ bias)) + residual [rows, N]: the residual add as the epilogue,
// the same bits as launch_gemv then launch_add_inplace. out may be residual itself.
void launch_gemv_residual(const float* x, int64_t rows, const void* w, DType w_dtype,
                          const void* bias, DType bias_dtype, int64_t K, int64_t N,
                          const float* residual, float* out, cudaStream_t stream);
// launch_gemv_residual that also stores entry [rows, N] = round_to_bf16_bits(out) (bf16 bits)
// from the same epilogue: the bits of launch_gemv_residual then launch_round_to_bf16, in one
// launch (the bank-push lever, NOTES.md "GEMV levers"). entry must not overlap the others.
void launch_gemv_residual_push(const float* x, int64_t rows, const void* w, DType w_dtype,
                               const void* bias, DType bias_dtype, int64_t K, int64_t N,
                               const float* residual, float* out, uint16_t* entry,
                               cudaStream_t stream);
// One weight of a fused GEMV: w [n, K] (the launch's dtype), bias [n] or null, out [rows, n],
// residual [rows, n] or null (added last; may be out).
struct GemvSegment {
  const void* w = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::F32;
  int64_t n = 0;
  float* out = nullptr;
  const float* residual = nullptr;
};
constexpr int kMaxGemvSegments = 3;
struct GemvSegments {
  GemvSegment seg[kMaxGemvSegments];
  int count = 0;
};
// Every segment's linear of the same x in one launch (weights of one dtype).
void launch_gemv_many(const float* x, int64_t rows, int64_t K, DType w_dtype,
                      const GemvSegments& segments, cudaStream_t stream);
// out [rows, n] = silu(x gate.w^T + gate.bias) * (x up.w^T + up.bias); gate.n == up.n, their
// out pointers unused.
void launch_gemv_swiglu(const float* x, int64_t rows, int64_t K, DType w_dtype,
                        const GemvSegment& gate, const GemvSegment& up, float* out,
                        cudaStream_t stream);

// --- cuda_gemv_prenorm.cu ---
// The decode GEMVs above with x = the sublayer's PreNorm of the partial, computed in the
// kernel's prologue (Backend::prenorm_linear_many / _swiglu): the plain pre-norm
// (x = rms_norm(partial) * gain, m null) or the plain Phase-2 merge (launch_depth_phase2_prenorm's
// mix, then the norm), bit for bit the values those kernels write.
struct GemvPrenorm {
  const float* partial = nullptr;  // [rows, K]
  const void* gain = nullptr;      // [K]
  DType gain_dtype = DType::F32;
  float eps = 1e-6f;
  // The plain Phase-2 merge's inputs, m null for none: m, s [rows]; o [rows, K]; query [K].
  const float* m = nullptr;
  const float* s = nullptr;
  const float* o = nullptr;
  const float* query = nullptr;
  float bias = 0.0f, mix_eps = 1e-6f;
};
// Shared memory the prologue's normed rows may take: under the 48 KB a kernel gets without
// opting in, beside its reduction scratch. 8 rows of d = 1024 take 32 KB.
constexpr int64_t kMaxGemvPrenormBytes = 40 * 1024;
// Whether rows of K fit the prologue (rows <= kMaxGemvRows, the normed copy in shared memory).
bool gemv_prenorm_takes(int64_t rows, int64_t K);
// As launch_gemv_many / launch_gemv_swiglu from the prologue's x. False (nothing launched) when
// the kernels do not take the shapes: gemv_prenorm_takes, K a multiple of the weights' 16-byte
// vector and 16-byte aligned weights; the caller then runs the two-launch path.
bool launch_gemv_prenorm_many(const GemvPrenorm& prenorm, int64_t rows, int64_t K, DType w_dtype,
                              const GemvSegments& segments, cudaStream_t stream);
bool launch_gemv_prenorm_swiglu(const GemvPrenorm& prenorm, int64_t rows, int64_t K, DType w_dtype,
                                const GemvSegment& gate, const GemvSegment& up, float* out,
                                cudaStream_t stream);

// --- cuda_persistent_mlp.cu ---
// The MLP sublayer of a decode step in one launch (Backend::prenorm_mlp_residual under
// CudaBackend::set_persistent_mlp): the PreNorm prologue, gate / up with SwiGLU into act, a
// grid-wide barrier, then down with its bias and the residual add into out. Every value has
// the bits of launch_gemv_prenorm_swiglu then launch_gemv_residual (the same row code in the
// same order). A cooperative launch of at most as many blocks as fit the SMs at once.
struct PersistentMlpArgs {
  GemvPrenorm prenorm;
  int64_t rows = 0;
  int64_t d = 0;             // gate / up K, down N: the partial's width
  int64_t intermediate = 0;  // gate / up N, down K
  DType w_dtype = DType::BF16;  // of gate, up and down
  GemvSegment gate, up;         // [intermediate, d]; their out pointers unused
  float* act = nullptr;         // [rows, intermediate]: the SwiGLU product, down's x
  GemvSegment down;             // [d, intermediate]; out [rows, d]; residual [rows, d] (may be out)
  // kPersistentMlpBarrierWords words, zero before the launch and after it (the backend's).
  unsigned* barrier = nullptr;
  // The down rows a warp copies into shared memory before the barrier: -1 as many as fit (the
  // default), 0 none (every row read from global memory after it). For the tests.
  int max_staged_rows_per_warp = -1;
};
constexpr int kPersistentMlpBarrierWords = 2;
// How a launch is laid out (for the tests): blocks (<= SMs x the blocks per SM that fit),
// the down rows each warp stages in shared memory, the dynamic shared memory per block.
struct PersistentMlpPlan {
  int grid = 0;
  int blocks_per_sm = 0;
  int staged_rows_per_warp = 0;
  size_t shared_bytes = 0;
};
// Whether the kernel takes the shapes: 1..8 rows, gemv_prenorm_takes(rows, d), d and
// intermediate multiples of the weights' 16-byte vector, 16-byte aligned weights and act,
// and the rows of act in the shared memory a block may opt into. Fills *plan when it does.
bool persistent_mlp_takes(const PersistentMlpArgs& args, PersistentMlpPlan* plan = nullptr);
// Launches it; false (nothing launched) where persistent_mlp_takes declines.
bool launch_persistent_mlp(const PersistentMlpArgs& args, cudaStream_t stream);

// --- cuda_norm_rope.cu ---
// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain. x, out [rows, n] (may alias when out is
// F32); out F32 or BF16 (rounded from the f32 value).
void launch_rms_norm(const float* x, const void* gain, DType gain_dtype, float eps, int64_t rows,
                     int64_t n, void* out, DType out_dtype, cudaStream_t stream);
// In place on q [T, hq * hd] and k [T, hkv * hd]: optional per-head RMSNorm (gain null to
// skip), then rotate-half RoPE at positions[t] with inv_freq [hd / 2] (f32).
void launch_qk_norm_rope(float* q, float* k, int64_t num_tokens, int hq, int hkv, int head_dim,
                         const void* q_gain, DType q_gain_dtype, const void* k_gain,
                         DType k_gain_dtype, float eps, const float* inv_freq,
                         const int32_t* positions, cudaStream_t stream);

// qk_norm_rope, then store_kv of the roped k and of v, in one launch (Backend::
// qk_norm_rope_store). q, k as for launch_qk_norm_rope (roped in place); v [T, hkv * hd];
// cache rows slots[t] of hkv * hd values of cache_dtype (F32, or BF16 rounded as store_kv).
struct RopeStoreParams {
  float* q = nullptr;
  float* k = nullptr;
  const float* v = nullptr;
  int64_t num_tokens = 0;
  int hq = 0, hkv = 0, head_dim = 0;
  const void* q_gain = nullptr;  // null: no per-head norm
  DType q_gain_dtype = DType::F32;
  const void* k_gain = nullptr;
  DType k_gain_dtype = DType::F32;
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [hd / 2]
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  DType cache_dtype = DType::F32;
};
void launch_qk_norm_rope_store(const RopeStoreParams& params, cudaStream_t stream);

// --- cuda_gemv_rope.cu ---
// The attention sublayer's front in one launch (Backend::prenorm_qkv_rope_store): the q, k, v
// GEMV (x from global memory, or the PreNorm prologue's rows), then qk_norm_rope_store's work
// as its epilogue: q and k normed and roped in their outputs, the roped k and v written into
// cache rows slots[t]. The same bits as launch_gemv_many / launch_gemv_prenorm_many then
// launch_qk_norm_rope_store.
struct GemvRopeArgs {
  const float* x = nullptr;              // [rows, K], or null: the prologue's rows
  const GemvPrenorm* prenorm = nullptr;  // the PreNorm prologue (x null), or null
  int64_t rows = 0, K = 0;
  DType w_dtype = DType::BF16;
  GemvSegments qkv;      // q, k, v (count 3), each out [rows, n]: rope's q, k, v
  RopeStoreParams rope;  // num_tokens = rows, device positions / slots, the cache
};
// The largest head the epilogue takes (its shared memory holds R rows of a head).
constexpr int kMaxGemvRopeHeadDim = 256;
// Whether the kernel takes the arguments: 1..8 rows, F32 or BF16 weights (F16: not
// instantiated), 16-byte vectors (K a multiple, x and weight rows aligned), an even head_dim
// up to kMaxGemvRopeHeadDim, q, k, v of hq / hkv / hkv heads, an F32 or BF16 cache, the
// prologue's gemv_prenorm_takes, and the whole in 48 KB of shared memory.
bool gemv_rope_takes(const GemvRopeArgs& args);
// Launches it; the arguments must be ones gemv_rope_takes takes.
void launch_gemv_rope(const GemvRopeArgs& args, cudaStream_t stream);

// --- cuda_attention.cu ---
// cache row slots[t] = k / v row t converted to the cache's dtype (F32 copied; BF16 rounded
// to nearest even exactly as f32_to_bf16, NaN kept quiet); rows of row_elems values.
void launch_store_kv(const float* k, const float* v, const int32_t* slots, int64_t num_tokens,
                     int64_t row_elems, void* k_cache, void* v_cache, DType cache_dtype,
                     cudaStream_t stream);

constexpr int kMaxAttentionHeadDim = 256;
// The most context splits one token's attention is cut into (bounds the partials' scratch).
constexpr int kMaxAttentionSplits = 128;

// What both attention kernels read: the queries, the paged cache and where each row's keys
// are, and the output. Filled once per op (CudaBackend::attention) for both launches.
struct PagedCacheAttention {
  const float* q = nullptr;        // [T, hq * hd]
  const void* k_cache = nullptr;   // [num_blocks, block_size, hkv, hd] of kv_dtype
  const void* v_cache = nullptr;
  DType kv_dtype = DType::F32;           // F32 or BF16
  const int32_t* positions = nullptr;    // [T]
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks] row-major, padded
  int max_blocks = 0;
  int hq = 0, hkv = 0, head_dim = 0, block_size = 0;
  float scale = 1.0f;
  void* out = nullptr;           // [T, hq * hd] of out_dtype
  DType out_dtype = DType::F32;  // F32 or BF16 (rounded from the f32 value)
};

struct PagedAttentionArgs : PagedCacheAttention {
  const int32_t* seq_of_token = nullptr;  // [T]
  // Rows this launch computes: row i is token rows[i] of q / out, or token i when rows is
  // null (every row). A step with prefill chunks gives flash-decoding only its other rows.
  int64_t num_tokens = 0;
  const int32_t* rows = nullptr;  // [num_tokens] or null
  // Split-K over positions (flash-decoding): split s of a token covers positions
  // [s * split_len, (s + 1) * split_len), its last split running to the end of its context;
  // a token uses ceil(context / split_len) splits, at most num_splits. With num_splits > 1,
  // `partials` holds attention_partial_floats(args) floats of scratch.
  int num_splits = 1;
  int split_len = 1;
  float* partials = nullptr;
};

// How to split the context: enough CTAs (num_tokens x hkv x head chunks x splits) to fill
// sm_count SMs several times over, no split shorter than kMinAttentionSplitLen positions
// (except a single split), at most kMaxAttentionSplits. max_context: the longest context of
// the batch (max positions[t] + 1). Pure host logic.
struct AttentionSplitPlan {
  int num_splits = 1;
  int split_len = 1;
};
constexpr int kMinAttentionSplitLen = 32;
AttentionSplitPlan plan_attention_splits(int64_t num_tokens, int hq, int hkv, int max_context,
                                         int sm_count);
// Query heads one CTA serves (all those of a KV head, up to 8): the CTAs per (token, split)
// are num_tokens x hkv x ceil(group / attention_heads_per_cta(group)).
int attention_heads_per_cta(int group);
// Scratch floats the splits' partial results need (0 when num_splits == 1).
int64_t attention_partial_floats(const PagedAttentionArgs& args);
// Causal GQA attention over the paged cache (cuda_attention.cu's header says how);
// head_dim <= kMaxAttentionHeadDim.
void launch_paged_attention(const PagedAttentionArgs& args, cudaStream_t stream);

// --- cuda_prefill_attention.cu ---
// Causal GQA attention of prefill chunks on tensor cores (FlashAttention-2 style), over the
// same paged cache as launch_paged_attention. A tile is up to kPrefillTileRows consecutive
// query rows of one sequence (cuda_attention_dispatch.h plans them); row t attends to
// positions 0..positions[t] of its sequence.
constexpr int kPrefillTileRows = 64;
struct PrefillTile {
  int32_t first_row = 0;     // its first query row (token index of q / out)
  int32_t num_rows = 0;      // 1..kPrefillTileRows
  int32_t seq = 0;           // its block table row
  int32_t key_end = 0;       // max position of its rows + 1: the keys it reads
  int32_t min_position = 0;  // min position of its rows: keys up to it need no mask
};
static_assert(sizeof(PrefillTile) == 5 * sizeof(int32_t), "staged as int32 words");
// The tiles' rows of out are written.
struct PrefillAttentionArgs : PagedCacheAttention {
  const PrefillTile* tiles = nullptr;  // [num_tiles]
  int num_tiles = 0;
};
// Whether the prefill kernel takes this shape: head_dim 64 or 128, F32 or BF16, both caches
// 16-byte aligned (rows are then whole 16-byte vectors). Otherwise flash-decoding does it all.
bool prefill_attention_supports(int head_dim, DType kv_dtype, const void* k_cache,
                                const void* v_cache);
void launch_prefill_attention(const PrefillAttentionArgs& args, cudaStream_t stream);

// --- cuda_depth_mix.cu ---
// Phase 1 for S query rows (any S; done in groups of 8): see Backend::depth_phase1.
// queries [S, d]; bank [>= n, T, d] of bank_dtype (F32 or BF16, widened when read); m, s
// [S, T]; o [S, T, d]. source_gate_logits [T, d] or null (pre_gated: every source is
// sigmoid(gate) * bank row first).
void launch_depth_phase1(const float* queries, int num_queries, const void* bank, DType bank_dtype,
                         int n, int64_t num_tokens, int64_t d, float eps, float* m, float* s,
                         float* o, const float* source_gate_logits, cudaStream_t stream);
// The same under the grouped-entries lever (cuda_depth_phase1_grouped.cu), the same bits: false,
// with nothing launched, where a thread would own more than one chunk of a row (d > 2048 on
// the vector path, d > 1024 on the scalar one); the caller then runs launch_depth_phase1.
bool launch_depth_phase1_grouped(const float* queries, int num_queries, const void* bank,
                                 DType bank_dtype, int n, int64_t num_tokens, int64_t d, float eps,
                                 float* m, float* s, float* o, const float* source_gate_logits,
                                 cudaStream_t stream);
// Phase 2 + PreNorm: see Backend::depth_phase2_prenorm (the mixing case; the caller runs
// launch_rms_norm when there is no mix). m, s [T]; o, p, out [T, d] (out may alias p when it is
// F32); out F32 or BF16 (rounded from the f32 value).
void launch_depth_phase2_prenorm(const float* m, const float* s, const float* o, const float* query,
                                 float bias, float mix_eps, const float* partial, const void* gain,
                                 DType gain_dtype, float norm_eps, int64_t num_tokens, int64_t d,
                                 void* out, DType out_dtype, cudaStream_t stream);

constexpr int kMaxNewerSources = 8;
// Phase 2 + PreNorm with the docs/ATTNRES.md §2d switches (Backend::DepthMixArgs): newer bank
// entries to merge, the partial as a source or not, a null source, the partial added to the
// mix, a scalar or vector gate.
struct DepthPhase2Params {
  const float* m = nullptr;      // [T]
  const float* s = nullptr;      // [T]
  const float* o = nullptr;      // [T, d]
  const float* query = nullptr;  // [d]: the newer entries' and the partial's query
  bool partial_is_source = true;
  const void* newer = nullptr;     // [num_newer, T, d]: bank entries Phase 1 did not read
  DType newer_dtype = DType::F32;  // the bank's: F32 or BF16
  int num_newer = 0;  // <= kMaxNewerSources (Backend's, asserted in cuda_depth_ops.cpp)
  float bias = 0.0f, mix_eps = 1e-6f;
  bool adds_partial = false;
  const float* null_source = nullptr;  // [d] or null
  float null_logit = 0.0f;
  int gate = 0;  // 0 none, 1 scalar (gate_blend), 2 vector (sigmoid(gate_logits))
  float gate_blend = 0.0f;
  const float* gate_logits = nullptr;  // [T, d]
  const float* partial = nullptr;      // [T, d]
  const void* gain = nullptr;
  DType gain_dtype = DType::F32;
  float norm_eps = 1e-6f;
  int64_t num_tokens = 0, d = 0;
  void* out = nullptr;  // [T, d] of out_dtype; may alias partial when F32
  // F32, or BF16 (rounded from the f32 value): the kernel then stages h in d floats of shared
  // memory, which a row of more than kMaxPhase2StagedBf16Row elements does not fit (the op
  // writes f32 into scratch and rounds it instead).
  DType out_dtype = DType::F32;
};
constexpr int64_t kMaxPhase2StagedBf16Row = 12 * 1024;  // 48 KB of f32
void launch_depth_phase2_general(const DepthPhase2Params& params, cudaStream_t stream);

// --- cuda_depth_weights.cu ---
// The depth-mix weights of one mixing step: see Backend::depth_weights. query [d];
// bank [>= n, T, d] (F32 or BF16); partial [T, d] or null (not a source); out [T, width] with
// width = n + (has_null) + (partial != null); source_gate_logits [T, d] or null (pre_gated).
struct DepthWeightsParams {
  const float* query = nullptr;
  const void* bank = nullptr;
  DType bank_dtype = DType::F32;
  int n = 0;
  const float* partial = nullptr;
  float bias = 0.0f;
  bool has_null = false;
  float null_logit = 0.0f;
  const float* source_gate_logits = nullptr;
  float eps = 1e-6f;
  int64_t num_tokens = 0, d = 0;
  float* out = nullptr;
};
void launch_depth_weights(const DepthWeightsParams& params, cudaStream_t stream);

// --- cuda_sampling.cu ---
// A row is sampled by a cluster of ctas_per_row CTAs (1, 2, 4 or 8); CTA k takes ids
// [k * slice, (k + 1) * slice), slice = sample_slice_ids(vocab, ctas_per_row). The result does
// not depend on the split (every merge is exact). Pure host logic below, up to launch_sample.
constexpr int kMaxSampleCtasPerRow = 8;  // the portable cluster size
// A slice's repetition-penalty bitmap (slice / 8 bytes) must fit in shared memory: 32 KB.
constexpr int64_t kMaxSampleSliceIds = int64_t{1} << 18;
// Below this a CTA's 512 threads have under 16 ids each: the merges cost more than they save.
constexpr int64_t kMinSampleSliceIds = 8192;
// ceil(vocab / ctas_per_row), rounded up to 32 ids (whole 128-byte lines).
int64_t sample_slice_ids(int64_t vocab, int ctas_per_row);
// How many CTAs per row: the fewest whose slices fit kMaxSampleSliceIds, then doubled while
// rows x CTAs still fit one CTA per SM and slices keep kMinSampleSliceIds ids. Qwen3's vocab
// (151936) on 132 SMs: 8 up to 16 rows, 4 up to 33, 2 up to 66, then 1.
int plan_sample_ctas_per_row(int64_t rows, int64_t vocab, int sm_count);
// CudaBackend::sample's staging, one buffer laid out the same on the host (pinned) and on the
// device: [rows] SampleRow, token ids from ids_offset, the structured-output bitmask words
// from bitmask_offset (the three go up in one copy of upload_bytes), out [rows] int32 from
// out_offset (comes back). The bitmask right after the ids, the other offsets 256-byte
// aligned.
struct SampleStagingLayout {
  size_t ids_offset = 0;
  size_t bitmask_offset = 0;
  size_t upload_bytes = 0;
  size_t out_offset = 0;
  size_t total_bytes = 0;
};
SampleStagingLayout sample_staging_layout(int64_t rows, int64_t num_ids, int64_t bitmask_words = 0);
// A persistent buffer's new capacity for a call that needs `needed` bytes: unchanged when it
// fits, else at least doubled (a growing batch regrows O(log) times, then never).
size_t grown_staging_bytes(size_t capacity, size_t needed);
// Samples rows [0, rows) of logits [rows, vocab] (overwritten) into out [rows]. row_args
// [rows], token_ids and bitmask ([mask rows, (vocab + 31) / 32] int32, read by rows whose
// bitmask_row >= 0; may be null when none is) on the device, ids and mask rows validated;
// counts [rows, vocab] int32, all zero, left zero (presence / frequency scratch). Throws when a
// slice exceeds kMaxSampleSliceIds.
void launch_sample(float* logits, int64_t rows, int64_t vocab, int32_t decodable,
                   const SampleRow* row_args, const int32_t* token_ids, const int32_t* bitmask,
                   int32_t* counts, int32_t* out, int ctas_per_row, cudaStream_t stream);

}  // namespace attnres::cuda
