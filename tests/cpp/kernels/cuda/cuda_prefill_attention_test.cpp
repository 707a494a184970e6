// The tensor-core prefill attention (cuda_prefill_attention.cu) and the dispatch that sends a
// step's rows to it or to flash-decoding (cuda_attention_dispatch.h), against the CPU backend.
//
// Tolerance of a prefill row. The kernel rounds Q, K and V (an f32 cache; a bf16 cache is
// already bf16) to bf16 and multiplies them exactly into f32 accumulators, so the oracle for
// it is the CPU attention on those rounded inputs ("the rounded oracle": q rounded, the cache
// a bf16 cache holding the same bits). What is left is P: each weight p_j = 2^(s_j - m) is
// rounded to bf16 (relative error <= 2^-9) before O += P V, while the row sum l adds the
// unrounded p_j, so
//   |o_gpu - o| = |sum_j p_j d_j v_j| / l <= 2^-9 (sum_j p_j |v_j|) / l <= 2^-9 max_j |v_j|,
// plus f32 rounding (exp2f, accumulation order: ~1e-6 relative). The test allows
// 2^-9 max|v| + 1e-5 max|v| per element. Errors of a real bug are far above it: scores have a
// standard deviation of ~3 (q, k uniform in [-3, 3], scale 1 / sqrt(hd)), so a row's output is
// carried by its few largest keys and one key too many or too few moves it by ~0.1 max|v|.
// Decode rows (flash-decoding, f32 q) keep that kernel's tolerance against the unrounded
// oracle: 2e-5 of |ref| + rms(ref) up to context 1024, 4e-5 beyond.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_attention_dispatch.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"
#include "tests/cpp/kernels/cuda/paged_batch_util.h"

namespace attnres::test {
namespace {

// --- the dispatch plan (host) ---

std::vector<int32_t> starts_of(const std::vector<int>& chunks) {
  std::vector<int32_t> starts = {0};
  for (int c : chunks) starts.push_back(starts.back() + c);
  return starts;
}

// Every row exactly once: in a tile of its own sequence or in decode_rows; tiles of
// consecutive rows, at most kPrefillTileRows, with key_end / min_position of their rows.
void expect_plan_covers_every_row(const cuda::AttentionDispatch& plan,
                                  const std::vector<int32_t>& starts,
                                  const std::vector<int32_t>& positions) {
  const int T = starts.back();
  std::vector<int> seen(T, 0);
  for (int32_t r : plan.decode_rows) {
    ASSERT_GE(r, 0);
    ASSERT_LT(r, T);
    ++seen[r];
  }
  EXPECT_TRUE(std::is_sorted(plan.decode_rows.begin(), plan.decode_rows.end()));
  for (const cuda::PrefillTile& tile : plan.tiles) {
    ASSERT_GE(tile.num_rows, 1);
    ASSERT_LE(tile.num_rows, cuda::kPrefillTileRows);
    ASSERT_GE(tile.seq, 0);
    ASSERT_LT(tile.seq, static_cast<int>(starts.size()) - 1);
    EXPECT_GE(tile.first_row, starts[tile.seq]);
    EXPECT_LE(tile.first_row + tile.num_rows, starts[tile.seq + 1]);
    int key_end = 0, min_position = INT32_MAX;
    for (int r = tile.first_row; r < tile.first_row + tile.num_rows; ++r) {
      ++seen[r];
      key_end = std::max(key_end, positions[r] + 1);
      min_position = std::min(min_position, positions[r]);
    }
    EXPECT_EQ(tile.key_end, key_end);
    EXPECT_EQ(tile.min_position, min_position);
  }
  if (plan.tiles.empty()) {
    EXPECT_TRUE(plan.decode_rows.empty()) << "no tiles: no row list (every row is decode's)";
    std::fill(seen.begin(), seen.end(), 1);
  }
  for (int r = 0; r < T; ++r) EXPECT_EQ(seen[r], 1) << "row " << r;
}

// Positions of chunks that follow cached prefixes.
std::vector<int32_t> positions_of(const std::vector<int>& prefixes,
                                  const std::vector<int>& chunks) {
  std::vector<int32_t> positions;
  for (size_t s = 0; s < chunks.size(); ++s)
    for (int i = 0; i < chunks[s]; ++i) positions.push_back(prefixes[s] + i);
  return positions;
}

TEST(CudaAttentionDispatch, DecodeStepsNeedNoRowList) {
  const std::vector<int> chunks(64, 1), prefixes(64, 1023);
  const auto starts = starts_of(chunks);
  const auto positions = positions_of(prefixes, chunks);
  const cuda::AttentionDispatch plan = cuda::plan_attention_dispatch(starts, positions);
  EXPECT_TRUE(plan.tiles.empty());
  EXPECT_TRUE(plan.decode_rows.empty());
  EXPECT_EQ(plan.decode_max_context, 1024);
  expect_plan_covers_every_row(plan, starts, positions);
}

TEST(CudaAttentionDispatch, ChunksOfAtLeastTheThresholdGoToTiles) {
  // Rows per sequence around the threshold (64) and the tile (64): 63 stays with
  // flash-decoding; 64 is one tile; 65 two (64 + 1); 200 four (3 x 64 + 8).
  const std::vector<int> chunks = {1, 63, 64, 65, 200, 1, 2};
  const std::vector<int> prefixes = {4095, 0, 17, 1000, 3, 9, 30};
  const auto starts = starts_of(chunks);
  const auto positions = positions_of(prefixes, chunks);
  const cuda::AttentionDispatch plan = cuda::plan_attention_dispatch(starts, positions);
  ASSERT_EQ(cuda::kPrefillMinRows, 64);
  ASSERT_EQ(plan.tiles.size(), 1u + 2u + 4u);
  EXPECT_EQ(plan.tiles[0].seq, 2);
  EXPECT_EQ(plan.tiles[1].num_rows, 64);
  EXPECT_EQ(plan.tiles[2].num_rows, 1);
  EXPECT_EQ(plan.tiles[2].key_end, 1000 + 65);
  EXPECT_EQ(plan.tiles[6].num_rows, 8);
  // Decode rows: sequence 0's, 1's 63, 5's and 6's two.
  EXPECT_EQ(plan.decode_rows.size(), 1u + 63u + 1u + 2u);
  EXPECT_EQ(plan.decode_max_context, 4096);  // sequence 0's, not the tiles' 1065
  expect_plan_covers_every_row(plan, starts, positions);
}

TEST(CudaAttentionDispatch, AThresholdOfOneSendsEveryRowToTiles) {
  const std::vector<int> chunks = {1, 5, 130}, prefixes = {7, 0, 64};
  const auto starts = starts_of(chunks);
  const auto positions = positions_of(prefixes, chunks);
  const cuda::AttentionDispatch plan = cuda::plan_attention_dispatch(starts, positions, 1);
  EXPECT_EQ(plan.tiles.size(), 1u + 1u + 3u);
  EXPECT_TRUE(plan.decode_rows.empty());
  expect_plan_covers_every_row(plan, starts, positions);
}

TEST(CudaAttentionDispatch, EmptySequencesAndBadInput) {
  const std::vector<int> chunks = {0, 70, 0};
  const auto starts = starts_of(chunks);
  const auto positions = positions_of({0, 0, 0}, chunks);
  const cuda::AttentionDispatch plan = cuda::plan_attention_dispatch(starts, positions);
  EXPECT_EQ(plan.tiles.size(), 2u);
  expect_plan_covers_every_row(plan, starts, positions);
  EXPECT_THROW(cuda::plan_attention_dispatch(starts, positions, 0), std::logic_error);
  const std::vector<int32_t> too_long = {0, 5, 71};
  EXPECT_THROW(cuda::plan_attention_dispatch(too_long, positions), std::logic_error);
  const std::vector<int32_t> decreasing = {0, 5, 3};
  EXPECT_THROW(cuda::plan_attention_dispatch(decreasing, positions), std::logic_error);
}

// --- against the CPU at real shapes ---

constexpr float kQkRange = 3.0f;  // q, k uniform in [-3, 3]: score sd ~3 at scale 1 / sqrt(hd)

Tensor rounded_to_bf16(const Tensor& f32) {  // f32 values rounded as f32_to_bf16, kept f32
  Tensor t = clone_host(f32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(t.ptr<float>()[i]));
  return t;
}

Tensor as_bf16(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape, DType::BF16);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint16_t>()[i] = f32_to_bf16(f32.ptr<float>()[i]);
  return t;
}

// A step over a random paged cache: the cached prefixes' K (uniform in [-3, 3]) and V (in
// [-1, 1]) already in place, this step's q, k, v random in the same ranges.
struct PrefillProblem {
  int hq, hkv, hd, block_size;
  DType cache_dtype;
  BatchMeta batch;
  Tensor q, k, v;           // host f32
  Tensor cache_k, cache_v;  // host, cache_dtype, before store_kv
  float v_max = 0.0f;       // max |v| over the cache and the step
  int max_context = 0;

  PrefillProblem(int hq_, int hkv_, int hd_, int block_size_, DType dtype,
                 const std::vector<SeqSpec>& seqs, uint32_t seed)
      : hq(hq_), hkv(hkv_), hd(hd_), block_size(block_size_), cache_dtype(dtype) {
    std::mt19937 rng(seed);
    int num_blocks = 2;  // a few nobody uses
    for (const SeqSpec& s : seqs) {
      num_blocks += (s.cached + s.chunk + block_size - 1) / block_size;
      max_context = std::max(max_context, s.cached + s.chunk);
    }
    batch = paged_batch(seqs, block_size, num_blocks, rng);
    const int T = batch.num_tokens;
    const Shape cache_shape = {num_blocks, block_size, hkv, hd};
    Tensor kc = random_host(cache_shape, DType::F32, rng, -kQkRange, kQkRange);
    Tensor vc = random_host(cache_shape, DType::F32, rng, -1.0f, 1.0f);
    cache_k = dtype == DType::BF16 ? as_bf16(kc) : kc;
    cache_v = dtype == DType::BF16 ? as_bf16(vc) : vc;
    q = random_host({T, hq * hd}, DType::F32, rng, -kQkRange, kQkRange);
    k = random_host({T, hkv * hd}, DType::F32, rng, -kQkRange, kQkRange);
    v = random_host({T, hkv * hd}, DType::F32, rng, -1.0f, 1.0f);
    for (const Tensor* t : {&vc, &v})
      for (int64_t i = 0; i < t->numel(); ++i)
        v_max = std::max(v_max, std::fabs(t->ptr<float>()[i]));
  }

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(hd)); }

  // The CPU attention on the unrounded q and the cache as the GPU holds it.
  Tensor exact_oracle() const {
    CpuBackend cpu(0);
    KvCacheLayer cache{clone_host(cache_k), clone_host(cache_v)};
    cpu.store_kv(k, v, batch, cache);
    Tensor ref = Tensor::empty({batch.num_tokens, hq * hd}, DType::F32);
    cpu.attention(q, cache, batch, hd, scale(), ref);
    return ref;
  }

  // The CPU attention on what the prefill kernel multiplies: q rounded to bf16, a bf16 cache
  // (store_kv rounds k and v into it as the GPU's store_kv or staging does).
  Tensor rounded_oracle() const {
    CpuBackend cpu(0);
    KvCacheLayer cache{cache_dtype == DType::BF16 ? clone_host(cache_k) : as_bf16(cache_k),
                       cache_dtype == DType::BF16 ? clone_host(cache_v) : as_bf16(cache_v)};
    cpu.store_kv(k, v, batch, cache);
    Tensor ref = Tensor::empty({batch.num_tokens, hq * hd}, DType::F32);
    cpu.attention(rounded_to_bf16(q), cache, batch, hd, scale(), ref);
    return ref;
  }

  double prefill_tolerance() const { return (std::ldexp(1.0, -9) + 1e-5) * v_max; }
};

// Rows `rows` of got and ref ([T, width]): |got - ref| <= abs_tol + rel_tol (|ref| + rms(ref
// over those rows)); NaN fails.
::testing::AssertionResult rows_close(const Tensor& got, const Tensor& ref,
                                      const std::vector<int32_t>& rows, double abs_tol,
                                      double rel_tol) {
  const int64_t width = ref.dim(1);
  double ss = 0.0;
  for (int32_t r : rows)
    for (int64_t i = 0; i < width; ++i) ss += std::pow(ref.ptr<float>()[r * width + i], 2);
  const double rms = rows.empty() ? 0.0 : std::sqrt(ss / (rows.size() * width));
  double worst = 0.0, max_err = 0.0;
  int64_t worst_i = -1;
  for (int32_t r : rows)
    for (int64_t i = 0; i < width; ++i) {
      const int64_t at = r * width + i;
      const double g = got.ptr<float>()[at], w = ref.ptr<float>()[at];
      const double err = std::fabs(g - w), bound = abs_tol + rel_tol * (std::fabs(w) + rms);
      max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
      if (!(err <= bound) && (worst_i < 0 || !(err / bound <= worst))) {
        worst = std::isnan(err) ? INFINITY : err / bound;
        worst_i = at;
      }
    }
  if (worst_i < 0) return ::testing::AssertionSuccess() << "max error " << max_err;
  return ::testing::AssertionFailure()
         << "row " << worst_i / width << " element " << worst_i % width << ": got "
         << got.ptr<float>()[worst_i] << " want " << ref.ptr<float>()[worst_i] << " (" << worst
         << "x the tolerance); max error " << max_err << " over " << rows.size() << " rows";
}

std::vector<int32_t> tile_rows(const cuda::AttentionDispatch& plan) {
  std::vector<int32_t> rows;
  for (const cuda::PrefillTile& tile : plan.tiles)
    for (int r = 0; r < tile.num_rows; ++r) rows.push_back(tile.first_row + r);
  return rows;
}

std::string describe(const PrefillProblem& pb) {
  return "hq " + std::to_string(pb.hq) + " hkv " + std::to_string(pb.hkv) + " hd " +
         std::to_string(pb.hd) + " block " + std::to_string(pb.block_size) + " cache " +
         std::string(dtype_name(pb.cache_dtype)) + " max context " + std::to_string(pb.max_context);
}

// The backend's attention op (the real dispatch) on one step; prefill rows against the
// rounded oracle, the others against the exact one. A second run must give the same bits.
void check_step(int hq, int hkv, int hd, DType dtype, const std::vector<SeqSpec>& seqs,
                uint32_t seed, int block_size = 16, int min_rows = cuda::kPrefillMinRows) {
  const PrefillProblem pb(hq, hkv, hd, block_size, dtype, seqs, seed);
  SCOPED_TRACE(describe(pb));
  CudaBackend gpu(0);
  gpu.set_prefill_min_rows(min_rows);
  KvCacheLayer cache{gpu.upload(pb.cache_k), gpu.upload(pb.cache_v)};
  gpu.prepare_batch(pb.batch);
  gpu.store_kv(gpu.upload(pb.k), gpu.upload(pb.v), pb.batch, cache);
  const int T = pb.batch.num_tokens;
  const Tensor q = gpu.upload(pb.q);
  Tensor out = device_nan(gpu, {T, hq * hd});
  gpu.attention(q, cache, pb.batch, hd, pb.scale(), out);
  const Tensor got = to_host(gpu, out);

  const cuda::AttentionDispatch plan =
      cuda::plan_attention_dispatch(pb.batch.query_start, pb.batch.positions, min_rows);
  const bool prefill_kernel = !plan.tiles.empty() && cuda::prefill_attention_supports(
                                                         hd, dtype, cache.k.data, cache.v.data);
  std::vector<int32_t> prefill_rows = prefill_kernel ? tile_rows(plan) : std::vector<int32_t>{};
  std::vector<int32_t> decode_rows;
  if (!prefill_kernel) {
    decode_rows.resize(T);
    std::iota(decode_rows.begin(), decode_rows.end(), 0);
  } else {
    decode_rows = plan.decode_rows;
  }
  if (!prefill_rows.empty()) {
    EXPECT_TRUE(rows_close(got, pb.rounded_oracle(), prefill_rows, pb.prefill_tolerance(), 0.0))
        << "prefill rows (tensor cores), tolerance " << pb.prefill_tolerance();
  }
  if (!decode_rows.empty()) {
    const double rtol = pb.max_context > 1024 ? 4e-5 : 2e-5;
    EXPECT_TRUE(rows_close(got, pb.exact_oracle(), decode_rows, 0.0, rtol))
        << "flash-decoding rows";
  }
  Tensor again = device_nan(gpu, {T, hq * hd});
  gpu.attention(q, cache, pb.batch, hd, pb.scale(), again);
  EXPECT_TRUE(same_bytes(to_host(gpu, again), got)) << "a second run differs";
}

const DType kCacheDtypes[] = {DType::F32, DType::BF16};

// One long prefill chunk from scratch, and after a long cached prefix (Qwen3-0.6B: hd 128,
// 16 query heads on 8 KV heads; the bench shapes: hd 64).
TEST(CudaPrefillAttention, LongChunks) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : kCacheDtypes) {
    check_step(16, 8, 128, dtype, {{0, 2048}}, 11);
    check_step(16, 8, 128, dtype, {{4096, 512}}, 12);
    check_step(16, 8, 64, dtype, {{0, 2048}}, 13);
    check_step(16, 8, 64, dtype, {{1000, 300}}, 14);
  }
}

// Several prefill chunks with cached prefixes (block-aligned and not) and decode rows and
// short chunks in one step: both kernels in one attention call.
TEST(CudaPrefillAttention, MixedDecodeAndPrefillBatch) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> seqs = {{4096, 300}, {0, 64},     {17, 65},  {1023, 1}, {5, 2},
                                     {100, 63},   {2000, 129}, {4095, 1}, {0, 1},    {33, 200}};
  for (DType dtype : kCacheDtypes) {
    check_step(16, 8, 128, dtype, seqs, 21);
    check_step(16, 8, 64, dtype, seqs, 22);
    // The backend's threshold: every row on tensor cores, then every row on flash-decoding.
    check_step(16, 8, 128, dtype, seqs, 23, 16, 1);
    check_step(16, 8, 128, dtype, seqs, 24, 16, INT32_MAX);
  }
}

// Other head layouts through the dispatch: Hq = Hkv, a group of 8, and head dims the prefill
// kernel does not take (80, 256: flash-decoding computes every row), block sizes other than 16.
TEST(CudaPrefillAttention, OtherLayoutsAndFallback) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> seqs = {{130, 100}, {0, 1}, {7, 70}};
  for (DType dtype : kCacheDtypes) {
    check_step(16, 16, 128, dtype, seqs, 31);
    check_step(32, 4, 64, dtype, seqs, 32);
    check_step(16, 8, 128, dtype, seqs, 33, 1);
    check_step(16, 8, 64, dtype, seqs, 34, 5);
    check_step(8, 2, 80, dtype, seqs, 35);
    check_step(8, 2, 256, dtype, seqs, 36);
  }
}

// The prefill kernel itself on every row (a plan with threshold 1), so chunks of 1..130 rows
// (partial tiles, single rows, a tile whose rows span several key tiles) each go through it.
TEST(CudaPrefillAttention, EveryChunkLengthThroughTheKernel) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> seqs = {{0, 1},    {0, 2},     {3, 15},   {16, 16},
                                     {64, 17},  {0, 63},    {1, 64},   {0, 65},
                                     {4096, 7}, {200, 127}, {63, 128}, {4031, 130}};
  for (DType dtype : kCacheDtypes)
    for (int hd : {64, 128})
      for (int block_size : {16, 3}) {
        const PrefillProblem pb(16, 8, hd, block_size, dtype, seqs, 41 + hd + block_size);
        SCOPED_TRACE(describe(pb));
        CudaBackend gpu(0);
        KvCacheLayer cache{gpu.upload(pb.cache_k), gpu.upload(pb.cache_v)};
        gpu.prepare_batch(pb.batch);
        gpu.store_kv(gpu.upload(pb.k), gpu.upload(pb.v), pb.batch, cache);
        const int T = pb.batch.num_tokens, S = pb.batch.num_seqs();
        const cuda::AttentionDispatch plan =
            cuda::plan_attention_dispatch(pb.batch.query_start, pb.batch.positions, 1);
        int max_blocks = 1;
        for (const auto& table : pb.batch.block_tables)
          max_blocks = std::max(max_blocks, static_cast<int>(table.size()));
        Tensor table = Tensor::empty({S, max_blocks}, DType::I32);
        std::fill(table.ptr<int32_t>(), table.ptr<int32_t>() + table.numel(), 0);
        for (int s = 0; s < S; ++s)
          std::copy(pb.batch.block_tables[s].begin(), pb.batch.block_tables[s].end(),
                    table.ptr<int32_t>() + s * max_blocks);
        Tensor positions = Tensor::empty({T}, DType::I32);
        std::copy(pb.batch.positions.begin(), pb.batch.positions.end(), positions.ptr<int32_t>());
        const int tile_words = static_cast<int>(sizeof(cuda::PrefillTile) / sizeof(int32_t));
        Tensor tiles =
            Tensor::empty({static_cast<int64_t>(plan.tiles.size()) * tile_words}, DType::I32);
        std::memcpy(tiles.data, plan.tiles.data(), tiles.nbytes());
        const Tensor d_table = gpu.upload(table), d_positions = gpu.upload(positions);
        const Tensor d_tiles = gpu.upload(tiles), d_q = gpu.upload(pb.q);
        Tensor out = device_nan(gpu, {T, pb.hq * hd});
        cuda::PrefillAttentionArgs a;
        a.q = d_q.ptr<float>();
        a.k_cache = cache.k.data;
        a.v_cache = cache.v.data;
        a.kv_dtype = dtype;
        a.positions = d_positions.ptr<int32_t>();
        a.block_table = d_table.ptr<int32_t>();
        a.max_blocks = max_blocks;
        a.tiles = static_cast<const cuda::PrefillTile*>(d_tiles.data);
        a.num_tiles = static_cast<int>(plan.tiles.size());
        a.hq = pb.hq;
        a.hkv = pb.hkv;
        a.head_dim = hd;
        a.block_size = block_size;
        a.scale = pb.scale();
        a.out = out.ptr<float>();
        cuda::launch_prefill_attention(a, gpu.stream());
        std::vector<int32_t> rows(T);
        std::iota(rows.begin(), rows.end(), 0);
        EXPECT_TRUE(
            rows_close(to_host(gpu, out), pb.rounded_oracle(), rows, pb.prefill_tolerance(), 0.0));
      }
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): prefill_attention_kernel at one KV
// head. A 70-row chunk from scratch: a whole tile and a 6-row one, the causal mask on the
// diagonal key tile (hd 128, f32 cache rounded while staging); a 20-row chunk after a cached
// prefix of 40 (the prefix's key tile read unmasked, the next masked), block size 3, hd 64,
// bf16 cache; a step with two prefill chunks and a decode row (both kernels in one call; 165
// positions: three key tiles, the last partial).
TEST(CudaSanitizerSized, AttentionPrefill) {
  SKIP_WITHOUT_CUDA();
  check_step(2, 1, 128, DType::F32, {{0, 70}}, 51);
  check_step(2, 1, 64, DType::BF16, {{40, 20}}, 52, 3, 1);
  check_step(2, 1, 64, DType::F32, {{0, 64}, {5, 1}, {100, 65}}, 53);
}

TEST(CudaPrefillAttention, RefusesShapesItCannotTake) {
  EXPECT_TRUE(cuda::prefill_attention_supports(128, DType::BF16, nullptr, nullptr));
  EXPECT_TRUE(cuda::prefill_attention_supports(64, DType::F32, nullptr, nullptr));
  EXPECT_FALSE(cuda::prefill_attention_supports(80, DType::BF16, nullptr, nullptr));
  EXPECT_FALSE(cuda::prefill_attention_supports(256, DType::F32, nullptr, nullptr));
  EXPECT_FALSE(cuda::prefill_attention_supports(128, DType::F16, nullptr, nullptr));
  alignas(16) static const uint16_t row[16] = {};
  EXPECT_FALSE(cuda::prefill_attention_supports(128, DType::BF16, row + 1, row));
  cuda::PrefillAttentionArgs a;
  a.num_tiles = 1;
  a.hq = 16;
  a.hkv = 8;
  a.head_dim = 96;
  a.kv_dtype = DType::BF16;
  a.block_size = 16;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), std::logic_error);  // before a launch
}

}  // namespace
}  // namespace attnres::test
