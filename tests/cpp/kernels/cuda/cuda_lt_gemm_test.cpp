// The prefill GEMM through cuBLASLt (kernels/cuda/cuda_lt_gemm.h): bias and residual in the
// epilogue, in place or not, against a double-precision reference on the same (already
// rounded) inputs. The alignment helper is host code and runs everywhere.
#include "kernels/cuda/cuda_lt_gemm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_registration.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"

namespace attnres::test {
namespace {

TEST(LtGemmAlignment, LargestPowerOfTwoUpTo256) {
  alignas(256) static unsigned char buffer[4096];
  EXPECT_EQ(cuda::pointer_alignment(buffer), 256);
  EXPECT_EQ(cuda::pointer_alignment(buffer + 512), 256);
  EXPECT_EQ(cuda::pointer_alignment(buffer + 128), 128);
  EXPECT_EQ(cuda::pointer_alignment(buffer + 2 * 1000), 16);  // row 1 of a bf16 [., 1000]
  EXPECT_EQ(cuda::pointer_alignment(buffer + 4 * 257), 4);    // row 1 of an f32 [., 257]
  EXPECT_EQ(cuda::pointer_alignment(buffer + 1), 1);
}

// Device memory holding a host vector's bytes.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) { CUDA_CHECK(cudaMalloc(&ptr, n)); }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<float> floats() const {
    std::vector<float> host(bytes / sizeof(float));
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
};

// Values in [-1, 1] that bf16 stores exactly (so the reference and the GEMM see one input),
// as f32 and as the bf16 bits.
struct Bf16Values {
  std::vector<float> f32;
  std::vector<uint16_t> bits;
};
Bf16Values random_bf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Bf16Values v;
  for (size_t i = 0; i < n; ++i) {
    v.bits.push_back(f32_to_bf16(dist(rng)));
    v.f32.push_back(bf16_to_f32(v.bits.back()));
  }
  return v;
}

enum class Residual { kNone, kSeparate, kInPlace };

TEST(CudaLtGemm, BiasAndResidualInTheEpilogue) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(2603);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceBuffer workspace(size_t{32} << 20);
  cuda::LtGemm gemm(workspace.ptr, workspace.bytes);
  struct Problem {
    int64_t r, k, n;
  };
  // Prefill-sized rows (the GEMV takes <= 8), the 0.6B projections, and odd sizes whose rows
  // are less aligned than their base.
  for (const Problem p : {Problem{9, 64, 96}, Problem{130, 1024, 3072}, Problem{256, 3072, 1024},
                          Problem{33, 1000, 257}}) {
    for (bool bf16 : {true, false}) {
      const Bf16Values x = random_bf16(p.r * p.k, rng), w = random_bf16(p.n * p.k, rng),
                       bias = random_bf16(p.n, rng), res = random_bf16(p.r * p.n, rng);
      std::vector<double> dots(p.r * p.n);
      for (int64_t i = 0; i < p.r; ++i)
        for (int64_t o = 0; o < p.n; ++o)
          for (int64_t k = 0; k < p.k; ++k)
            dots[i * p.n + o] += double{x.f32[i * p.k + k]} * w.f32[o * p.k + k];
      DeviceBuffer xd = bf16 ? DeviceBuffer(x.bits) : DeviceBuffer(x.f32);
      DeviceBuffer wd = bf16 ? DeviceBuffer(w.bits) : DeviceBuffer(w.f32);
      DeviceBuffer bd(bias.f32), rd(res.f32);
      for (bool with_bias : {false, true}) {
        for (Residual residual : {Residual::kNone, Residual::kSeparate, Residual::kInPlace}) {
          Tensor want = Tensor::empty({p.r, p.n}, DType::F32);
          for (int64_t i = 0; i < p.r; ++i) {
            for (int64_t o = 0; o < p.n; ++o) {
              double v = dots[i * p.n + o];
              if (with_bias) v += bias.f32[o];
              if (residual != Residual::kNone) v += res.f32[i * p.n + o];
              want.ptr<float>()[i * p.n + o] = static_cast<float>(v);
            }
          }
          DeviceBuffer out(residual == Residual::kInPlace ? res.f32
                                                          : std::vector<float>(p.r * p.n, kNaN));
          cuda::LtGemmArgs args{p.r,
                                p.k,
                                p.n,
                                bf16 ? CUDA_R_16BF : CUDA_R_32F,
                                wd.ptr,
                                xd.ptr,
                                with_bias ? static_cast<const float*>(bd.ptr) : nullptr,
                                nullptr,
                                static_cast<float*>(out.ptr)};
          if (residual == Residual::kSeparate) args.residual = static_cast<const float*>(rd.ptr);
          if (residual == Residual::kInPlace) args.residual = args.out;
          const std::string what = std::to_string(p.r) + "x" + std::to_string(p.k) + " -> " +
                                   std::to_string(p.n) + (bf16 ? " bf16" : " f32") +
                                   (with_bias ? " +bias" : "") +
                                   (residual == Residual::kNone       ? ""
                                    : residual == Residual::kSeparate ? " +residual"
                                                                      : " +residual in place");
          ASSERT_TRUE(gemm.run(args, stream)) << "no cuBLASLt algorithm for " << what;
          CUDA_CHECK(cudaStreamSynchronize(stream));
          Tensor got = Tensor::empty({p.r, p.n}, DType::F32);
          const std::vector<float> got_values = out.floats();
          std::copy(got_values.begin(), got_values.end(), got.ptr<float>());
          // f32 accumulation of K exact products (bf16 x bf16 fits f32): the error is a few
          // f32 ulps of the sum of |terms|, under 1e-4 of the outputs' scale at K <= 3072;
          // a missing bias or residual (terms of size ~0.5) is far outside it.
          EXPECT_TRUE(close_to(got, want, 1e-4)) << what;
          // Again (not in place, whose output was its input): the plan is reused.
          if (residual != Residual::kInPlace) {
            const size_t planned = gemm.plans();
            ASSERT_TRUE(gemm.run(args, stream));
            EXPECT_EQ(gemm.plans(), planned) << what << ": the second call planned again";
          }
        }
      }
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace attnres::test
