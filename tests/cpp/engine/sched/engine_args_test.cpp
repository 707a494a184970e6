// EngineArgs and the backend / communicator registries (issue #15): what the attnres command
// builds its engine from, driven here without flags. The backends come from
// register_builtin_backends(); the model is tp_test_config's with random f32 weights.
// Tensor parallelism through EngineArgs (2 CPU ranks over the in-process group the "cpu"
// registration provides) must match one device to 1e-4 relative (f32; summation order differs).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "engine/model/random_weights.h"
#include "engine/parallel/communicator_registry.h"
#include "engine/runner/runner_args.h"
#include "engine/runner/runner_factory.h"
#include "engine/runner/tensor_parallel_runner.h"
#include "engine/sched/model_execution.h"
#include "kernels/builtin_backends.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres::test {
namespace {

LoadedModel test_model(DType weights = DType::F32) {
  LoadedModel model;
  model.source = "built-in:engine-args-test";
  model.config = tp_test_config("block");
  model.weights = make_random_weights(model.config, {weights, 5, false});
  return model;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BackendRegistry, BuiltinBackendsIncludeTheCpu) {
  register_builtin_backends();
  register_builtin_backends();  // idempotent
  const std::vector<std::string> names = registered_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
  EXPECT_TRUE(has_communicator_group("cpu"));
  BackendOptions options;
  options.threads = 1;
  auto backend = make_backend("cpu", options);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->device(), Device::CPU);
}

TEST(BackendRegistry, UnknownNamesAreErrorsNamingTheRegisteredOnes) {
  register_builtin_backends();
  const std::string message = error_of([] { make_backend("tpu"); });
  EXPECT_NE(message.find("'tpu'"), std::string::npos) << message;
  EXPECT_NE(message.find("cpu"), std::string::npos) << message;
  EXPECT_NE(error_of([] { make_communicator_group("tpu", 2); }), "");
}

TEST(BackendRegistry, ARegisteredFactoryIsWhatMakeBackendCalls) {
  auto calls = std::make_shared<int>(0);  // the registration outlives this test
  register_backend("counting-cpu", [calls](const BackendOptions& options) {
    ++*calls;
    EXPECT_EQ(options.device_index, 3);
    return make_backend("cpu", BackendOptions{});
  });
  register_builtin_backends();
  BackendOptions options;
  options.device_index = 3;
  make_backend("counting-cpu", options);
  EXPECT_EQ(*calls, 1);
}

TEST(EngineArgs, TensorParallelOnTheCpuMatchesOneDevice) {
  register_builtin_backends();
  const LoadedModel model = test_model();
  const std::vector<int32_t> ids = random_ids(40, model.config.vocab_size, 9);
  const int blocks = 4, block_size = 16;

  EngineArgs single;
  single.threads = 1;
  auto one = make_model_execution(single, model, blocks, block_size);
  EXPECT_EQ(one->tensor_parallel_size, 1);
  ASSERT_NE(one->backend, nullptr);
  const std::vector<float> want = run_prefill_then_decode(*one->runner, ids, 32, block_size);

  EngineArgs parallel = single;
  parallel.threads = 2;
  parallel.tensor_parallel_size = 2;
  parallel.sequence_parallel_min_tokens = 16;  // the prefill runs sequence-parallel too
  auto two = make_model_execution(parallel, model, blocks, block_size);
  EXPECT_EQ(two->tensor_parallel_size, 2);
  EXPECT_EQ(two->backend, nullptr);
  EXPECT_NE(two->description.find("x2 (in-process)"), std::string::npos) << two->description;
  const std::vector<float> got = run_prefill_then_decode(*two->runner, ids, 32, block_size);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(relative_error(got, want), 1e-4);
}

TEST(EngineArgs, DeviceErrorsSayWhatIsMissing) {
  register_builtin_backends();
  const LoadedModel model = test_model();
  EngineArgs args;
  args.device = "tpu";
  EXPECT_EQ(error_of([&] { make_model_execution(args, model, 2, 16); }),
            "--device: unknown device 'tpu' (expected cpu or cuda)");
  args.tensor_parallel_size = 2;
  EXPECT_EQ(error_of([&] { make_model_execution(args, model, 2, 16); }),
            "--device: unknown device 'tpu' (expected cpu or cuda)");
  args.device = "cpu";
  args.tensor_parallel_size = 1;
  args.threads = -1;
  EXPECT_EQ(error_of([&] { make_model_execution(args, model, 2, 16); }), "--threads: must be >= 0");
  if (!has_backend("cuda")) {
    args.device = "cuda";
    args.threads = 0;
    EXPECT_EQ(error_of([&] { make_model_execution(args, model, 2, 16); }),
              "--device cuda: this build has no CUDA backend (nvcc was not found)");
  }
}

TEST(EngineArgs, EngineConfigSizesTheKvCacheAndCapsMaxModelLen) {
  register_builtin_backends();
  const LoadedModel model = test_model();
  EngineArgs args;
  args.block_size = 16;
  args.kv_cache_memory_bytes = 10 * kv_bytes_per_block(args, model, 16);
  args.max_num_seqs = 8;
  args.enable_prefix_caching = false;
  const EngineConfig config = make_engine_config(args, model);
  EXPECT_EQ(config.num_kv_blocks, 10);
  EXPECT_EQ(config.block_size, 16);
  EXPECT_EQ(config.scheduler.max_model_len, 160);  // the cache holds less than the model's 4096
  EXPECT_EQ(config.scheduler.max_num_seqs, 8);
  EXPECT_FALSE(config.enable_prefix_caching);

  args.max_model_len = 161;  // asked for explicitly: an error, not a cap
  EXPECT_NE(error_of([&] { make_engine_config(args, model); }).find("raise --kv-cache-memory"),
            std::string::npos);
  args.max_model_len.reset();
  args.kv_cache_memory_bytes = 1;
  EXPECT_NE(error_of([&] { make_engine_config(args, model); }).find("hold no KV block"),
            std::string::npos);
  // Two ranks cache half the KV heads each: the same budget holds twice the blocks.
  args.kv_cache_memory_bytes = 10 * kv_bytes_per_block(EngineArgs{}, model, 16);
  args.tensor_parallel_size = 2;
  EXPECT_EQ(make_engine_config(args, model).num_kv_blocks, 20);
}

TEST(EngineArgs, KvCacheDtypeFollowsTheCheckpointAndTheBackend) {
  register_builtin_backends();
  const LoadedModel f32_model = test_model(DType::F32);
  const LoadedModel bf16_model = test_model(DType::BF16);
  EngineArgs args;  // auto, cpu
  EXPECT_EQ(kv_cache_dtype(args, f32_model), DType::F32);
  EXPECT_EQ(kv_cache_dtype(args, bf16_model), DType::BF16);
  args.kv_cache_dtype = "float32";
  EXPECT_EQ(kv_cache_dtype(args, bf16_model), DType::F32);
  args.kv_cache_dtype = "bfloat16";
  EXPECT_EQ(kv_cache_dtype(args, f32_model), DType::BF16);
  args.kv_cache_dtype = "float16";
  EXPECT_EQ(error_of([&] { kv_cache_dtype(args, f32_model); }),
            "--kv-cache-dtype: 'float16' is not one of auto, bfloat16, float32");

  // A bf16 block takes half the bytes: the same budget holds twice the blocks.
  EngineArgs f32_args, bf16_args;
  f32_args.kv_cache_dtype = "float32";
  bf16_args.kv_cache_dtype = "bfloat16";
  const size_t f32_block = kv_bytes_per_block(f32_args, f32_model, 16);
  EXPECT_EQ(kv_bytes_per_block(bf16_args, f32_model, 16) * 2, f32_block);
  f32_args.kv_cache_memory_bytes = bf16_args.kv_cache_memory_bytes = 10 * f32_block;
  EXPECT_EQ(make_engine_config(f32_args, f32_model).num_kv_blocks, 10);
  EXPECT_EQ(make_engine_config(bf16_args, f32_model).num_kv_blocks, 20);

  // The execution allocates what was asked for, on one device and under tensor parallelism.
  EngineArgs run;
  run.threads = 1;
  EXPECT_EQ(make_model_execution(run, bf16_model, 2, 16)->kv_cache_dtype, DType::BF16);
  EXPECT_EQ(make_model_execution(run, f32_model, 2, 16)->kv_cache_dtype, DType::F32);
  run.tensor_parallel_size = 2;
  EXPECT_EQ(make_model_execution(run, bf16_model, 2, 16)->kv_cache_dtype, DType::BF16);
}

TEST(EngineArgs, DepthBankDtypeFollowsTheCheckpointAndTheBackend) {
  register_builtin_backends();
  const LoadedModel f32_model = test_model(DType::F32);
  const LoadedModel bf16_model = test_model(DType::BF16);
  EngineArgs args;  // auto, cpu
  EXPECT_EQ(depth_bank_dtype(args, f32_model), DType::F32);
  EXPECT_EQ(depth_bank_dtype(args, bf16_model), DType::BF16);
  args.depth_bank_dtype = "float32";
  EXPECT_EQ(depth_bank_dtype(args, bf16_model), DType::F32);
  args.depth_bank_dtype = "bfloat16";
  EXPECT_EQ(depth_bank_dtype(args, f32_model), DType::BF16);
  EXPECT_EQ(kv_cache_dtype(args, f32_model), DType::F32);  // the two settings are independent
  args.depth_bank_dtype = "float16";
  EXPECT_EQ(error_of([&] { depth_bank_dtype(args, f32_model); }),
            "--depth-bank-dtype: 'float16' is not one of auto, bfloat16, float32");

  // The single-device execution's Transformer stores what was resolved.
  EngineArgs run;
  run.threads = 1;
  auto bf16_exec = make_model_execution(run, bf16_model, 2, 16);
  EXPECT_EQ(bf16_exec->depth_bank_dtype, DType::BF16);
  EXPECT_EQ(bf16_exec->transformer->depth_bank_dtype(), DType::BF16);
  run.depth_bank_dtype = "float32";
  EXPECT_EQ(make_model_execution(run, bf16_model, 2, 16)->transformer->depth_bank_dtype(),
            DType::F32);
}

// --linear-input-dtype: auto takes bf16 inputs for bf16 weights exactly where the CPU backend
// says they are faster (a measured property of the core: cpu/bf16_dot_rate.h); float32 never;
// bfloat16 wherever the build can, refused for non-bf16 weights or a build without
// AVX512_BF16. The resolved choice reaches the backend, on one device and on every rank.
TEST(EngineArgs, LinearInputDtypeFollowsTheCheckpointAndTheCore) {
  register_builtin_backends();
  const LoadedModel f32_model = test_model(DType::F32);
  const LoadedModel bf16_model = test_model(DType::BF16);
  const bool supported = CpuBackend::bf16_linear_inputs_supported();
  const bool faster = CpuBackend::bf16_linear_inputs_faster();
  EngineArgs args;  // auto, cpu
  EXPECT_FALSE(bf16_linear_inputs(args, f32_model));
  EXPECT_EQ(bf16_linear_inputs(args, bf16_model), faster);
  EXPECT_EQ(linear_input_dtype_name(args, bf16_model), faster ? "bfloat16" : "float32");
  args.linear_input_dtype = "float32";
  EXPECT_FALSE(bf16_linear_inputs(args, bf16_model));
  args.linear_input_dtype = "bfloat16";
  EXPECT_EQ(error_of([&] { bf16_linear_inputs(args, f32_model); }),
            "--linear-input-dtype bfloat16: the checkpoint's weights are float32; inputs are "
            "rounded to bf16 only to meet bf16 weights");
  if (supported) {
    EXPECT_TRUE(bf16_linear_inputs(args, bf16_model));
  } else {
    EXPECT_NE(error_of([&] { bf16_linear_inputs(args, bf16_model); }).find("AVX512_BF16"),
              std::string::npos);
  }
  args.linear_input_dtype = "bf16";
  EXPECT_EQ(error_of([&] { bf16_linear_inputs(args, bf16_model); }),
            "--linear-input-dtype: 'bf16' is not one of auto, bfloat16, float32");

  if (!supported) return;
  EngineArgs run;
  run.threads = 1;
  run.linear_input_dtype = "bfloat16";
  auto exec = make_model_execution(run, bf16_model, 2, 16);
  ASSERT_TRUE(dynamic_cast<CpuBackend*>(exec->backend.get()));
  EXPECT_TRUE(dynamic_cast<CpuBackend*>(exec->backend.get())->bf16_linear_inputs());
  run.linear_input_dtype = "float32";
  exec = make_model_execution(run, bf16_model, 2, 16);
  EXPECT_FALSE(dynamic_cast<CpuBackend*>(exec->backend.get())->bf16_linear_inputs());
  // Under tensor parallelism every rank's backend is built with the same choice.
  run.tensor_parallel_size = 2;
  for (const char* dtype : {"bfloat16", "float32"}) {
    run.linear_input_dtype = dtype;
    exec = make_model_execution(run, bf16_model, 2, 16);
    const auto* tp = dynamic_cast<const TensorParallelRunner*>(exec->runner.get());
    ASSERT_TRUE(tp);
    for (int rank = 0; rank < 2; ++rank) {
      const auto* cpu = dynamic_cast<const CpuBackend*>(&tp->rank_model(rank).backend());
      ASSERT_TRUE(cpu);
      EXPECT_EQ(cpu->bf16_linear_inputs(), std::string(dtype) == "bfloat16") << dtype << rank;
    }
  }
}

// resolve_runner_args decides every setting once; what it returns is what the runners get.
TEST(EngineArgs, RunnerArgsCarryEverySettingResolved) {
  register_builtin_backends();
  const LoadedModel bf16_model = test_model(DType::BF16);
  EngineArgs args;  // every dtype "auto", on the cpu
  args.model = "builtin:engine-args-test";
  args.threads = 3;
  args.tensor_parallel_size = 2;
  args.sequence_parallel_min_tokens = 64;
  args.max_num_seqs = 8;
  RunnerArgs resolved = resolve_runner_args(args, bf16_model);
  EXPECT_EQ(resolved.model, "builtin:engine-args-test");
  EXPECT_EQ(resolved.device, "cpu");
  EXPECT_EQ(resolved.threads, 3);
  EXPECT_EQ(resolved.tensor_parallel_size, 2);
  EXPECT_EQ(resolved.sequence_parallel_min_tokens, 64);
  EXPECT_EQ(resolved.kv_cache_dtype, DType::BF16);    // the CPU reads a bf16 cache
  EXPECT_EQ(resolved.depth_bank_dtype, DType::BF16);  // and a bf16 bank
  EXPECT_EQ(resolved.bf16_linear_inputs, CpuBackend::bf16_linear_inputs_faster());
  EXPECT_EQ(resolved.max_graph_batch, 8);  // no graph larger than the largest batch
  args.max_num_seqs = 1000;
  EXPECT_EQ(resolve_runner_args(args, bf16_model).max_graph_batch, 256);
  args.enforce_eager = true;
  EXPECT_EQ(resolve_runner_args(args, bf16_model).max_graph_batch, 0);
  args.kv_cache_dtype = "float32";
  args.depth_bank_dtype = "float32";
  resolved = resolve_runner_args(args, bf16_model);
  EXPECT_EQ(resolved.kv_cache_dtype, DType::F32);
  EXPECT_EQ(resolved.depth_bank_dtype, DType::F32);
  args.kv_cache_dtype = "f16";
  EXPECT_EQ(error_of([&] { resolve_runner_args(args, bf16_model); }),
            "--kv-cache-dtype: 'f16' is not one of auto, bfloat16, float32");
  args.kv_cache_dtype = "auto";
  args.sequence_parallel_min_tokens = -1;
  EXPECT_EQ(error_of([&] { resolve_runner_args(args, bf16_model); }),
            "--sequence-parallel-min-tokens: must be >= 0");
}

// The runner factory builds what RunnerArgs say and decides nothing again: a bf16 bank and
// cache for f32 weights, which "auto" would never choose there.
TEST(EngineArgs, TheRunnerFactoryTakesRunnerArgsAsTheyAre) {
  register_builtin_backends();
  const LoadedModel f32_model = test_model(DType::F32);
  RunnerArgs args;
  args.threads = 1;
  args.kv_cache_dtype = DType::BF16;
  args.depth_bank_dtype = DType::BF16;
  args.max_graph_batch = 0;
  auto exec = make_model_execution(args, f32_model, 2, 16);
  EXPECT_EQ(exec->kv_cache_dtype, DType::BF16);
  EXPECT_EQ(exec->depth_bank_dtype, DType::BF16);
  EXPECT_EQ(exec->transformer->depth_bank_dtype(), DType::BF16);
  args.tensor_parallel_size = 2;
  exec = make_model_execution(args, f32_model, 2, 16);
  const auto* tp = dynamic_cast<const TensorParallelRunner*>(exec->runner.get());
  ASSERT_TRUE(tp);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(tp->rank_model(rank).depth_bank_dtype(), DType::BF16) << rank;
  }
}

// In a CUDA build the CUDA registration says its attention reads a bf16 KV cache and its depth
// ops a bf16 bank, so `auto` picks bf16 for a bf16 checkpoint there as on the CPU (asked
// before any GPU is touched); explicit choices are honoured.
TEST(EngineArgs, CudaKvCacheAndDepthBankFollowTheCheckpoint) {
  register_builtin_backends();
  if (!has_backend("cuda")) GTEST_SKIP() << "a build without the CUDA backend";
  const LoadedModel f32_model = test_model(DType::F32);
  const LoadedModel bf16_model = test_model(DType::BF16);
  EngineArgs args;
  args.device = "cuda";
  EXPECT_EQ(kv_cache_dtype(args, bf16_model), DType::BF16);
  EXPECT_EQ(kv_cache_dtype(args, f32_model), DType::F32);
  EXPECT_EQ(depth_bank_dtype(args, bf16_model), DType::BF16);
  EXPECT_EQ(depth_bank_dtype(args, f32_model), DType::F32);
  args.kv_cache_dtype = args.depth_bank_dtype = "bfloat16";
  EXPECT_EQ(kv_cache_dtype(args, f32_model), DType::BF16);
  EXPECT_EQ(depth_bank_dtype(args, f32_model), DType::BF16);
  args.kv_cache_dtype = args.depth_bank_dtype = "float32";
  EXPECT_EQ(kv_cache_dtype(args, bf16_model), DType::F32);
  EXPECT_EQ(depth_bank_dtype(args, bf16_model), DType::F32);
}

TEST(EngineArgs, ABackendWithoutABf16CacheRefusesItAndAutoGivesF32) {
  register_builtin_backends();
  // Registered without traits: an f32 cache only (the Backend default).
  register_backend("f32-cache-cpu", [](const BackendOptions&) { return make_backend("cpu"); });
  const LoadedModel bf16_model = test_model(DType::BF16);
  EngineArgs args;
  args.device = "f32-cache-cpu";
  EXPECT_EQ(kv_cache_dtype(args, bf16_model), DType::F32);
  args.kv_cache_dtype = "bfloat16";
  EXPECT_EQ(error_of([&] { kv_cache_dtype(args, bf16_model); }),
            "--kv-cache-dtype bfloat16: the f32-cache-cpu backend's attention reads an f32 cache "
            "(not yet bf16)");
  // The depth bank likewise.
  EXPECT_EQ(depth_bank_dtype(args, bf16_model), DType::F32);
  args.depth_bank_dtype = "bfloat16";
  EXPECT_EQ(error_of([&] { depth_bank_dtype(args, bf16_model); }),
            "--depth-bank-dtype bfloat16: the f32-cache-cpu backend's depth ops read an f32 bank "
            "(not yet bf16)");
}

}  // namespace
}  // namespace attnres::test
