// The decode fusions of the CUDA backend against the two-launch paths they replace and the CPU:
// - qk_norm_rope_store (RoPE and the KV store in one launch) against qk_norm_rope then store_kv
//   on the GPU (q, k and the cache bit for bit: one code path computes the roped values) and
//   the CPU's default (q, k: 1e-5; the v rows in the cache: bit for bit, a pure conversion;
//   the k rows: 1e-5 in an f32 cache, one bf16 rounding step (2^-8 relative) in a bf16 one,
//   as the roped value on the two devices may differ in its last f32 bit);
// - prenorm_linear_many / prenorm_linear_swiglu (the PreNorm as the GEMV's prologue) against
//   depth_phase2_prenorm then linear_many / linear_swiglu on the GPU (bit for bit: the
//   prologue repeats the PreNorm kernels' arithmetic in their order) and the CPU (2e-5 at <= 8
//   rows; 1e-2 on the cuBLAS bf16 path of more rows), at the 0.6B shapes (d 1024, 16 q / 8 kv
//   heads of 128, ffn 3072), rows 1..8 and a prefill-sized 12 (the fallback);
// - prenorm_qkv_rope_store (the QKV GEMV with the PreNorm as its prologue and RoPE + the KV
//   store as its epilogue) against its default on the GPU, prenorm_linear_many then
//   qk_norm_rope_store (q, k, v and both caches bit for bit; one launch where those take two,
//   two where the prologue declines the mix and they take three), and the CPU (q, k, v and the
//   f32 caches 5e-5; a bf16 cache one bf16 rounding step, 8e-3; 1e-2 / 2e-2 on the cuBLAS bf16
//   path of more rows), at the 0.6B shapes and hd 6 / 64 / 256 heads;
// - whole models: the fused backend's logits equal those of a CUDA backend whose fused ops are
//   the defaults (the unfused calls), bit for bit, over a prefill and decode steps; and with
//   only prenorm_qkv_rope_store the default, also the K / V caches, with one kernel launch more
//   per layer of a decode step (none more under delta_v, whose attention does not fuse).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"
#include "tests/cpp/kernels/cuda/paged_batch_util.h"

namespace attnres::test {
namespace {

struct Backends {
  CpuBackend cpu{2};
  CudaBackend gpu{0};
};

// The CUDA backend with the fused ops' defaults: the two-launch paths they replace.
class UnfusedCudaBackend : public CudaBackend {
 public:
  UnfusedCudaBackend() : CudaBackend(0) {}
  void qk_norm_rope_store_impl(Tensor& q, Tensor& k, const Tensor& v, int hd, const Tensor* qg,
                               const Tensor* kg, float eps, const Tensor& inv_freq,
                               const BatchMeta& batch, KvCacheLayer& cache) override {
    Backend::qk_norm_rope_store_impl(q, k, v, hd, qg, kg, eps, inv_freq, batch, cache);
  }
  void prenorm_linear_many_impl(const PrenormArgs& in, std::span<const LinearTarget> t) override {
    Backend::prenorm_linear_many_impl(in, t);
  }
  void prenorm_linear_swiglu_impl(const PrenormArgs& in, const Tensor& wg, const Tensor* bg,
                                  const Tensor& wu, const Tensor* bu, Tensor& gate, Tensor& up,
                                  Tensor& out) override {
    Backend::prenorm_linear_swiglu_impl(in, wg, bg, wu, bu, gate, up, out);
  }
  void prenorm_qkv_rope_store_impl(const PrenormArgs& in, std::span<const LinearTarget, 3> qkv,
                                   const RopeStoreArgs& rope) override {
    Backend::prenorm_qkv_rope_store_impl(in, qkv, rope);
  }
  void prenorm_mlp_residual_impl(const PrenormArgs& in, const Tensor& wg, const Tensor* bg,
                                 const Tensor& wu, const Tensor* bu, Tensor& gate, Tensor& up,
                                 Tensor& act, const Tensor& wd, const Tensor* bd,
                                 const Tensor& residual, Tensor& out) override {
    Backend::prenorm_mlp_residual_impl(in, wg, bg, wu, bu, gate, up, act, wd, bd, residual, out);
  }
};

// The CUDA backend with only prenorm_qkv_rope_store the default: the path before the QKV
// GEMV took RoPE + the KV store as its epilogue (prenorm_linear_many, then qk_norm_rope_store).
class TwoLaunchQkvRopeBackend : public CudaBackend {
 public:
  TwoLaunchQkvRopeBackend() : CudaBackend(0) {}
  void prenorm_qkv_rope_store_impl(const PrenormArgs& in, std::span<const LinearTarget, 3> qkv,
                                   const RopeStoreArgs& rope) override {
    Backend::prenorm_qkv_rope_store_impl(in, qkv, rope);
  }
};

Tensor inv_freq_host(int hd) {
  Tensor t = Tensor::empty({hd / 2}, DType::F32);
  for (int i = 0; i < hd / 2; ++i)
    t.ptr<float>()[i] = static_cast<float>(std::pow(1000000.0, -2.0 * i / hd));
  return t;
}

// A quiet NaN with a payload in some v elements: the cache must keep the CPU's bits for it.
void plant_nans(Tensor& v) {
  const uint32_t bits[] = {0x7fc12345u, 0xffa00001u, 0x7f800001u};  // quiet, negative, signalling
  for (int i = 0; i < 3; ++i) {
    const int64_t at = (7 + 131 * i) % v.numel();
    std::memcpy(v.ptr<float>() + at, &bits[i], 4);
  }
}

// --- qk_norm_rope_store ---

void check_rope_store(DType cache_dtype, const std::vector<SeqSpec>& seqs, int hq, int hkv, int hd,
                      uint32_t seed) {
  SCOPED_TRACE(std::string(dtype_name(cache_dtype)) + " cache, hq " + std::to_string(hq) + " hkv " +
               std::to_string(hkv) + " hd " + std::to_string(hd) + ", " +
               std::to_string(seqs.size()) + " sequences");
  Backends be;
  std::mt19937 rng(seed);
  const int block_size = 16, num_blocks = 128;  // 8 decode rows take 71 blocks
  const BatchMeta batch = paged_batch(seqs, block_size, num_blocks, rng);
  const int T = batch.num_tokens;
  Tensor q = random_host({T, hq * hd}, DType::F32, rng, -2.0f, 2.0f);
  Tensor k = random_host({T, hkv * hd}, DType::F32, rng, -2.0f, 2.0f);
  Tensor v = random_host({T, hkv * hd}, DType::F32, rng, -2.0f, 2.0f);
  plant_nans(v);
  Tensor qg = random_host({hd}, DType::BF16, rng, 0.5f, 1.5f);
  Tensor kg = random_host({hd}, DType::F32, rng, 0.5f, 1.5f);
  const Tensor inv_freq = inv_freq_host(hd);
  // Random caches everywhere: a slot the step does not own must keep its bytes.
  const Tensor kc = random_host({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  const Tensor vc = random_host({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  const float eps = 1e-6f;

  // The CPU's default: qk_norm_rope then store_kv.
  Tensor q_cpu = clone_host(q), k_cpu = clone_host(k);
  KvCacheLayer cpu_cache{clone_host(kc), clone_host(vc)};
  be.cpu.qk_norm_rope_store(q_cpu, k_cpu, v, hd, &qg, &kg, eps, inv_freq, batch, cpu_cache);

  const Tensor qgd = be.gpu.upload(qg), kgd = be.gpu.upload(kg), fd = be.gpu.upload(inv_freq);
  const Tensor vd = be.gpu.upload(v);
  be.gpu.prepare_batch(batch);
  // The GPU's two launches.
  Tensor q_two = be.gpu.upload(q), k_two = be.gpu.upload(k);
  KvCacheLayer two_cache{be.gpu.upload(kc), be.gpu.upload(vc)};
  be.gpu.qk_norm_rope(q_two, k_two, hd, &qgd, &kgd, eps, fd, batch);
  be.gpu.store_kv(k_two, vd, batch, two_cache);
  // The fused launch.
  Tensor q_one = be.gpu.upload(q), k_one = be.gpu.upload(k);
  KvCacheLayer one_cache{be.gpu.upload(kc), be.gpu.upload(vc)};
  be.gpu.qk_norm_rope_store(q_one, k_one, vd, hd, &qgd, &kgd, eps, fd, batch, one_cache);

  const Tensor q_got = to_host(be.gpu, q_one), k_got = to_host(be.gpu, k_one);
  const Tensor kc_got = to_host(be.gpu, one_cache.k), vc_got = to_host(be.gpu, one_cache.v);
  EXPECT_TRUE(same_bytes(q_got, to_host(be.gpu, q_two))) << "q vs the two launches";
  EXPECT_TRUE(same_bytes(k_got, to_host(be.gpu, k_two))) << "k vs the two launches";
  EXPECT_TRUE(same_bytes(kc_got, to_host(be.gpu, two_cache.k))) << "k cache vs the two launches";
  EXPECT_TRUE(same_bytes(vc_got, to_host(be.gpu, two_cache.v))) << "v cache vs the two launches";
  EXPECT_TRUE(close_to(q_got, q_cpu, 1e-5)) << "q vs the CPU";
  EXPECT_TRUE(close_to(k_got, k_cpu, 1e-5)) << "k vs the CPU";
  EXPECT_TRUE(same_bytes(vc_got, cpu_cache.v)) << "v cache vs the CPU";
  const double k_tol = cache_dtype == DType::BF16 ? 8e-3 : 1e-5;
  EXPECT_TRUE(close_to(kc_got, cpu_cache.k, k_tol)) << "k cache vs the CPU";
}

TEST(CudaFusedDecode, QkNormRopeStoreMatchesTheTwoOps) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 40;
  for (DType cache_dtype : {DType::F32, DType::BF16}) {
    for (int rows = 1; rows <= 8; ++rows) {  // decode rows, contexts across block boundaries
      std::vector<SeqSpec> seqs;
      for (int s = 0; s < rows; ++s) seqs.push_back({5 + 37 * s, 1});
      check_rope_store(cache_dtype, seqs, 16, 8, 128, seed++);
    }
    check_rope_store(cache_dtype, {{0, 40}, {20, 9}, {3, 1}}, 16, 8, 128, seed++);  // prefill
    check_rope_store(cache_dtype, {{2, 3}, {0, 1}}, 3, 1, 6, seed++);  // odd: hd 6, group 3
  }
}

// --- the PreNorm as the GEMV's prologue ---

enum class Mix { Plain, Merge, NullSource };  // NullSource: a §2d mix the prologue declines

const char* mix_name(Mix mix) {
  return mix == Mix::Plain ? "plain pre-norm" : mix == Mix::Merge ? "Phase-2 merge" : "null source";
}

// Host tensors for one PreNorm (depth_phase2_prenorm's arguments), and their device copies.
struct PrenormInputs {
  Tensor partial, gain, m, s, o, query, null_source;
  Backend::DepthMixArgs mix_args(Mix mix) const {
    Backend::DepthMixArgs a;
    if (mix == Mix::Plain) return a;
    a.m = &m;
    a.s = &s;
    a.o = &o;
    a.query = &query;
    a.bias = 0.37f;
    a.mix_eps = 2e-6f;
    if (mix == Mix::NullSource) {
      a.null_source = &null_source;
      a.null_logit = 0.25f;
    }
    return a;
  }
  PrenormInputs upload(Backend& be) const {
    return {be.upload(partial), be.upload(gain),  be.upload(m),          be.upload(s),
            be.upload(o),       be.upload(query), be.upload(null_source)};
  }
};

PrenormInputs random_prenorm(int64_t rows, int64_t d, std::mt19937& rng) {
  PrenormInputs in;
  in.partial = random_host({rows, d}, DType::F32, rng, -3.0f, 3.0f);
  in.gain = random_host({d}, DType::BF16, rng, 0.5f, 1.5f);
  in.m = random_host({rows}, DType::F32, rng, -1.0f, 1.0f);
  in.s = random_host({rows}, DType::F32, rng, 1.0f, 4.0f);
  in.o = random_host({rows, d}, DType::F32, rng, -2.0f, 2.0f);
  in.query = random_host({d}, DType::F32, rng, -0.1f, 0.1f);
  in.null_source = random_host({d}, DType::F32, rng);
  return in;
}

bool all_nan(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isnan(element_as_float(t, i))) return false;
  return true;
}

struct Weights {
  Tensor w, b, wd, bd;
};
Weights random_weight(Backend& gpu, int64_t n, int64_t k, DType dtype, std::mt19937& rng) {
  Weights w{random_host({n, k}, dtype, rng, -0.05f, 0.05f), random_host({n}, dtype, rng), {}, {}};
  w.wd = gpu.upload(w.w);
  w.bd = gpu.upload(w.b);
  return w;
}

// The widths of one decoder layer's linears (default: the 0.6B shapes).
struct LinearShapes {
  int64_t d = 1024, nq = 2048, nkv = 1024, ffn = 3072;
};

// bulk: the GPU backend with the GEMV bulk lever on (both of its launches).
void check_prenorm_linear(int64_t rows, Mix mix, DType wdt, uint32_t seed,
                          LinearShapes shapes = {}, bool bulk = false) {
  const int64_t d = shapes.d, nq = shapes.nq, nkv = shapes.nkv, ffn = shapes.ffn;
  SCOPED_TRACE(std::to_string(rows) + " rows, " + mix_name(mix) + ", " +
               std::string(dtype_name(wdt)) + " weights, d " + std::to_string(d) +
               (bulk ? ", bulk lever" : ""));
  Backends be;
  be.gpu.set_gemv_bulk(bulk);
  std::mt19937 rng(seed);
  const PrenormInputs host = random_prenorm(rows, d, rng);
  const PrenormInputs dev = host.upload(be.gpu);
  const bool fused = rows <= 8 && mix != Mix::NullSource;
  // A prefill-sized batch meets bf16 weights in cuBLAS with its x rounded to bf16: the CPU
  // reference then takes the same rounded x (below), and differs by summation order alone.
  // (Against an f32 x the worst of 36864 outputs missed 1e-2 on an H200: bf16's 2^-9.)
  const bool gpu_rounds_x = rows > cuda::kMaxGemvRows && wdt == DType::BF16;
  const double tol = gpu_rounds_x ? 2e-3 : 2e-5;

  Backend::PrenormArgs cpu_in;
  cpu_in.mix = host.mix_args(mix);
  cpu_in.partial = &host.partial;
  cpu_in.gain = &host.gain;
  cpu_in.eps = 1e-6f;
  Tensor cpu_normed = Tensor::empty({rows, d}, DType::F32);
  cpu_in.normed = &cpu_normed;
  Backend::PrenormArgs gpu_in = cpu_in;
  gpu_in.mix = dev.mix_args(mix);
  gpu_in.partial = &dev.partial;
  gpu_in.gain = &dev.gain;
  Tensor gpu_normed = device_nan(be.gpu, {rows, d});
  gpu_in.normed = &gpu_normed;
  // The GPU's two launches: the PreNorm into its own buffer, then the linears.
  Tensor two_normed = device_nan(be.gpu, {rows, d});
  be.gpu.depth_phase2_prenorm(gpu_in.mix, dev.partial, dev.gain, gpu_in.eps, two_normed);

  // q, k, v.
  const int64_t widths[3] = {nq, nkv, nkv};
  std::vector<Weights> w;
  std::vector<Tensor> cpu_out, one_out, two_out;
  std::vector<Backend::LinearTarget> cpu_t, one_t, two_t;
  for (int64_t n : widths) {
    w.push_back(random_weight(be.gpu, n, d, wdt, rng));
    cpu_out.push_back(Tensor::empty({rows, n}, DType::F32));
    one_out.push_back(device_nan(be.gpu, {rows, n}));
    two_out.push_back(device_nan(be.gpu, {rows, n}));
  }
  for (int i = 0; i < 3; ++i) {
    cpu_t.push_back({&w[i].w, &w[i].b, &cpu_out[i]});
    one_t.push_back({&w[i].wd, &w[i].bd, &one_out[i]});
    two_t.push_back({&w[i].wd, &w[i].bd, &two_out[i]});
  }
  Tensor rounded_x;  // gpu_rounds_x: the CPU's PreNorm output rounded to bf16, kept in f32
  if (gpu_rounds_x) {
    rounded_x = Tensor::empty({rows, d}, DType::F32);
    be.cpu.depth_phase2_prenorm(cpu_in.mix, host.partial, host.gain, cpu_in.eps, rounded_x);
    float* x = rounded_x.ptr<float>();
    for (int64_t i = 0; i < rounded_x.numel(); ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    be.cpu.linear_many(rounded_x, cpu_t);
  } else {
    be.cpu.prenorm_linear_many(cpu_in, cpu_t);
  }
  be.gpu.prenorm_linear_many(gpu_in, one_t);
  be.gpu.linear_many(two_normed, two_t);
  for (int i = 0; i < 3; ++i) {
    const Tensor got = to_host(be.gpu, one_out[i]);
    EXPECT_TRUE(same_bytes(got, to_host(be.gpu, two_out[i]))) << "target " << i << " vs two";
    EXPECT_TRUE(close_to(got, cpu_out[i], tol)) << "target " << i << " vs the CPU";
  }
  // Fused: normed never written (the proof the prologue ran); else the default wrote it.
  const Tensor normed_got = to_host(be.gpu, gpu_normed);
  if (fused) {
    EXPECT_TRUE(all_nan(normed_got)) << "linear_many: the fused path wrote normed";
  } else {
    EXPECT_TRUE(same_bytes(normed_got, to_host(be.gpu, two_normed))) << "linear_many normed";
  }

  // gate, up, SwiGLU.
  const Weights wg = random_weight(be.gpu, ffn, d, wdt, rng);
  const Weights wu = random_weight(be.gpu, ffn, d, wdt, rng);
  Tensor gate = Tensor::empty({rows, ffn}, DType::F32), up = Tensor::empty({rows, ffn}, DType::F32);
  Tensor cpu_act = Tensor::empty({rows, ffn}, DType::F32);
  if (gpu_rounds_x) {
    be.cpu.linear_swiglu(rounded_x, wg.w, &wg.b, wu.w, &wu.b, gate, up, cpu_act);
  } else {
    be.cpu.prenorm_linear_swiglu(cpu_in, wg.w, &wg.b, wu.w, &wu.b, gate, up, cpu_act);
  }
  Tensor gd = device_nan(be.gpu, {rows, ffn}), ud = device_nan(be.gpu, {rows, ffn});
  Tensor one_act = device_nan(be.gpu, {rows, ffn}), two_act = device_nan(be.gpu, {rows, ffn});
  gpu_normed = device_nan(be.gpu, {rows, d});
  be.gpu.prenorm_linear_swiglu(gpu_in, wg.wd, &wg.bd, wu.wd, &wu.bd, gd, ud, one_act);
  be.gpu.linear_swiglu(two_normed, wg.wd, &wg.bd, wu.wd, &wu.bd, gd, ud, two_act);
  const Tensor act = to_host(be.gpu, one_act);
  EXPECT_TRUE(same_bytes(act, to_host(be.gpu, two_act))) << "swiglu vs two";
  EXPECT_TRUE(close_to(act, cpu_act, tol)) << "swiglu vs the CPU";
  if (fused) {
    EXPECT_TRUE(all_nan(to_host(be.gpu, gpu_normed))) << "swiglu: the fused path wrote normed";
  }
}

TEST(CudaFusedDecode, PrenormLinearMatchesTheTwoLaunches) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 70;
  for (DType wdt : {DType::BF16, DType::F32}) {
    for (Mix mix : {Mix::Plain, Mix::Merge, Mix::NullSource}) {
      for (int64_t rows = 1; rows <= 8; ++rows) check_prenorm_linear(rows, mix, wdt, seed++);
      check_prenorm_linear(12, mix, wdt, seed++);  // prefill-sized: the fallback
    }
  }
}

// --- the QKV GEMV with RoPE + the KV store as its epilogue ---

struct QkvRopeCase {
  int64_t rows;
  Mix mix;
  DType weights, cache;
  int hq = 16, hkv = 8, hd = 128;  // the 0.6B shapes
  int64_t d = 1024;
};

void check_qkv_rope(const QkvRopeCase& c, uint32_t seed) {
  const int64_t d = c.d;
  const int hq = c.hq, hkv = c.hkv, hd = c.hd;
  SCOPED_TRACE(std::to_string(c.rows) + " rows, " + mix_name(c.mix) + ", " +
               std::string(dtype_name(c.weights)) + " weights, " +
               std::string(dtype_name(c.cache)) + " cache, hq " + std::to_string(hq) + " hkv " +
               std::to_string(hkv) + " hd " + std::to_string(hd) + " d " + std::to_string(d));
  Backends be;
  std::mt19937 rng(seed);
  const int block_size = 16, num_blocks = 128;
  std::vector<SeqSpec> seqs;  // decode rows (contexts across block boundaries), or a prefill
  if (c.rows <= 8) {
    for (int s = 0; s < c.rows; ++s) seqs.push_back({5 + 37 * s, 1});
  } else {
    seqs = {{0, static_cast<int>(c.rows) - 3}, {20, 2}, {3, 1}};
  }
  const BatchMeta batch = paged_batch(seqs, block_size, num_blocks, rng);
  ASSERT_EQ(batch.num_tokens, c.rows);
  const bool fused = c.rows <= 8 && c.weights != DType::F16;
  const bool prologue = fused && c.mix != Mix::NullSource;
  const bool bf16_path = c.rows > 8 && c.weights != DType::F32;  // cuBLAS on bf16-rounded x
  const double tol = bf16_path ? 1e-2 : 5e-5;
  const double cache_tol = c.cache == DType::BF16 ? (bf16_path ? 2e-2 : 8e-3) : tol;

  const PrenormInputs host = random_prenorm(c.rows, d, rng);
  const PrenormInputs dev = host.upload(be.gpu);
  const int64_t widths[3] = {int64_t{hq} * hd, int64_t{hkv} * hd, int64_t{hkv} * hd};
  std::vector<Weights> w;
  for (int64_t n : widths) w.push_back(random_weight(be.gpu, n, d, c.weights, rng));
  const Tensor qg = random_host({hd}, DType::BF16, rng, 0.5f, 1.5f);
  const Tensor kg = random_host({hd}, DType::F32, rng, 0.5f, 1.5f);
  const Tensor inv_freq = inv_freq_host(hd);
  // Random caches everywhere: a slot the step does not own must keep its bytes.
  const Tensor kc = random_host({num_blocks, block_size, hkv, hd}, c.cache, rng);
  const Tensor vc = random_host({num_blocks, block_size, hkv, hd}, c.cache, rng);
  const float eps = 1e-6f;

  // The CPU: the default, prenorm_linear_many then qk_norm_rope_store.
  Backend::PrenormArgs cpu_in;
  cpu_in.mix = host.mix_args(c.mix);
  cpu_in.partial = &host.partial;
  cpu_in.gain = &host.gain;
  cpu_in.eps = eps;
  Tensor cpu_normed = Tensor::empty({c.rows, d}, DType::F32);
  cpu_in.normed = &cpu_normed;
  std::vector<Tensor> cpu_out;
  for (int64_t n : widths) cpu_out.push_back(Tensor::empty({c.rows, n}, DType::F32));
  const Backend::LinearTarget cpu_t[3] = {{&w[0].w, &w[0].b, &cpu_out[0]},
                                          {&w[1].w, &w[1].b, &cpu_out[1]},
                                          {&w[2].w, &w[2].b, &cpu_out[2]}};
  KvCacheLayer cpu_cache{clone_host(kc), clone_host(vc)};
  Backend::RopeStoreArgs rope;
  rope.head_dim = hd;
  rope.q_gain = &qg;
  rope.k_gain = &kg;
  rope.eps = eps;
  rope.inv_freq = &inv_freq;
  rope.batch = &batch;
  rope.cache = &cpu_cache;
  be.cpu.prenorm_qkv_rope_store(cpu_in, cpu_t, rope);

  // The GPU, twice: the default's launches (prenorm_linear_many, qk_norm_rope_store), then the
  // fused op; outputs NaN-poisoned, caches random.
  be.gpu.prepare_batch(batch);
  const Tensor qgd = be.gpu.upload(qg), kgd = be.gpu.upload(kg), fd = be.gpu.upload(inv_freq);
  rope.q_gain = &qgd;
  rope.k_gain = &kgd;
  rope.inv_freq = &fd;
  struct GpuRun {
    std::vector<Tensor> out;
    Tensor normed;
    KvCacheLayer cache;
    uint64_t kernels = 0;
  };
  auto run = [&](bool default_path) {
    GpuRun r;
    for (int64_t n : widths) r.out.push_back(device_nan(be.gpu, {c.rows, n}));
    r.normed = device_nan(be.gpu, {c.rows, d});
    r.cache = {be.gpu.upload(kc), be.gpu.upload(vc)};
    Backend::PrenormArgs in = cpu_in;
    in.mix = dev.mix_args(c.mix);
    in.partial = &dev.partial;
    in.gain = &dev.gain;
    in.normed = &r.normed;
    const Backend::LinearTarget t[3] = {{&w[0].wd, &w[0].bd, &r.out[0]},
                                        {&w[1].wd, &w[1].bd, &r.out[1]},
                                        {&w[2].wd, &w[2].bd, &r.out[2]}};
    Backend::RopeStoreArgs a = rope;
    a.cache = &r.cache;
    const uint64_t before = be.gpu.launch_counts().kernels;
    if (default_path) {
      // The Backend default: prenorm_linear_many, then qk_norm_rope_store.
      be.gpu.prenorm_linear_many(in, t);
      be.gpu.qk_norm_rope_store(r.out[0], r.out[1], r.out[2], a.head_dim, a.q_gain, a.k_gain, a.eps,
                                *a.inv_freq, *a.batch, *a.cache);
    } else {
      be.gpu.prenorm_qkv_rope_store(in, t, a);
    }
    r.kernels = be.gpu.launch_counts().kernels - before;
    return r;
  };
  const GpuRun two = run(true);
  const GpuRun one = run(false);

  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    const Tensor got = to_host(be.gpu, one.out[i]);
    EXPECT_TRUE(same_bytes(got, to_host(be.gpu, two.out[i]))) << names[i] << " vs the default";
    EXPECT_TRUE(close_to(got, cpu_out[i], tol)) << names[i] << " vs the CPU";
  }
  const Tensor kc_got = to_host(be.gpu, one.cache.k), vc_got = to_host(be.gpu, one.cache.v);
  EXPECT_TRUE(same_bytes(kc_got, to_host(be.gpu, two.cache.k))) << "k cache vs the default";
  EXPECT_TRUE(same_bytes(vc_got, to_host(be.gpu, two.cache.v))) << "v cache vs the default";
  EXPECT_TRUE(close_to(kc_got, cpu_cache.k, cache_tol)) << "k cache vs the CPU";
  EXPECT_TRUE(close_to(vc_got, cpu_cache.v, cache_tol)) << "v cache vs the CPU";
  // The launches: one fewer than the default's where the kernel takes the shapes (1 against 2
  // with the prologue; else the PreNorm's own launches first), the same calls otherwise.
  EXPECT_EQ(one.kernels + (fused ? 1 : 0), two.kernels);
  if (prologue) {
    EXPECT_EQ(one.kernels, 1u);
    EXPECT_TRUE(all_nan(to_host(be.gpu, one.normed))) << "the prologue path wrote normed";
  }
}

TEST(CudaFusedDecode, QkvRopeStoreMatchesTheTwoLaunches) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 110;
  for (Mix mix : {Mix::Plain, Mix::Merge, Mix::NullSource}) {
    for (int64_t rows = 1; rows <= 8; ++rows) {
      check_qkv_rope({rows, mix, DType::BF16, DType::BF16}, seed++);
    }
    check_qkv_rope({12, mix, DType::BF16, DType::BF16}, seed++);  // prefill-sized: the default
    for (int64_t rows : {1, 4, 8, 12}) {
      check_qkv_rope({rows, mix, DType::F32, DType::F32}, seed++);
      check_qkv_rope({rows, mix, DType::BF16, DType::F32}, seed++);
      check_qkv_rope({rows, mix, DType::F32, DType::BF16}, seed++);
    }
  }
  check_qkv_rope({3, Mix::Plain, DType::F16, DType::BF16}, seed++);  // F16: declined
  // Other heads: hd 64 (the open-attnres shape: one row per warp), 256 (the largest taken,
  // shared memory near its limit at 8 rows with the prologue), 6 (most warps without a row).
  for (int64_t rows : {1, 8}) {
    check_qkv_rope({rows, Mix::Plain, DType::BF16, DType::BF16, 16, 8, 64}, seed++);
    check_qkv_rope({rows, Mix::Merge, DType::BF16, DType::F32, 4, 2, 256}, seed++);
    check_qkv_rope({rows, Mix::Plain, DType::F32, DType::BF16, 3, 1, 6}, seed++);
  }
}

// --- whole models ---

// The same model on the fused CUDA backend and on one whose fused ops are the defaults: a
// mixed prefill (10 rows: the PreNorm falls back, RoPE + store fuse) and decode steps of 2
// rows (everything fuses where the mix allows), logits equal bit for bit.
void compare_fused_model(const ModelConfig& config, DType weight_dtype, DType kv_dtype) {
  SCOPED_TRACE(config.summary() + " " + std::string(dtype_name(weight_dtype)) + " weights, " +
               std::string(dtype_name(kv_dtype)) + " cache");
  RandomWeightOptions opt;
  opt.dtype = weight_dtype;
  opt.seed = 9;
  const ModelWeights weights = make_random_weights(config, opt);
  CudaBackend fused(0);
  UnfusedCudaBackend unfused;
  Transformer fused_model(config, weights, fused);
  Transformer unfused_model(config, weights, unfused);
  const int block_size = 4, num_blocks = 24;
  KvCache fused_cache = KvCache::allocate(fused, config, num_blocks, block_size, kv_dtype);
  KvCache unfused_cache = KvCache::allocate(unfused, config, num_blocks, block_size, kv_dtype);
  std::mt19937 rng(3);
  const std::vector<int> prompt = {7, 3};
  const int decode_steps = 3;
  std::vector<Seq> seqs = random_sequences({7 + decode_steps, 3 + decode_steps}, block_size,
                                           num_blocks, config.vocab_size, rng);
  std::vector<int> begin(seqs.size(), 0), end = prompt;
  for (int step = 0; step <= decode_steps; ++step) {
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(seqs, begin, end, block_size, rows);
    const Tensor got = to_host(fused, fused_model.forward(batch, fused_cache, rows));
    const Tensor want = to_host(unfused, unfused_model.forward(batch, unfused_cache, rows));
    EXPECT_TRUE(same_bytes(got, want)) << "step " << step;
    for (size_t s = 0; s < seqs.size(); ++s) begin[s] = end[s]++;
  }
  for (int l = 0; l < config.num_layers; ++l) {
    EXPECT_TRUE(same_bytes(to_host(fused, fused_cache.layers[l].k),
                           to_host(unfused, unfused_cache.layers[l].k)))
        << "layer " << l << " k cache";
  }
}

// The same model on the fused CUDA backend and on TwoLaunchQkvRopeBackend: logits and K / V
// caches bit for bit over a mixed prefill and decode steps of 2 rows, and each decode step one
// kernel launch fewer per layer where the attention fuses (not delta_v's).
void compare_qkv_rope_model(const ModelConfig& config, DType weight_dtype, DType kv_dtype) {
  SCOPED_TRACE(config.summary() + " " + std::string(dtype_name(weight_dtype)) + " weights, " +
               std::string(dtype_name(kv_dtype)) + " cache");
  RandomWeightOptions opt;
  opt.dtype = weight_dtype;
  opt.seed = 13;
  const ModelWeights weights = make_random_weights(config, opt);
  CudaBackend fused(0);
  TwoLaunchQkvRopeBackend two;
  Transformer fused_model(config, weights, fused);
  Transformer two_model(config, weights, two);
  const int block_size = 4, num_blocks = 24;
  KvCache fused_cache = KvCache::allocate(fused, config, num_blocks, block_size, kv_dtype);
  KvCache two_cache = KvCache::allocate(two, config, num_blocks, block_size, kv_dtype);
  std::mt19937 rng(5);
  const std::vector<int> prompt = {7, 3};
  const int decode_steps = 3;
  std::vector<Seq> seqs = random_sequences({7 + decode_steps, 3 + decode_steps}, block_size,
                                           num_blocks, config.vocab_size, rng);
  std::vector<int> begin(seqs.size(), 0), end = prompt;
  const bool attention_fuses = config.attnres_mode != AttnResMode::DeltaV;
  for (int step = 0; step <= decode_steps; ++step) {
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(seqs, begin, end, block_size, rows);
    const uint64_t fused_before = fused.launch_counts().kernels;
    const Tensor got = to_host(fused, fused_model.forward(batch, fused_cache, rows));
    const uint64_t fused_kernels = fused.launch_counts().kernels - fused_before;
    const uint64_t two_before = two.launch_counts().kernels;
    const Tensor want = to_host(two, two_model.forward(batch, two_cache, rows));
    const uint64_t two_kernels = two.launch_counts().kernels - two_before;
    EXPECT_TRUE(same_bytes(got, want)) << "step " << step;
    if (step > 0) {  // decode: 2 rows
      const uint64_t saved = attention_fuses ? static_cast<uint64_t>(config.num_layers) : 0;
      EXPECT_EQ(fused_kernels + saved, two_kernels) << "step " << step;
    } else {  // the 10-row prefill takes the default
      EXPECT_EQ(fused_kernels, two_kernels);
    }
    for (size_t s = 0; s < seqs.size(); ++s) begin[s] = end[s]++;
  }
  for (int l = 0; l < config.num_layers; ++l) {
    EXPECT_TRUE(
        same_bytes(to_host(fused, fused_cache.layers[l].k), to_host(two, two_cache.layers[l].k)))
        << "layer " << l << " k cache";
    EXPECT_TRUE(
        same_bytes(to_host(fused, fused_cache.layers[l].v), to_host(two, two_cache.layers[l].v)))
        << "layer " << l << " v cache";
  }
}

TEST(CudaFusedDecode, QkvRopeModelsEqualTheTwoLaunchPathWithALaunchFewerPerLayer) {
  SKIP_WITHOUT_CUDA();
  for (DType kv : {DType::F32, DType::BF16}) {
    for (DType wdt : {DType::BF16, DType::F32}) {
      compare_qkv_rope_model(small_config("", 3, 0), wdt, kv);
      compare_qkv_rope_model(small_config("block", 4, 2), wdt, kv);
    }
    compare_qkv_rope_model(small_config("full", 4, 2), DType::BF16, kv);  // the prologue declines
    compare_qkv_rope_model(small_config("delta_v", 4, 2, "sigmoid_vector", true), DType::BF16, kv);
  }
}

TEST(CudaFusedDecode, ModelLogitsEqualTheUnfusedPath) {
  SKIP_WITHOUT_CUDA();
  for (DType kv : {DType::F32, DType::BF16}) {
    for (DType wdt : {DType::BF16, DType::F32}) {
      compare_fused_model(small_config("", 3, 0), wdt, kv);
      compare_fused_model(small_config("block", 4, 2), wdt, kv);
    }
    // Mixes the prologue declines (newer entries, §2d switches) and delta_v's own path.
    compare_fused_model(small_config("full", 4, 2), DType::BF16, kv);
    compare_fused_model(small_config("delta_v", 4, 2, "sigmoid_vector", true), DType::BF16, kv);
  }
}

// --- sanitizer-sized: the shapes compute-sanitizer runs (docs/RELIABILITY.md "GPU sanitizers") ---
// The smallest shapes that still reach every path of the kernels, so that racecheck (slow per
// launch) finishes in its share of a GPU lease; the checks are the full-size tests' own.

// qk_norm_rope_kernel<S, store>: 8 warps over the q, k (and v) head units of a token; hq 8 /
// hkv 4 gives 16 units with the store, so every warp takes a second unit; hd 80 leaves a
// partial second pass of RoPE's lanes (40 pairs), hd 6 most lanes without a pair; decode rows
// and a prefill chunk; both cache dtypes (the store's two instantiations).
TEST(CudaSanitizerSized, NormsQkNormRopeStore) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 900;
  for (DType cache_dtype : {DType::F32, DType::BF16}) {
    check_rope_store(cache_dtype, {{5, 1}, {40, 1}}, 8, 4, 80, seed++);
    check_rope_store(cache_dtype, {{2, 3}, {0, 1}}, 3, 1, 6, seed++);
  }
}

// gemv_prenorm_kernel / gemv_prenorm_swiglu_kernel (cuda_gemv_prologue.cuh's four barriers
// before the first weight byte). d 320: the standalone PreNorm's block is 320 threads, so the
// 8 warps play 10 virtual warps (a warp takes a second (row, virtual warp) task even at one
// row), and the scaling pass over 256 threads has a 64-element tail; the weight rows end in a
// partial 16-byte-vector pass (bf16: 256 + 64, f32: 2 x 128 + 64). Widths 36 + 20 + 20 and 44
// leave the last block's warps past the last row (the early return). Paths: the plain
// pre-norm and the Phase-2 merge (its logit reduction first), rows 1..8 (every R), bf16 and
// f32 weights; a §2d mix the prologue declines (the separate launches); 12 rows (cuBLAS).
TEST(CudaSanitizerSized, DecodePrenormLinear) {
  SKIP_WITHOUT_CUDA();
  const LinearShapes shapes{320, 36, 20, 44};
  uint32_t seed = 920;
  for (int64_t rows = 1; rows <= 8; ++rows)
    check_prenorm_linear(rows, Mix::Merge, DType::BF16, seed++, shapes);
  for (int64_t rows : {1, 8}) check_prenorm_linear(rows, Mix::Plain, DType::BF16, seed++, shapes);
  check_prenorm_linear(3, Mix::Merge, DType::F32, seed++, shapes);
  check_prenorm_linear(6, Mix::Plain, DType::F32, seed++, shapes);
  check_prenorm_linear(2, Mix::NullSource, DType::BF16, seed++, shapes);
  check_prenorm_linear(12, Mix::Merge, DType::BF16, seed++, shapes);
}

// The GEMV bulk lever's instances of those kernels and of gemv_kernel / gemv_swiglu_kernel
// (the two-launch side): an mbarrier per warp armed by lane 0 and completed by the TMA's
// copies, waited on by every lane, before and after the prologue's barriers. The shapes above,
// with the last block's warps past the last row (no copy, no wait), rows 1, 4 and 8 (every
// row count shares the copy code), both weight dtypes.
TEST(CudaSanitizerSized, DecodeGemvBulk) {
  SKIP_WITHOUT_CUDA();
  const LinearShapes shapes{320, 36, 20, 44};
  uint32_t seed = 960;
  for (int64_t rows : {1, 4, 8})
    check_prenorm_linear(rows, Mix::Merge, DType::BF16, seed++, shapes, /*bulk=*/true);
  check_prenorm_linear(2, Mix::Plain, DType::F32, seed++, shapes, /*bulk=*/true);
}

// gemv_rope_kernel: a cluster of 8 blocks per head exchanging the head's rows through
// distributed shared memory between two cluster barriers. hd 128 (2 rows per warp), rows
// 1..8: token row r's epilogue runs in block r, so R = 1..8 takes 1..8 of the cluster's blocks
// into the gather (the others only pass the barriers); v heads skip the barriers. Both cache
// dtypes, the prologue's merge and plain paths, no prologue (a null-source mix: x from global
// memory), f32 weights; hd 6 with a group of 3 (most warps without a row, a partial lane
// pass in the per-head norm); 12 rows (the two-launch default).
TEST(CudaSanitizerSized, DecodeQkvRopeCluster) {
  SKIP_WITHOUT_CUDA();
  uint32_t seed = 940;
  for (int64_t rows = 1; rows <= 8; ++rows) {
    const DType cache = rows % 2 ? DType::BF16 : DType::F32;
    check_qkv_rope({rows, Mix::Merge, DType::BF16, cache, 2, 1, 128, 320}, seed++);
  }
  check_qkv_rope({3, Mix::Plain, DType::BF16, DType::BF16, 2, 1, 128, 320}, seed++);
  check_qkv_rope({2, Mix::NullSource, DType::BF16, DType::F32, 2, 1, 128, 320}, seed++);
  check_qkv_rope({4, Mix::Plain, DType::F32, DType::F32, 2, 1, 128, 320}, seed++);
  check_qkv_rope({8, Mix::Plain, DType::F32, DType::BF16, 3, 1, 6, 320}, seed++);
  check_qkv_rope({12, Mix::Merge, DType::BF16, DType::BF16, 2, 1, 128, 320}, seed++);
}

}  // namespace
}  // namespace attnres::test
