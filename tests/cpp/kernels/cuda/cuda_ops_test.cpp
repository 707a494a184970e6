// Every CudaBackend op against the CpuBackend (the reference) on fresh random inputs.
// Tolerances, per op (|got - ref| <= rtol |ref| + rtol * rms(ref), NaN never passes):
//   embedding, gather_rows, store_kv, copy         exact
//   rms_norm, swiglu, add, qk_norm_rope            1e-5  (f32; FMA contraction / reduction order)
//   attention (F32 or BF16 cache)                  2e-5  (f32 online vs two-pass softmax;
//                                                  4e-5 at context 4096: see
//                                                  cuda_flash_attention_test.cpp)
//   depth_phase1 / phase2                          2e-5; 3e-4 with large logits (|logit| ~ 50:
//                                                  the dot's rounding moves e^logit)
//   linear F32 weights, or any weights at R <= 8   1e-5  (f32 GEMM with TF32 off / GEMV)
//   linear BF16 / F16 weights, R > 8               1e-2  (x rounded to bf16 before the GEMM)
// Without a GPU every test skips (SKIP_WITHOUT_CUDA), so CI reports skips, not failures.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "kernels/cuda/cuda_registration.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

struct Backends {
  CpuBackend cpu{2};
  CudaBackend gpu{0};
};

// --- memory ---

TEST(CudaMemory, AllocIsZeroAndRoundTrips) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  std::mt19937 rng(1);
  Tensor z = be.alloc({3, 5}, DType::F32);
  EXPECT_EQ(z.device, Device::CUDA);
  Tensor zh = to_host(be, z);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(zh.ptr<float>()[i], 0.0f);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor h = random_host({7, 33}, dt, rng);
    Tensor d = be.upload(h);
    EXPECT_EQ(d.dtype, dt);  // bf16 stays bf16
    Tensor back = to_host(be, d);
    EXPECT_EQ(std::memcmp(back.data, h.data, h.nbytes()), 0);
    Tensor d2 = be.alloc(d.shape, dt);
    be.copy(d, d2);
    Tensor back2 = to_host(be, d2);
    EXPECT_EQ(std::memcmp(back2.data, h.data, h.nbytes()), 0);
    be.fill_zero(d2);
    Tensor zero = to_host(be, d2);
    for (int64_t i = 0; i < zero.numel(); ++i) EXPECT_EQ(element_as_float(zero, i), 0.0f);
  }
  // A row view copies into another row.
  Tensor big = be.upload(random_host({4, 6}, DType::F32, rng));
  Tensor r1 = big.row(1), r3 = big.row(3);
  be.copy(r1, r3);
  Tensor bh = to_host(be, big);
  EXPECT_EQ(std::memcmp(bh.ptr<float>() + 6, bh.ptr<float>() + 18, 24), 0);
}

TEST(CudaMemory, CachingAllocatorReusesBlocksAndZeroes) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  void* first = nullptr;
  {
    Tensor a = be.alloc({1000}, DType::F32);
    first = a.data;
    Tensor ones = be.upload(filled_host({1000}, 1.0f));
    be.copy(ones, a);
    be.synchronize();
  }
  EXPECT_GT(be.cached_free_bytes(), 0u);
  Tensor b = be.alloc({1000}, DType::F32);  // same size class: the cached block, zeroed again
  EXPECT_EQ(b.data, first);
  Tensor bh = to_host(be, b);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(bh.ptr<float>()[i], 0.0f);
  // Only whole free segments go back to the driver: b's 2 MiB segment must be free too.
  b = Tensor();
  be.release_cached_memory();
  EXPECT_EQ(be.cached_free_bytes(), 0u);
}

TEST(CudaMemory, TensorsOutliveTheBackend) {
  SKIP_WITHOUT_CUDA();
  Tensor keep;
  {
    CudaBackend be;
    keep = be.alloc({64}, DType::F32);
  }
  keep = Tensor();  // the deleter runs after the backend is gone: must not crash
  SUCCEED();
}

// `attnres serve` builds the backend on the main thread and drives it from the engine thread,
// whose current device starts at 0 (the runtime keeps it per host thread). Every backend call
// selects the backend's device first: with two or more GPUs a backend on device 1 driven from
// a fresh thread must allocate and launch there; with one GPU this checks the thread path.
TEST(CudaMemory, AnotherThreadDrivesTheBackendOnItsDevice) {
  SKIP_WITHOUT_CUDA();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const int device = count > 1 ? 1 : 0;
  CudaBackend be(device);
  std::mt19937 rng(5);
  const Tensor x = random_host({4, 96}, DType::F32, rng);
  std::string error;
  int alloc_device = -1, upload_device = -1;
  Tensor out = Tensor::empty({4, 96}, DType::F32);
  std::thread([&] {
    try {
      Tensor d = be.upload(x);
      Tensor y = be.alloc({4, 96}, DType::F32);
      be.add_inplace(y, d);  // 0 + x: a kernel launched from this thread
      be.download(y, out.data);
      cudaPointerAttributes attr{};
      if (cudaPointerGetAttributes(&attr, y.data) == cudaSuccess) alloc_device = attr.device;
      if (cudaPointerGetAttributes(&attr, d.data) == cudaSuccess) upload_device = attr.device;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(alloc_device, device);
  EXPECT_EQ(upload_device, device);
  EXPECT_TRUE(close_to(out, x, 0.0)) << count << " visible GPUs";
}

// A fractional --kv-cache-memory is of the GPU's free memory on CUDA (the registry's
// kv_memory_bytes), not the host's RAM; the CPU side is tests/cpp/engine/core.
TEST(CudaMemory, KvMemoryFractionIsOfTheGpusFreeMemory) {
  SKIP_WITHOUT_CUDA();
  register_cuda_backend();
  const BackendTraits traits = backend_traits("cuda");
  ASSERT_TRUE(traits.kv_memory_bytes);
  const size_t before = traits.kv_memory_bytes(0);
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_GT(before, 0u);
  EXPECT_LE(before, total);
  {
    CudaBackend be;
    Tensor big = be.alloc({int64_t{64} << 20}, DType::F32);  // 256 MiB
    be.synchronize();
    EXPECT_LE(cuda_free_memory_bytes(0) + (size_t{200} << 20), before);  // it sees them
  }
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_THROW(cuda_free_memory_bytes(count), Error);
}

TEST(CudaMemory, DeviceAvailableDoesNotThrow) {
  EXPECT_NO_THROW(cuda_device_available());  // runs without a GPU too
}

// --- embedding ---

BatchMeta tokens_batch(const std::vector<int32_t>& ids) {
  BatchMeta b;
  b.num_tokens = static_cast<int>(ids.size());
  b.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    b.positions.push_back(static_cast<int32_t>(i));
    b.slot_mapping.push_back(static_cast<int32_t>(i));
  }
  b.query_start = {0, b.num_tokens};
  b.context_len = {b.num_tokens};
  b.block_tables = {{0}};
  return b;
}

TEST(CudaOps, Embedding) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(2);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (int64_t d : {1, 133, 1024}) {
      const int vocab = 37;
      Tensor table = random_host({vocab, d}, dt, rng);
      std::vector<int32_t> ids = {0, 36, 5, 5, 17, 2, 36};
      BatchMeta batch = tokens_batch(ids);
      Tensor ref = Tensor::empty({7, d}, DType::F32);
      be.cpu.embedding(table, batch, ref);
      Tensor table_d = be.gpu.upload(table);
      Tensor out = device_nan(be.gpu, {7, d});
      be.gpu.prepare_batch(batch);
      be.gpu.embedding(table_d, batch, out);
      EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, 0.0)) << dtype_name(dt) << " d " << d;
    }
  }
}

TEST(CudaOps, EmbeddingRejectsBadIdBeforeLaunch) {
  SKIP_WITHOUT_CUDA();
  CudaBackend be;
  std::mt19937 rng(3);
  Tensor table = be.upload(random_host({10, 8}, DType::BF16, rng));
  for (int32_t bad : {10, -1}) {
    BatchMeta batch = tokens_batch({1, bad, 2});
    Tensor out = be.alloc({3, 8}, DType::F32);
    be.prepare_batch(batch);
    EXPECT_ANY_THROW(be.embedding(table, batch, out));
  }
}

// A malformed batch is refused before anything is written: the staging buffer is not
// overrun (query_start [0, 8000, 4000] used to write 8000 seq_of_token entries into room for
// 4000 before failing) and the batch prepared before it stays usable (its device metadata was
// not replaced by a half-written, regrown buffer).
TEST(CudaOps, PrepareBatchRefusesMalformedBatchesBeforeWriting) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(31);
  Tensor table = random_host({50, 64}, DType::F32, rng);
  Tensor table_d = be.gpu.upload(table);
  const BatchMeta good = tokens_batch({7, 3, 49, 0});
  be.gpu.prepare_batch(good);

  std::vector<BatchMeta> bad;
  std::vector<int32_t> many(4000, 1);
  BatchMeta decreasing = tokens_batch(many);  // large, so the buffers would have to grow
  decreasing.query_start = {0, 8000, 4000};
  decreasing.context_len = {8000, 4000};
  decreasing.block_tables = {{0}, {0}};
  bad.push_back(decreasing);
  BatchMeta past_t = tokens_batch({1, 2, 3});
  past_t.query_start = {0, 4};
  bad.push_back(past_t);
  BatchMeta short_slots = tokens_batch({1, 2, 3});
  short_slots.slot_mapping.pop_back();
  bad.push_back(short_slots);
  BatchMeta missing_table = tokens_batch({1, 2, 3});
  missing_table.block_tables.clear();
  bad.push_back(missing_table);
  for (size_t i = 0; i < bad.size(); ++i)
    EXPECT_ANY_THROW(be.gpu.prepare_batch(bad[i])) << "malformed batch " << i;

  Tensor ref = Tensor::empty({4, 64}, DType::F32);
  be.cpu.embedding(table, good, ref);
  Tensor out = device_nan(be.gpu, {4, 64});
  be.gpu.embedding(table_d, good, out);  // still the prepared batch: no re-prepare
  EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, 0.0));
}

// --- rms_norm, swiglu, add, gather ---

// rms_norm of rows x n with a gain of gdt, into its own buffer and in place (x and out alias).
void check_rms_norm(Backends& be, std::mt19937& rng, int64_t rows, int64_t n, DType gdt) {
  Tensor x = random_host({rows, n}, DType::F32, rng, -3.0f, 3.0f);
  Tensor gain = random_host({n}, gdt, rng, 0.5f, 1.5f);
  Tensor ref = Tensor::empty({rows, n}, DType::F32);
  be.cpu.rms_norm(x, gain, 1e-6f, ref);
  Tensor xd = be.gpu.upload(x), gd = be.gpu.upload(gain);
  Tensor out = device_nan(be.gpu, {rows, n});
  be.gpu.rms_norm(xd, gd, 1e-6f, out);
  EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, 1e-5)) << rows << "x" << n;
  be.gpu.rms_norm(xd, gd, 1e-6f, xd);
  EXPECT_TRUE(close_to(to_host(be.gpu, xd), ref, 1e-5)) << "aliased " << rows << "x" << n;
}

TEST(CudaOps, RmsNorm) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(4);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {3, 7}, {5, 1024}, {2, 8192}, {9, 1000}};
  for (auto [rows, n] : shapes) {
    for (DType gdt : {DType::F32, DType::BF16, DType::F16}) check_rms_norm(be, rng, rows, n, gdt);
  }
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): rms_norm_kernel's block reduction
// with one partial warp (n 7), several warps and a partial last one (n 1000: 32 warps, the
// largest block), and a row longer than the block (n 2100: three passes, a tail).
TEST(CudaSanitizerSized, NormsRmsNorm) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(40);
  check_rms_norm(be, rng, 3, 7, DType::BF16);
  check_rms_norm(be, rng, 2, 1000, DType::F32);
  check_rms_norm(be, rng, 2, 2100, DType::F16);
}

TEST(CudaOps, SwigluAndAdd) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(5);
  for (auto [rows, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 333}, {64, 3072}}) {
    Tensor g = random_host({rows, n}, DType::F32, rng, -8.0f, 8.0f);
    Tensor u = random_host({rows, n}, DType::F32, rng, -2.0f, 2.0f);
    Tensor ref = Tensor::empty({rows, n}, DType::F32);
    be.cpu.swiglu(g, u, ref);
    Tensor gd = be.gpu.upload(g), ud = be.gpu.upload(u);
    Tensor out = device_nan(be.gpu, {rows, n});
    be.gpu.swiglu(gd, ud, out);
    EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, 1e-5));

    Tensor x = clone_host(g);
    be.cpu.add_inplace(x, u);
    be.gpu.add_inplace(gd, ud);
    EXPECT_TRUE(close_to(to_host(be.gpu, gd), x, 0.0));
  }
}

TEST(CudaOps, GatherRows) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(6);
  Tensor x = random_host({9, 77}, DType::F32, rng);
  const std::vector<int32_t> rows = {8, 0, 3, 3, 8};
  Tensor ref = Tensor::empty({5, 77}, DType::F32);
  be.cpu.gather_rows(x, rows, ref);
  Tensor xd = be.gpu.upload(x);
  Tensor out = device_nan(be.gpu, {5, 77});
  be.gpu.gather_rows(xd, rows, out);
  EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, 0.0));
  // Odd row bytes (bf16, 3 columns = 6 bytes) take the byte path.
  Tensor xb = random_host({4, 3}, DType::BF16, rng);
  Tensor refb = Tensor::empty({2, 3}, DType::BF16);
  const std::vector<int32_t> rows_b = {3, 1};
  be.cpu.gather_rows(xb, rows_b, refb);
  Tensor outb = be.gpu.alloc({2, 3}, DType::BF16);
  be.gpu.gather_rows(be.gpu.upload(xb), rows_b, outb);
  EXPECT_TRUE(close_to(to_host(be.gpu, outb), refb, 0.0));
  Tensor one_row = out.rows(0, 1);
  EXPECT_ANY_THROW(be.gpu.gather_rows(xd, std::vector<int32_t>{9}, one_row));  // row 9 of 9
}

// --- linear ---

TEST(CudaOps, Linear) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(7);
  struct Shape3 {
    int64_t r, k, n;
  };
  // R <= 8: the GEMV kernel (vector path when K allows 16-byte loads, else scalar);
  // R > 8: cuBLAS.
  const std::vector<Shape3> shapes = {{1, 1, 1},      {1, 17, 33},   {3, 256, 500},
                                      {2, 36, 9},     {5, 1000, 77}, {8, 3072, 1024},
                                      {64, 1024, 96}, {9, 40, 33},   {130, 64, 257}};
  for (const Shape3& s : shapes) {
    for (DType wdt : {DType::F32, DType::BF16, DType::F16}) {
      for (bool with_bias : {false, true}) {
        Tensor x = random_host({s.r, s.k}, DType::F32, rng);
        Tensor w = random_host({s.n, s.k}, wdt, rng);
        Tensor bias = random_host({s.n}, wdt == DType::F32 ? DType::F32 : DType::BF16, rng);
        Tensor ref = Tensor::empty({s.r, s.n}, DType::F32);
        be.cpu.linear(x, w, with_bias ? &bias : nullptr, ref);
        Tensor xd = be.gpu.upload(x), wd = be.gpu.upload(w), bd = be.gpu.upload(bias);
        Tensor out = device_nan(be.gpu, {s.r, s.n});
        be.gpu.linear(xd, wd, with_bias ? &bd : nullptr, out);
        // GEMV (R <= 8) keeps x in f32: f32 tolerance for every weight dtype.
        const double tol = wdt == DType::F32 || s.r <= 8 ? 1e-5 : 1e-2;
        EXPECT_TRUE(close_to(to_host(be.gpu, out), ref, tol))
            << s.r << "x" << s.k << " -> " << s.n << " " << dtype_name(wdt)
            << (with_bias ? " +bias" : "");
      }
    }
  }
}

// linear_many (q, k, v in one GEMV launch) and linear_swiglu (gate and up with SwiGLU as the
// epilogue) against the CPU's separate linears and swiglu, on the fused path (R <= 8, K that
// allows 16-byte loads or not) and the fallback (R > 8: cuBLAS per weight). Tolerances as
// Linear's: f32 x in the GEMV, 1e-5; cuBLAS with bf16 weights rounds x, 1e-2.
TEST(CudaOps, LinearManyAndLinearSwiglu) {
  SKIP_WITHOUT_CUDA();
  Backends be;
  std::mt19937 rng(8);
  struct Case {
    int64_t r, k, nq, nkv;
  };
  for (const Case& c : {Case{1, 1024, 2048, 1024}, Case{5, 64, 96, 32}, Case{8, 37, 40, 17},
                        Case{3, 1024, 256, 128}, Case{12, 64, 96, 32}}) {
    for (DType wdt : {DType::F32, DType::BF16}) {
      for (bool with_bias : {false, true}) {
        const std::string what = std::to_string(c.r) + "x" + std::to_string(c.k) + " " +
                                 std::string(dtype_name(wdt)) + (with_bias ? " +bias" : "");
        const double tol = wdt == DType::F32 || c.r <= 8 ? 1e-5 : 1e-2;
        const DType bias_dtype = wdt == DType::F32 ? DType::F32 : DType::BF16;
        Tensor x = random_host({c.r, c.k}, DType::F32, rng);
        Tensor xd = be.gpu.upload(x);
        // linear_many: three weights, the CPU's linear per weight as the reference.
        const int64_t widths[3] = {c.nq, c.nkv, c.nkv};
        std::vector<Tensor> w, b, wd, bd, ref, out;
        for (int64_t n : widths) {
          w.push_back(random_host({n, c.k}, wdt, rng));
          b.push_back(random_host({n}, bias_dtype, rng));
          ref.push_back(Tensor::empty({c.r, n}, DType::F32));
          be.cpu.linear(x, w.back(), with_bias ? &b.back() : nullptr, ref.back());
          wd.push_back(be.gpu.upload(w.back()));
          bd.push_back(be.gpu.upload(b.back()));
          out.push_back(device_nan(be.gpu, {c.r, n}));
        }
        std::vector<Backend::LinearTarget> targets;
        for (int i = 0; i < 3; ++i) {
          targets.push_back({&wd[i], with_bias ? &bd[i] : nullptr, &out[i]});
        }
        be.gpu.linear_many(xd, targets);
        for (int i = 0; i < 3; ++i) {
          EXPECT_TRUE(close_to(to_host(be.gpu, out[i]), ref[i], tol))
              << "linear_many target " << i << " " << what;
        }
        // linear_swiglu: gate and up of width nq.
        Tensor gate = Tensor::empty({c.r, c.nq}, DType::F32),
               up = Tensor::empty({c.r, c.nq}, DType::F32),
               want = Tensor::empty({c.r, c.nq}, DType::F32);
        Tensor wu = random_host({c.nq, c.k}, wdt, rng), bu = random_host({c.nq}, bias_dtype, rng);
        be.cpu.linear_swiglu(x, w[0], with_bias ? &b[0] : nullptr, wu, with_bias ? &bu : nullptr,
                             gate, up, want);
        Tensor wud = be.gpu.upload(wu), bud = be.gpu.upload(bu);
        Tensor gd = device_nan(be.gpu, {c.r, c.nq}), ud = device_nan(be.gpu, {c.r, c.nq}),
               got = device_nan(be.gpu, {c.r, c.nq});
        be.gpu.linear_swiglu(xd, wd[0], with_bias ? &bd[0] : nullptr, wud,
                             with_bias ? &bud : nullptr, gd, ud, got);
        EXPECT_TRUE(close_to(to_host(be.gpu, got), want, tol)) << "linear_swiglu " << what;
      }
    }
  }
}

}  // namespace
}  // namespace attnres::test
