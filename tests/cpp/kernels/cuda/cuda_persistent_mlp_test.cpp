// The persistent MLP lever (CudaBackend::set_persistent_mlp, ATTNRES_CUDA_PERSISTENT_MLP;
// kernels/cuda/cuda_persistent_mlp.cu): prenorm_mlp_residual at <= 8 rows as one cooperative
// launch (PreNorm prologue, gate / up with SwiGLU, a grid-wide barrier, down with bias and the
// residual add), against
// - the same op with the lever off (prenorm_linear_swiglu then linear_residual: two launches),
//   bit for bit, and the CPU within 2e-5 (the PreNorm-prologue GEMVs' tolerance in
//   cuda_fused_decode_test.cpp; 2e-2 on the cuBLAS bf16 path of more rows), at the 0.6B
//   shape (d 1024, intermediate 3072) and small odd ones, rows 1..8, bf16 and f32 weights, the
//   plain PreNorm, the block-mode Phase-2 merge and a §2d mix the prologue declines (the
//   fallback), out apart from the residual and out the residual and the partial itself (the
//   forward's case), and a prefill-sized 12 rows (the fallback); one launch where the lever is
//   on and the kernel takes the shapes (two with it off), otherwise as many as with the lever
//   off;
// - the kernel launched directly with every down row staged in shared memory, none, and one
//   per warp: the same bits, and the barrier's words back at their start (arrivals 0, the
//   generation one further per launch);
// - a CUDA graph of the op replayed several times (the barrier's state must return to its
//   start for a replay to finish at all): each replay the eager launch's bits;
// - whole models (plain, block and full AttnRes; bf16 and f32 weights): the logits with the
//   lever on equal those with it off, with one kernel launch fewer per MLP sublayer per step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cpp/kernels/cuda/cuda_lever_test_util.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

enum class Mix { Plain, Merge, NullSource };  // NullSource: a §2d mix the prologue declines

const char* mix_name(Mix mix) {
  return mix == Mix::Plain ? "plain pre-norm" : mix == Mix::Merge ? "Phase-2 merge" : "null source";
}

struct MlpShape {
  int64_t d, ffn;
};

// One MLP sublayer's host inputs: the PreNorm's (depth_phase2_prenorm's arguments), the
// weights, the residual.
struct MlpInputs {
  Tensor partial, gain, m, s, o, query, null_source;
  Tensor wg, bg, wu, bu, wd, bd;
  Tensor residual;
};

MlpInputs random_inputs(int64_t rows, MlpShape shape, DType wdt, std::mt19937& rng) {
  const int64_t d = shape.d, ffn = shape.ffn;
  const DType bias_dtype = wdt == DType::F32 ? DType::F32 : DType::BF16;
  MlpInputs in;
  in.partial = random_host({rows, d}, DType::F32, rng, -3.0f, 3.0f);
  in.gain = random_host({d}, DType::BF16, rng, 0.5f, 1.5f);
  in.m = random_host({rows}, DType::F32, rng, -1.0f, 1.0f);
  in.s = random_host({rows}, DType::F32, rng, 1.0f, 4.0f);
  in.o = random_host({rows, d}, DType::F32, rng, -2.0f, 2.0f);
  in.query = random_host({d}, DType::F32, rng, -0.1f, 0.1f);
  in.null_source = random_host({d}, DType::F32, rng);
  in.wg = random_host({ffn, d}, wdt, rng, -0.05f, 0.05f);
  in.bg = random_host({ffn}, bias_dtype, rng);
  in.wu = random_host({ffn, d}, wdt, rng, -0.05f, 0.05f);
  in.bu = random_host({ffn}, bias_dtype, rng);
  in.wd = random_host({d, ffn}, wdt, rng, -0.05f, 0.05f);
  in.bd = random_host({d}, bias_dtype, rng);
  in.residual = random_host({rows, d}, DType::F32, rng, -2.0f, 2.0f);
  return in;
}

// The inputs on one backend (the CPU's are the host tensors; the partial and residual copied,
// since an in-place call writes them).
struct Operands {
  Tensor partial, gain, m, s, o, query, null_source;
  Tensor wg, bg, wu, bu, wd, bd;
  Tensor residual;
  Operands(Backend& be, const MlpInputs& in)
      : partial(be.upload(clone_host(in.partial))),
        gain(be.upload(in.gain)),
        m(be.upload(in.m)),
        s(be.upload(in.s)),
        o(be.upload(in.o)),
        query(be.upload(in.query)),
        null_source(be.upload(in.null_source)),
        wg(be.upload(in.wg)),
        bg(be.upload(in.bg)),
        wu(be.upload(in.wu)),
        bu(be.upload(in.bu)),
        wd(be.upload(in.wd)),
        bd(be.upload(in.bd)),
        residual(be.upload(clone_host(in.residual))) {}
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
};

// prenorm_mlp_residual on `be`: out apart from everything, or (in_place) out = the residual =
// the partial the PreNorm reads. Returns out on the host, and the kernel launches it took.
struct MlpRun {
  Tensor out;
  uint64_t launches = 0;
};
MlpRun run_mlp(Backend& be, const MlpInputs& host, int64_t rows, MlpShape shape, Mix mix,
               bool in_place) {
  Operands op(be, host);
  Backend::PrenormArgs args;
  args.mix = op.mix_args(mix);
  args.partial = &op.partial;
  args.gain = &op.gain;
  args.eps = 1e-6f;
  Tensor normed = be.alloc({rows, shape.d}, DType::F32);
  args.normed = &normed;
  Tensor gate = be.alloc({rows, shape.ffn}, DType::F32),
         up = be.alloc({rows, shape.ffn}, DType::F32);
  Tensor act = be.alloc({rows, shape.ffn}, DType::F32);
  Tensor out = in_place ? op.partial : be.upload(filled_host({rows, shape.d}, kNaN));
  const Tensor& residual = in_place ? op.partial : op.residual;
  auto* cuda = dynamic_cast<CudaBackend*>(&be);
  const uint64_t before = cuda ? cuda->launch_counts().kernels : 0;
  be.prenorm_mlp_residual(args, op.wg, &op.bg, op.wu, &op.bu, gate, up, act, op.wd, &op.bd,
                          residual, out);
  MlpRun run;
  run.launches = cuda ? cuda->launch_counts().kernels - before : 0;
  run.out = to_host(be, out);
  return run;
}

struct Backends {
  Backends() {
    off.set_persistent_mlp(false);
    on.set_persistent_mlp(true);
  }
  CpuBackend cpu{2};
  CudaBackend off{0};
  CudaBackend on{0};
};

void check_mlp(Backends& be, int64_t rows, MlpShape shape, Mix mix, DType wdt, bool in_place,
               uint32_t seed) {
  SCOPED_TRACE(std::to_string(rows) + " rows, d " + std::to_string(shape.d) + ", ffn " +
               std::to_string(shape.ffn) + ", " + mix_name(mix) + ", " +
               std::string(dtype_name(wdt)) + (in_place ? ", in place" : ", out apart"));
  std::mt19937 rng(seed);
  const MlpInputs host = random_inputs(rows, shape, wdt, rng);
  const MlpRun cpu = run_mlp(be.cpu, host, rows, shape, mix, in_place);
  const MlpRun off = run_mlp(be.off, host, rows, shape, mix, in_place);
  const MlpRun on = run_mlp(be.on, host, rows, shape, mix, in_place);
  EXPECT_TRUE(same_bytes(on.out, off.out)) << "lever on vs off";
  // More rows with bf16 weights: cuBLAS reads both linears' x rounded to bf16 (2^-9), as in
  // cuda_fused_decode_test.cpp's prefill cases.
  const double tol = rows > cuda::kMaxGemvRows && wdt == DType::BF16 ? 2e-2 : 2e-5;
  EXPECT_TRUE(close_to(on.out, cpu.out, tol)) << "lever on vs the CPU";
  const bool persistent = rows <= cuda::kMaxGemvRows && mix != Mix::NullSource;
  if (persistent) {
    EXPECT_EQ(off.launches, 2u) << "the lever off: the prologue GEMV, then down with the add";
    EXPECT_EQ(on.launches, 1u) << "the lever on: one launch";
  } else {
    EXPECT_EQ(on.launches, off.launches) << "a shape the kernel declines: the default";
  }
}

TEST(CudaPersistentMlp, DecodeShapeEqualsTheLeverOffAndTheCpu) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  uint32_t seed = 90;
  for (DType wdt : {DType::BF16, DType::F32}) {
    for (int64_t rows = 1; rows <= 8; ++rows) {
      for (Mix mix : {Mix::Plain, Mix::Merge}) {
        check_mlp(be, rows, {1024, 3072}, mix, wdt, /*in_place=*/true, seed++);
      }
    }
    check_mlp(be, 3, {1024, 3072}, Mix::Plain, wdt, /*in_place=*/false, seed++);
    check_mlp(be, 2, {1024, 3072}, Mix::NullSource, wdt, /*in_place=*/true, seed++);
    check_mlp(be, 12, {1024, 3072}, Mix::Plain, wdt, /*in_place=*/true, seed++);  // prefill
  }
}

// d 64 / ffn 96: the test models' shape, fewer rows than SMs; d 72 / ffn 200: rows of 9 / 25
// bf16 vectors (a warp's lanes partly idle), down rows past a whole number of warps; d 2048 /
// ffn 56: down has more rows than the grid has warps at small grids.
TEST(CudaPersistentMlp, SmallOddShapesAtEveryRowCount) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  uint32_t seed = 190;
  for (DType wdt : {DType::BF16, DType::F32}) {
    for (int64_t rows = 1; rows <= 8; ++rows) {
      for (MlpShape shape : {MlpShape{64, 96}, MlpShape{72, 200}, MlpShape{2048, 56}}) {
        if (rows * shape.d * 4 > cuda::kMaxGemvPrenormBytes) continue;
        for (Mix mix : {Mix::Plain, Mix::Merge}) {
          check_mlp(be, rows, shape, mix, wdt, /*in_place=*/rows % 2 == 0, seed++);
        }
      }
    }
  }
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): persistent_mlp_kernel's prologue
// barriers, the down rows' cp.async into shared memory, the grid barrier and act read back
// into shared memory; rows 1, 3 and 8, the merge and plain prologues, both weight dtypes, at
// d 72 / ffn 200 (lanes partly idle, down rows past a whole number of warps).
TEST(CudaSanitizerSized, DecodePersistentMlp) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  uint32_t seed = 290;
  for (int64_t rows : {1, 3, 8})
    check_mlp(be, rows, {72, 200}, Mix::Merge, DType::BF16, /*in_place=*/true, seed++);
  check_mlp(be, 2, {72, 200}, Mix::Plain, DType::F32, /*in_place=*/false, seed++);
}

// The kernel launched directly: every down row staged in shared memory (-1, as many as fit),
// none (all read from global memory after the barrier) and at most one per warp: the same
// bits; the barrier's arrivals back to 0 and its generation one further after each launch.
TEST(CudaPersistentMlp, StagedAndGlobalDownRowsGiveTheSameBits) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  for (MlpShape shape : {MlpShape{1024, 3072}, MlpShape{2048, 56}, MlpShape{72, 200}}) {
    for (int64_t rows : {1, 5}) {
      SCOPED_TRACE(std::to_string(rows) + " rows, d " + std::to_string(shape.d));
      std::mt19937 rng(static_cast<uint32_t>(shape.d + rows));
      const MlpInputs host = random_inputs(rows, shape, DType::BF16, rng);
      Operands op(gpu, host);
      Tensor act = gpu.alloc({rows, shape.ffn}, DType::F32);
      Tensor barrier = gpu.upload(Tensor::empty({cuda::kPersistentMlpBarrierWords}, DType::I32));
      cuda::PersistentMlpArgs args;
      args.prenorm.partial = op.partial.ptr<float>();
      args.prenorm.gain = op.gain.data;
      args.prenorm.gain_dtype = op.gain.dtype;
      args.rows = rows;
      args.d = shape.d;
      args.intermediate = shape.ffn;
      args.w_dtype = DType::BF16;
      args.gate = {op.wg.data, op.bg.data, op.bg.dtype, shape.ffn, nullptr, nullptr};
      args.up = {op.wu.data, op.bu.data, op.bu.dtype, shape.ffn, nullptr, nullptr};
      args.act = act.ptr<float>();
      args.barrier = static_cast<unsigned*>(barrier.data);
      std::vector<Tensor> outs;
      int launches = 0;
      for (int staged : {-1, 0, 1}) {
        Tensor out = gpu.upload(filled_host({rows, shape.d}, kNaN));
        args.down = {op.wd.data, op.bd.data,       op.bd.dtype,
                     shape.d,    out.ptr<float>(), op.residual.ptr<float>()};
        args.max_staged_rows_per_warp = staged;
        cuda::PersistentMlpPlan plan;
        ASSERT_TRUE(cuda::persistent_mlp_takes(args, &plan));
        EXPECT_GE(plan.grid, 1);
        EXPECT_GE(plan.blocks_per_sm, 1);
        if (staged >= 0) {
          EXPECT_LE(plan.staged_rows_per_warp, staged);
        }
        ASSERT_TRUE(cuda::launch_persistent_mlp(args, static_cast<cudaStream_t>(gpu.stream())));
        ++launches;
        outs.push_back(to_host(gpu, out));
      }
      EXPECT_TRUE(same_bytes(outs[1], outs[0])) << "none staged vs all";
      EXPECT_TRUE(same_bytes(outs[2], outs[0])) << "one a warp vs all";
      const Tensor words = to_host(gpu, barrier);
      EXPECT_EQ(words.ptr<int32_t>()[0], 0) << "arrivals";
      EXPECT_EQ(words.ptr<int32_t>()[1], launches) << "generation";
    }
  }
}

// Captured once and replayed: the barrier's words must be back at their start for a replay to
// finish, and each replay writes the eager launch's bits (the partial reset before each, since
// the op adds into it in place).
TEST(CudaPersistentMlp, GraphReplaysEqualTheEagerLaunch) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  gpu.set_persistent_mlp(true);
  for (int64_t rows : {1, 8}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const MlpShape shape{1024, 3072};
    std::mt19937 rng(static_cast<uint32_t>(300 + rows));
    const MlpInputs host = random_inputs(rows, shape, DType::BF16, rng);
    const Tensor want = run_mlp(gpu, host, rows, shape, Mix::Merge, /*in_place=*/true).out;

    Operands op(gpu, host);
    const Tensor start = gpu.upload(host.partial);
    Backend::PrenormArgs args;
    args.mix = op.mix_args(Mix::Merge);
    args.partial = &op.partial;
    args.gain = &op.gain;
    Tensor normed = gpu.alloc({rows, shape.d}, DType::F32);
    args.normed = &normed;
    Tensor gate = gpu.alloc({rows, shape.ffn}, DType::F32);
    Tensor up = gpu.alloc({rows, shape.ffn}, DType::F32);
    Tensor act = gpu.alloc({rows, shape.ffn}, DType::F32);
    std::unique_ptr<CudaGraph> graph = gpu.capture_graph([&] {
      gpu.prenorm_mlp_residual(args, op.wg, &op.bg, op.wu, &op.bu, gate, up, act, op.wd, &op.bd,
                               op.partial, op.partial);
    });
    for (int replay = 0; replay < 4; ++replay) {
      gpu.copy(start, op.partial);
      graph->replay();
      EXPECT_TRUE(same_bytes(to_host(gpu, op.partial), want)) << "replay " << replay;
    }
  }
}

// A prefill and decode steps of two sequences (8 rows, then 2 a step: every step decode-sized);
// the logits of every step bit for bit, and per step one launch fewer for each MLP sublayer
// (every one of these models' MLPs adds its output into the partial or the pushed sum).
void compare_model(const ModelConfig& config, DType weight_dtype) {
  SCOPED_TRACE(config.summary() + " " + std::string(dtype_name(weight_dtype)) + " weights");
  RandomWeightOptions opt;
  opt.dtype = weight_dtype;
  opt.seed = 13;
  const ModelWeights weights = make_random_weights(config, opt);
  CudaBackend off(0), on(0);
  off.set_persistent_mlp(false);
  on.set_persistent_mlp(true);
  Transformer off_model(config, weights, off), on_model(config, weights, on);
  const int block_size = 4, num_blocks = 24;
  KvCache off_cache = KvCache::allocate(off, config, num_blocks, block_size, DType::BF16);
  KvCache on_cache = KvCache::allocate(on, config, num_blocks, block_size, DType::BF16);
  std::mt19937 rng(7);
  const int decode_steps = 3;
  std::vector<Seq> seqs = random_sequences({6 + decode_steps, 2 + decode_steps}, block_size,
                                           num_blocks, config.vocab_size, rng);
  std::vector<int> begin(seqs.size(), 0), end = {6, 2};
  for (int step = 0; step <= decode_steps; ++step) {
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(seqs, begin, end, block_size, rows);
    const uint64_t on_before = on.launch_counts().kernels;
    const Tensor got = to_host(on, on_model.forward(batch, on_cache, rows));
    const uint64_t on_launches = on.launch_counts().kernels - on_before;
    const uint64_t off_before = off.launch_counts().kernels;
    const Tensor want = to_host(off, off_model.forward(batch, off_cache, rows));
    const uint64_t off_launches = off.launch_counts().kernels - off_before;
    EXPECT_TRUE(same_bytes(got, want)) << "step " << step;
    EXPECT_EQ(off_launches - on_launches, static_cast<uint64_t>(config.num_layers))
        << "step " << step << ": " << off_launches << " launches off, " << on_launches << " on";
    for (size_t s = 0; s < seqs.size(); ++s) begin[s] = end[s]++;
  }
}

TEST(CudaPersistentMlp, ModelLogitsEqualTheLeverOffWithALaunchFewerPerMlp) {
  SKIP_WITHOUT_CUDA();
  for (DType wdt : {DType::BF16, DType::F32}) {
    compare_model(small_config("", 3, 0), wdt);
    compare_model(small_config("block", 4, 2), wdt);
  }
  compare_model(small_config("full", 4, 2), DType::BF16);
}

// The environment variable is read when a backend is built.
TEST(CudaPersistentMlp, EnvironmentSwitchesTheLeverWhenABackendIsBuilt) {
  SKIP_WITHOUT_CUDA();
  expect_environment_switches_lever(
      "ATTNRES_CUDA_PERSISTENT_MLP", [](const CudaBackend& be) { return be.persistent_mlp(); },
      [](CudaBackend& be, bool on) { be.set_persistent_mlp(on); });
}

}  // namespace
}  // namespace attnres::test
