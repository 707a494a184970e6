// The bank-push lever (ATTNRES_CUDA_BANK_PUSH_EPILOGUE, CudaBackend::set_bank_push_epilogue;
// kernels/cuda/NOTES.md "GEMV levers"): Backend::linear_residual_push on the GEMV path (<= 8
// rows, f32 x) into a bf16 entry stores the entry from the GEMV's residual epilogue, one launch
// in place of the GEMV and copy's rounding kernel.
// - the op at the 0.6B shapes (down 3072 -> 1024, o_proj 2048 -> 1024) and small ones (fewer
//   vectors than lanes, a partial last batch of loads, K on the scalar path) at every row
//   count 1..8, out apart from the residual and out the residual itself, with and without a
//   bias, with each of the GEMV levers too: out and entry bit for bit against the lever off
//   (the GEMV then CudaBackend::copy), the entry the host's f32_to_bf16 of out, out within
//   the GEMV's 1e-5 of the CPU; one launch with the lever, two without; more rows, an f32
//   entry: the lever-off path, the same launches;
// - whole block-mode models with the final mix (2b's block sums with reset) and a bf16 bank
//   (bf16 and f32 weights): the logits of a prefill and decode steps bit for bit against the
//   lever off, each decode step a launch fewer per block boundary (push_and_reset), the
//   prefill (more than 8 rows) the same launches; an f32 bank: the same launches and bits;
// - the environment variable switches the lever when a backend is built.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "tests/cpp/kernels/cuda/cuda_lever_test_util.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

struct GemvLeverSet {
  const char* name;
  bool deep;
  bool prefetch;
  bool bulk;
};

// The push kernel comes in the GEMV levers' instances too: none, each, the first two together.
const GemvLeverSet kGemvLeverSets[] = {{"no gemv lever", false, false, false},
                                       {"deep", true, false, false},
                                       {"prefetch", false, true, false},
                                       {"deep + prefetch", true, true, false},
                                       {"bulk", false, false, true}};

// Both backends with the same GEMV levers, the push lever off in one and on in the other
// (explicitly both ways: a test run may have the environment switch a lever on).
struct Backends {
  explicit Backends(const GemvLeverSet& levers) {
    for (CudaBackend* g : {&off, &on}) {
      g->set_gemv_deep(levers.deep);
      g->set_gemv_weight_prefetch(levers.prefetch);
      g->set_gemv_bulk(levers.bulk);
      g->set_attention_last_block_merge(false);
    }
    off.set_bank_push_epilogue(false);
    on.set_bank_push_epilogue(true);
  }
  CpuBackend cpu{2};
  CudaBackend off{0};
  CudaBackend on{0};
};

// A bf16 (or f32) device tensor of NaN bits: a poisoned entry.
Tensor device_nan_entry(Backend& be, const Shape& shape, DType dtype) {
  Tensor host = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < host.numel(); ++i) set_element_from_float(host, i, kNaN);
  return be.upload(host);
}

struct PushCase {
  int64_t rows, k, n;
  DType wdt;
  bool in_place, bias;
  DType entry_dtype = DType::BF16;
};

// linear_residual_push of x [rows, k] by w [n, k] on the CPU, the GPU with the lever off and
// on. `fused`: whether the lever's one launch is expected (the GEMV path, a bf16 entry).
void check_push(Backends& be, const GemvLeverSet& levers, const PushCase& c, bool fused,
                std::mt19937& rng) {
  SCOPED_TRACE(std::string(levers.name) + ": " + std::to_string(c.rows) + "x" +
               std::to_string(c.k) + " -> " + std::to_string(c.n) + " " +
               std::string(dtype_name(c.wdt)) + (c.in_place ? " in place" : " apart") +
               (c.bias ? " bias" : "") + " entry " + std::string(dtype_name(c.entry_dtype)));
  const Tensor x = random_host({c.rows, c.k}, DType::F32, rng);
  const Tensor w = random_host({c.n, c.k}, c.wdt, rng);
  const Tensor b = random_host({c.n}, c.wdt == DType::F32 ? DType::F32 : DType::BF16, rng);
  const Tensor res = random_host({c.rows, c.n}, DType::F32, rng);
  Tensor want = Tensor::empty({c.rows, c.n}, DType::F32);
  be.cpu.linear_residual(x, w, c.bias ? &b : nullptr, res, want);

  Tensor got[2], entry[2];
  uint64_t launches[2] = {0, 0};
  CudaBackend* gpus[2] = {&be.off, &be.on};
  for (int i = 0; i < 2; ++i) {
    CudaBackend& g = *gpus[i];
    const Tensor xd = g.upload(x), wd = g.upload(w), bd = g.upload(b);
    Tensor rd = g.upload(res);
    Tensor out = c.in_place ? rd : device_nan(g, {c.rows, c.n});
    Tensor ed = device_nan_entry(g, {c.rows, c.n}, c.entry_dtype);
    const uint64_t before = g.launch_counts().kernels;
    g.linear_residual_push(xd, wd, c.bias ? &bd : nullptr, rd, out, ed);
    launches[i] = g.launch_counts().kernels - before;
    got[i] = to_host(g, out);
    entry[i] = to_host(g, ed);
  }
  EXPECT_TRUE(same_bytes(got[1], got[0])) << "out: lever on vs off";
  EXPECT_TRUE(same_bytes(entry[1], entry[0])) << "entry: lever on vs off";
  EXPECT_TRUE(close_to(got[1], want, 1e-5)) << "out: lever on vs the CPU";
  // The entry is out as copy() converts it, every element written.
  Tensor want_entry = Tensor::empty({c.rows, c.n}, c.entry_dtype);
  for (int64_t i = 0; i < want_entry.numel(); ++i) {
    const float v = got[1].ptr<float>()[i];
    if (c.entry_dtype == DType::BF16) {
      want_entry.ptr<uint16_t>()[i] = f32_to_bf16(v);
    } else {
      want_entry.ptr<float>()[i] = v;
    }
  }
  EXPECT_TRUE(same_bytes(entry[1], want_entry)) << "entry: lever on vs out rounded on the host";
  EXPECT_EQ(launches[0], fused ? 2u : launches[1]) << "lever off: the GEMV, then the rounding";
  if (fused) {
    EXPECT_EQ(launches[1], 1u) << "lever on: one launch";
  }
}

TEST(CudaBankPushEpilogue, DecodeShapesEqualTheLeverOff) {
  SKIP_WITHOUT_CUDA();
  for (const GemvLeverSet& levers : kGemvLeverSets) {
    Backends be(levers);
    std::mt19937 rng(50);
    for (DType wdt : {DType::BF16, DType::F32}) {
      for (int64_t rows : {1, 3, 8}) {
        for (bool in_place : {true, false}) {
          check_push(be, levers, {rows, 3072, 1024, wdt, in_place, false}, true, rng);  // down
          check_push(be, levers, {rows, 2048, 1024, wdt, in_place, true}, true, rng);   // o_proj
        }
      }
    }
  }
}

// K 64: fewer bf16 vectors than lanes; K 320: one batch of a lane's loads, most past the row's
// end; K 2056: a second batch of one load; K 37: the scalar path. N 17 / 24 / 96: a last block
// of fewer warps than rows.
TEST(CudaBankPushEpilogue, SmallShapesAtEveryRowCount) {
  SKIP_WITHOUT_CUDA();
  for (const GemvLeverSet& levers : kGemvLeverSets) {
    Backends be(levers);
    std::mt19937 rng(51);
    for (DType wdt : {DType::BF16, DType::F32}) {
      for (int64_t rows = 1; rows <= 8; ++rows) {
        const bool in_place = rows % 2 == 1;
        check_push(be, levers, {rows, 64, 96, wdt, in_place, true}, true, rng);
        check_push(be, levers, {rows, 320, 36, wdt, !in_place, true}, true, rng);
        check_push(be, levers, {rows, 2056, 24, wdt, in_place, false}, true, rng);
        check_push(be, levers, {rows, 37, 17, wdt, !in_place, true}, true, rng);
      }
    }
  }
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): gemv_push_kernel without a GEMV lever
// and with the bulk lever (its mbarriers and the TMA's copies), rows 1 and 8, K 64 (fewer
// vectors than lanes) and 320, a last block of fewer warps than rows.
TEST(CudaSanitizerSized, DecodeGemvPush) {
  SKIP_WITHOUT_CUDA();
  for (const GemvLeverSet& levers : {kGemvLeverSets[0], kGemvLeverSets[4]}) {
    Backends be(levers);
    std::mt19937 rng(52);
    for (int64_t rows : {1, 8}) {
      check_push(be, levers, {rows, 64, 96, DType::BF16, true, true}, true, rng);
      check_push(be, levers, {rows, 320, 36, DType::F32, false, true}, true, rng);
    }
  }
}

// Not the lever's path: more rows than the GEMV takes (cuBLAS, then the add and the copy), an
// f32 entry (a plain copy): the lever-off ops, the same bits and launches either way.
TEST(CudaBankPushEpilogue, OtherwiseTheSeparateOps) {
  SKIP_WITHOUT_CUDA();
  Backends be(kGemvLeverSets[0]);
  std::mt19937 rng(52);
  for (DType wdt : {DType::BF16, DType::F32}) {
    for (bool in_place : {true, false}) {
      check_push(be, kGemvLeverSets[0], {13, 2048, 1024, wdt, in_place, true}, false, rng);
      PushCase f32_entry{3, 3072, 1024, wdt, in_place, false, DType::F32};
      check_push(be, kGemvLeverSets[0], f32_entry, false, rng);
    }
  }
}

// A prefill (15 rows: cuBLAS) and decode steps (2 rows: the GEMV) of two sequences; the logits
// of every step bit for bit, and the launches of each step: a decode step one fewer per push
// (a bf16 bank's block boundary), the prefill and an f32 bank's steps the same.
void compare_model(const ModelConfig& config, DType weight_dtype, DType bank_dtype) {
  SCOPED_TRACE(config.summary() + " " + std::string(dtype_name(weight_dtype)) + " weights, " +
               std::string(dtype_name(bank_dtype)) + " bank");
  RandomWeightOptions opt;
  opt.dtype = weight_dtype;
  opt.seed = 13;
  opt.final_mix = true;  // 2b: block sums, pushed and reset at each boundary
  const ModelWeights weights = make_random_weights(config, opt);
  Backends be(kGemvLeverSets[0]);
  Transformer off_model(config, weights, be.off, {}, bank_dtype);
  Transformer on_model(config, weights, be.on, {}, bank_dtype);
  int pushes = 0;
  for (const DepthStep& step : on_model.plan().steps) pushes += step.push_and_reset_after_mix;
  ASSERT_GT(pushes, 0) << "a model without block boundaries tests nothing";
  const int block_size = 4, num_blocks = 24;
  KvCache off_cache = KvCache::allocate(be.off, config, num_blocks, block_size, DType::BF16);
  KvCache on_cache = KvCache::allocate(be.on, config, num_blocks, block_size, DType::BF16);
  std::mt19937 rng(7);
  const int decode_steps = 3;
  std::vector<Seq> seqs = random_sequences({11 + decode_steps, 4 + decode_steps}, block_size,
                                           num_blocks, config.vocab_size, rng);
  std::vector<int> begin(seqs.size(), 0), end = {11, 4};
  for (int step = 0; step <= decode_steps; ++step) {
    std::vector<int32_t> rows;
    const BatchMeta batch = make_step(seqs, begin, end, block_size, rows);
    uint64_t before = be.on.launch_counts().kernels;
    const Tensor got = to_host(be.on, on_model.forward(batch, on_cache, rows));
    const uint64_t on_launches = be.on.launch_counts().kernels - before;
    before = be.off.launch_counts().kernels;
    const Tensor want = to_host(be.off, off_model.forward(batch, off_cache, rows));
    const uint64_t off_launches = be.off.launch_counts().kernels - before;
    EXPECT_TRUE(same_bytes(got, want)) << "step " << step;
    const bool decode = batch.num_tokens <= 8;
    EXPECT_EQ(step > 0, decode) << "step " << step << ": " << batch.num_tokens << " rows";
    const uint64_t saved = decode && bank_dtype == DType::BF16 ? pushes : 0;
    EXPECT_EQ(off_launches - on_launches, saved) << "step " << step;
    for (size_t s = 0; s < seqs.size(); ++s) begin[s] = end[s]++;
  }
}

TEST(CudaBankPushEpilogue, ModelLogitsEqualTheLeverOffWithALaunchFewerPerPush) {
  SKIP_WITHOUT_CUDA();
  for (DType wdt : {DType::BF16, DType::F32}) {
    compare_model(small_config("block", 4, 2), wdt, DType::BF16);  // one boundary
    compare_model(small_config("block", 6, 3), wdt, DType::BF16);  // two
  }
  compare_model(small_config("block", 4, 2), DType::BF16, DType::F32);
}

TEST(CudaBankPushEpilogue, EnvironmentSwitchesTheLeverWhenABackendIsBuilt) {
  SKIP_WITHOUT_CUDA();
  expect_environment_switches_lever(
      "ATTNRES_CUDA_BANK_PUSH_EPILOGUE",
      [](const CudaBackend& be) { return be.bank_push_epilogue(); },
      [](CudaBackend& be, bool on) { be.set_bank_push_epilogue(on); });
}

}  // namespace
}  // namespace attnres::test
