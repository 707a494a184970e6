// qk_norm_rope, store_kv, paged attention and the two depth-attention phases of the CUDA
// backend against the CPU backend. Tolerances are listed in cuda_ops_test.cpp's header.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "tests/cpp/kernels/cuda/cuda_depth_bank_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"
#include "tests/cpp/kernels/cuda/paged_batch_util.h"

namespace attnres::test {
namespace {

struct Backends {
  CpuBackend cpu{2};
  CudaBackend gpu{0};
};

// --- qk_norm_rope ---

TEST(CudaOps, QkNormRope) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(11);
  struct Case {
    int hq, hkv, hd;
    bool gains;
    int max_pos;
  };
  for (const Case& c : std::vector<Case>{{4, 2, 16, true, 50},
                                         {16, 8, 64, false, 4000},
                                         {16, 8, 128, true, 30000},
                                         {3, 1, 6, true, 10}}) {
    const int T = 5;
    BatchMeta batch;
    batch.num_tokens = T;
    std::uniform_int_distribution<int> pos(0, c.max_pos);
    for (int t = 0; t < T; ++t) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(pos(rng));
      batch.slot_mapping.push_back(t);
    }
    batch.query_start = {0, T};
    batch.context_len = {c.max_pos + 1};
    batch.block_tables = {{0}};
    Tensor q = random_host({T, c.hq * c.hd}, DType::F32, rng, -2.0f, 2.0f);
    Tensor k = random_host({T, c.hkv * c.hd}, DType::F32, rng, -2.0f, 2.0f);
    Tensor qg = random_host({c.hd}, DType::BF16, rng, 0.5f, 1.5f);
    Tensor kg = random_host({c.hd}, DType::F32, rng, 0.5f, 1.5f);
    std::vector<float> freq(c.hd / 2);
    for (int i = 0; i < c.hd / 2; ++i)
      freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / c.hd));
    Tensor inv_freq = Tensor::empty({c.hd / 2}, DType::F32);
    std::copy(freq.begin(), freq.end(), inv_freq.ptr<float>());

    Tensor qd = be.gpu.upload(q), kd = be.gpu.upload(k);
    Tensor qgd = be.gpu.upload(qg), kgd = be.gpu.upload(kg), fd = be.gpu.upload(inv_freq);
    be.cpu.qk_norm_rope(q, k, c.hd, c.gains ? &qg : nullptr, c.gains ? &kg : nullptr, 1e-6f,
                        inv_freq, batch);
    be.gpu.prepare_batch(batch);
    be.gpu.qk_norm_rope(qd, kd, c.hd, c.gains ? &qgd : nullptr, c.gains ? &kgd : nullptr, 1e-6f, fd,
                        batch);
    EXPECT_TRUE(close_to(to_host(be.gpu, qd), q, 1e-5)) << "q hd " << c.hd;
    EXPECT_TRUE(close_to(to_host(be.gpu, kd), k, 1e-5)) << "k hd " << c.hd;
  }
}

// --- store_kv + attention ---

// One case with a cache of `cache_dtype`: store_kv must write exactly the CPU's values (a bf16
// cache: the same rounding, bit for bit), attention must match the CPU's over that cache.
void check_attention_cache(DType cache_dtype, int hq, int hkv, int hd, int block_size,
                           const std::vector<SeqSpec>& seqs, float q_scale, uint32_t seed) {
  SCOPED_TRACE("hq " + std::to_string(hq) + " hkv " + std::to_string(hkv) + " hd " +
               std::to_string(hd) + " block " + std::to_string(block_size) + " cache " +
               std::string(dtype_name(cache_dtype)));
  Backends be;
  std::mt19937 rng(seed);
  const int num_blocks = 96, row = hkv * hd;
  const BatchMeta batch = paged_batch(seqs, block_size, num_blocks, rng);
  const int T = batch.num_tokens;

  // Caches: random everywhere (so unwritten slots must stay as they were), identical on
  // both backends. The cached prefixes are "already there"; store_kv writes this step's rows.
  Tensor kc = random_host({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  Tensor vc = random_host({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  KvCacheLayer cpu_cache{kc, vc};
  KvCacheLayer gpu_cache{be.gpu.upload(kc), be.gpu.upload(vc)};
  Tensor k = random_host({T, row}, DType::F32, rng);
  Tensor v = random_host({T, row}, DType::F32, rng);
  Tensor q = random_host({T, hq * hd}, DType::F32, rng, -q_scale, q_scale);

  be.gpu.prepare_batch(batch);
  be.cpu.store_kv(k, v, batch, cpu_cache);
  be.gpu.store_kv(be.gpu.upload(k), be.gpu.upload(v), batch, gpu_cache);
  EXPECT_TRUE(same_bytes(to_host(be.gpu, gpu_cache.k), cpu_cache.k)) << "store_kv k";
  EXPECT_TRUE(same_bytes(to_host(be.gpu, gpu_cache.v), cpu_cache.v)) << "store_kv v";

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor ref = Tensor::empty({T, hq * hd}, DType::F32);
  be.cpu.attention(q, cpu_cache, batch, hd, scale, ref);
  Tensor out = device_nan(be.gpu, {T, hq * hd});
  be.gpu.attention(be.gpu.upload(q), gpu_cache, batch, hd, scale, out);
  EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, 2e-5)) << "attention";
}

void check_attention(int hq, int hkv, int hd, int block_size, const std::vector<SeqSpec>& seqs,
                     float q_scale, uint32_t seed) {
  for (DType cache_dtype : {DType::F32, DType::BF16})
    check_attention_cache(cache_dtype, hq, hkv, hd, block_size, seqs, q_scale, seed);
}

TEST(CudaOps, AttentionPrefillMixed) {
  SKIP_WITHOUT_CUDA();
  check_attention(4, 2, 16, 4, {{0, 5}, {7, 1}, {3, 3}}, 1.0f, 21);
}
TEST(CudaOps, AttentionDecodeLongContexts) {
  SKIP_WITHOUT_CUDA();
  check_attention(8, 8, 64, 16, {{0, 1}, {40, 1}, {300, 1}, {17, 1}}, 1.0f, 22);
}
TEST(CudaOps, AttentionGqaHd128) {
  SKIP_WITHOUT_CUDA();
  check_attention(16, 8, 128, 16, {{30, 17}, {0, 33}}, 1.0f, 23);
}
TEST(CudaOps, AttentionOddHeadDims) {
  SKIP_WITHOUT_CUDA();
  check_attention(6, 2, 80, 8, {{9, 4}}, 1.0f, 24);
  check_attention(4, 1, 256, 16, {{20, 3}}, 1.0f, 25);
  check_attention(2, 1, 6, 3, {{5, 2}, {1, 1}}, 1.0f, 26);
}
TEST(CudaOps, AttentionLargeLogits) {
  SKIP_WITHOUT_CUDA();
  check_attention(4, 2, 64, 16, {{50, 4}, {5, 2}}, 20.0f, 27);
}

// --- depth attention ---

// Phase 1 on a bank of bank_dtype (the CPU's and the GPU's hold the same rounded values).
// misaligned: the bank is a view one element into its buffer, so the kernels take their scalar
// path whatever d is.
void check_phase1(int S, int n, int64_t T, int64_t d, float q_scale, double tol, uint32_t seed,
                  DType bank_dtype, bool misaligned = false) {
  SCOPED_TRACE("S " + std::to_string(S) + " n " + std::to_string(n) + " T " + std::to_string(T) +
               " d " + std::to_string(d) + " q_scale " + std::to_string(q_scale) + " bank " +
               std::string(dtype_name(bank_dtype)) + (misaligned ? " misaligned" : ""));
  Backends be;
  std::mt19937 rng(seed);
  const int capacity = n + 1;
  Tensor queries = random_host({S, d}, DType::F32, rng, -q_scale, q_scale);
  const int64_t skip = misaligned ? 1 : 0;
  Tensor flat = random_host({skip + capacity * T * d}, DType::F32, rng, -2.0f, 2.0f);
  for (int64_t i = skip + n * T * d; i < flat.numel(); ++i) flat.ptr<float>()[i] = kNaN;  // dead
  const Tensor flat_cpu = bank_on(be.cpu, flat, bank_dtype);
  const Tensor flat_gpu = bank_on(be.gpu, flat, bank_dtype);
  ASSERT_TRUE(same_bank_bits(be.cpu, flat_cpu, be.gpu, flat_gpu));
  const Tensor bank = flat_cpu.rows(skip, flat.numel()).reshape({capacity, T, d});
  const Tensor bank_d = flat_gpu.rows(skip, flat.numel()).reshape({capacity, T, d});
  Tensor m = Tensor::empty({S, T}, DType::F32), s = Tensor::empty({S, T}, DType::F32);
  Tensor o = Tensor::empty({S, T, d}, DType::F32);
  be.cpu.depth_phase1(queries, bank, n, 1e-6f, m, s, o);
  Tensor md = device_nan(be.gpu, {S, T}), sd = device_nan(be.gpu, {S, T});
  Tensor od = device_nan(be.gpu, {S, T, d});
  be.gpu.depth_phase1(be.gpu.upload(queries), bank_d, n, 1e-6f, md, sd, od);
  EXPECT_TRUE(close_to(to_host(be.gpu, md), m, tol)) << "m";
  EXPECT_TRUE(close_to(to_host(be.gpu, sd), s, tol)) << "s";
  EXPECT_TRUE(close_to(to_host(be.gpu, od), o, tol)) << "o";
}

TEST(CudaOps, DepthPhase1) {
  SKIP_WITHOUT_CUDA();
  for (DType bank : kBankDtypes) {
    uint32_t seed = 100;
    for (int S = 1; S <= 4; ++S)
      for (int n = 1; n <= 6; ++n) check_phase1(S, n, 3, 67, 1.0f, 2e-5, seed++, bank);
    for (int S = 1; S <= 8; ++S) check_phase1(S, 3, 3, 1024, 1.0f, 2e-5, seed++, bank);  // 8-wide
    check_phase1(2, 5, 7, 1024, 1.0f, 2e-5, seed++, bank);
    check_phase1(3, 4, 2, 8192, 1.0f, 2e-5, seed++, bank);  // the 8-wide path loops over the row
    check_phase1(9, 3, 4, 256, 1.0f, 2e-5, seed++, bank);   // more than 8 queries: two groups
    check_phase1(3, 4, 3, 1024, 1.0f, 2e-5, seed++, bank, true);  // unaligned: scalar path
    // Where o stays in registers (depth_phase1_kernel's C): one chunk per thread on the
    // 8-wide path up to d 2048 (8 queries: the most accumulators), two on the scalar path
    // up to d 2048, and in memory beyond.
    check_phase1(8, 5, 3, 2048, 1.0f, 2e-5, seed++, bank);
    check_phase1(8, 5, 3, 1500, 1.0f, 2e-5, seed++, bank, true);
    check_phase1(5, 4, 2, 2500, 1.0f, 2e-5, seed++, bank, true);
    check_phase1(5, 4, 2, 4096, 1.0f, 2e-5, seed++, bank);
  }
}

TEST(CudaOps, DepthPhase1LargeLogits) {
  SKIP_WITHOUT_CUDA();
  for (DType bank : kBankDtypes)
    check_phase1(4, 6, 5, 1024, 3.0f, 3e-4, 200, bank);  // |logit| ~ 50
}

void check_phase2(int64_t T, int64_t d, bool mixing, bool alias, float q_scale, DType gain_dtype,
                  double tol, uint32_t seed) {
  SCOPED_TRACE("T " + std::to_string(T) + " d " + std::to_string(d) + (mixing ? " mix" : "") +
               (alias ? " alias" : "") + " q_scale " + std::to_string(q_scale));
  Backends be;
  std::mt19937 rng(seed);
  Tensor partial = random_host({T, d}, DType::F32, rng, -2.0f, 2.0f);
  Tensor m = random_host({T}, DType::F32, rng, -3.0f, 3.0f);
  Tensor s = random_host({T}, DType::F32, rng, 1.0f, 4.0f);
  Tensor o = random_host({T, d}, DType::F32, rng, -2.0f, 2.0f);
  Tensor query = random_host({d}, DType::F32, rng, -q_scale, q_scale);
  Tensor gain = random_host({d}, gain_dtype, rng, 0.5f, 1.5f);
  Tensor md = be.gpu.upload(m), sd = be.gpu.upload(s), od = be.gpu.upload(o);
  Tensor qd = be.gpu.upload(query), gd = be.gpu.upload(gain), pd = be.gpu.upload(partial);
  Backend::DepthMixArgs cpu_mix, gpu_mix;
  if (mixing) {
    cpu_mix.m = &m, cpu_mix.s = &s, cpu_mix.o = &o, cpu_mix.query = &query;
    gpu_mix.m = &md, gpu_mix.s = &sd, gpu_mix.o = &od, gpu_mix.query = &qd;
    cpu_mix.bias = gpu_mix.bias = 0.37f;
  }
  Tensor ref = Tensor::empty({T, d}, DType::F32);
  be.cpu.depth_phase2_prenorm(cpu_mix, partial, gain, 1e-6f, ref);
  Tensor out = alias ? pd : device_nan(be.gpu, {T, d});
  be.gpu.depth_phase2_prenorm(gpu_mix, pd, gd, 1e-6f, out);
  EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, tol));
}

TEST(CudaOps, DepthPhase2Prenorm) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 300;
  for (int64_t d : {1, 67, 1024, 8192})
    for (bool mixing : {true, false})
      for (bool alias : {false, true})
        check_phase2(5, d, mixing, alias, 1.0f, DType::BF16, 2e-5, seed++);
  check_phase2(3, 512, true, false, 1.0f, DType::F32, 2e-5, seed++);
  check_phase2(4, 1024, true, true, 3.0f, DType::F16, 3e-4, seed++);  // large partial logit
}

// Phase 1 then Phase 2 chained through device tensors, as the forward uses them (an f32 and a
// bf16 bank).
TEST(CudaOps, DepthPhasesChained) {
  SKIP_WITHOUT_CUDA();
  for (DType bank_dtype : kBankDtypes) {
    SCOPED_TRACE(std::string("bank ") + std::string(dtype_name(bank_dtype)));
    Backends be;
    std::mt19937 rng(400);
    const int S = 3, n = 4;
    const int64_t T = 6, d = 96;
    Tensor queries = random_host({S, d}, DType::F32, rng);
    const Tensor bank_host = random_host({n, T, d}, DType::F32, rng, -2.0f, 2.0f);
    Tensor partial = random_host({T, d}, DType::F32, rng, -2.0f, 2.0f);
    Tensor gain = random_host({d}, DType::BF16, rng, 0.5f, 1.5f);
    const Tensor bank = bank_on(be.cpu, bank_host, bank_dtype);
    Tensor m = Tensor::empty({S, T}, DType::F32), s = Tensor::empty({S, T}, DType::F32);
    Tensor o = Tensor::empty({S, T, d}, DType::F32);
    be.cpu.depth_phase1(queries, bank, n, 1e-6f, m, s, o);
    Tensor qd = be.gpu.upload(queries), pd = be.gpu.upload(partial);
    const Tensor bd = bank_on(be.gpu, bank_host, bank_dtype);
    Tensor gd = be.gpu.upload(gain);
    Tensor md = be.gpu.alloc({S, T}, DType::F32), sd = be.gpu.alloc({S, T}, DType::F32);
    Tensor od = be.gpu.alloc({S, T, d}, DType::F32);
    be.gpu.depth_phase1(qd, bd, n, 1e-6f, md, sd, od);
    for (int l = 0; l < S; ++l) {
      Tensor ml = m.row(l), sl = s.row(l), ol = o.row(l), ql = queries.row(l);
      Tensor mld = md.row(l), sld = sd.row(l), old = od.row(l), qld = qd.row(l);
      Backend::DepthMixArgs cm, gm;
      cm.m = &ml, cm.s = &sl, cm.o = &ol, cm.query = &ql, cm.bias = 0.1f * l;
      gm.m = &mld, gm.s = &sld, gm.o = &old, gm.query = &qld, gm.bias = 0.1f * l;
      Tensor ref = Tensor::empty({T, d}, DType::F32);
      be.cpu.depth_phase2_prenorm(cm, partial, gain, 1e-6f, ref);
      Tensor out = device_nan(be.gpu, {T, d});
      be.gpu.depth_phase2_prenorm(gm, pd, gd, 1e-6f, out);
      EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, 2e-5)) << "sublayer " << l;
    }
  }
}

// --- sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers") ---

// depth_phase1_kernel<S, V, B, C>: every query count S of one group (1..8, the bank alternating
// F32 / BF16) and two groups (9); the 8-wide path with o in registers (d 64: one vector per
// thread) and in memory (d 2056: 257 vectors over 256 threads); the scalar path with one and
// two chunks held (d 67; d 1500 misaligned: 1024 threads) and in memory (d 2100 misaligned).
TEST(CudaSanitizerSized, DepthPhase1) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 700;
  for (int S = 1; S <= 8; ++S)
    check_phase1(S, 3, 2, 64, 1.0f, 2e-5, seed++, S % 2 ? DType::F32 : DType::BF16);
  for (DType bank : kBankDtypes) {
    check_phase1(9, 2, 2, 64, 1.0f, 2e-5, seed++, bank);
    check_phase1(2, 3, 1, 2056, 1.0f, 2e-5, seed++, bank);
    check_phase1(3, 4, 2, 67, 1.0f, 2e-5, seed++, bank);
    check_phase1(2, 3, 1, 1500, 1.0f, 2e-5, seed++, bank, true);
    check_phase1(2, 3, 1, 2100, 1.0f, 2e-5, seed++, bank, true);
  }
}

// depth_phase2_prenorm_kernel (block mode's plain merge, and the plain pre-norm): one partial
// warp (d 1), a partial last warp (d 67), a row longer than the block (d 2100); merged and
// plain, in place and not; each gain dtype.
TEST(CudaSanitizerSized, DepthPhase2Prenorm) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 750;
  for (int64_t d : {1, 67})
    for (bool mixing : {true, false})
      for (bool alias : {false, true})
        check_phase2(3, d, mixing, alias, 1.0f, DType::BF16, 2e-5, seed++);
  check_phase2(2, 2100, true, false, 1.0f, DType::F32, 2e-5, seed++);
  check_phase2(2, 2100, false, true, 1.0f, DType::F16, 2e-5, seed++);
}

}  // namespace
}  // namespace attnres::test
