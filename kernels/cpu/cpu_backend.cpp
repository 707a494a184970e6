// CpuBackend construction and memory ops. On the CPU "device" memory is host memory:
// upload returns the same tensor (a mmap'd bf16 weight stays mmap'd, never widened), and
// download / copy are memcpy (copy also rounds f32 into a bf16 depth bank). Also the small
// validation helpers the op files share.
#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/huge_page_arena.h"
#include "kernels/cpu/bf16_dot_rate.h"
#include "kernels/cpu/cpu_linear_dot.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres {

CpuBackend::CpuBackend(int num_threads)
    : pool_(std::make_unique<cpu::WorkerPool>(num_threads)), threads_(pool_->size()) {}

bool CpuBackend::bf16_linear_inputs_supported() { return cpu::kHasBf16Dot; }

bool CpuBackend::bf16_linear_inputs_faster() {
  return bf16_linear_inputs_supported() && cpu::bf16_dot_speedup() >= 1.5;
}

const BackendCapabilities& cpu_backend_capabilities() {
  static const BackendCapabilities capabilities{
      .kv_cache_dtypes = {DType::F32, DType::BF16},
      .depth_bank_dtypes = {DType::F32, DType::BF16},
      // The block-quantized formats too (cpu_linear_quant.h).
      .weight_dtypes = {DType::F32, DType::BF16, DType::F16, DType::Q8_B32, DType::Q6_B32,
                        DType::Q4_B32, DType::Q4_K256, DType::Q6_K256},
      .bf16_linear_inputs = CpuBackend::bf16_linear_inputs_supported(),
      .prefers_bf16_linear_inputs = CpuBackend::bf16_linear_inputs_faster(),
      .mixes_without_phase1 = true,
  };
  return capabilities;
}

DType CpuBackend::linear_input_dtype(int64_t rows, DType weight_dtype) const {
  (void)rows;  // the GEMV and the GEMM both read bf16 rows (Bf16Dot)
  return bf16_linear_inputs() && weight_dtype == DType::BF16 ? DType::BF16 : DType::F32;
}

std::string CpuBackend::name() const {
  return "cpu(" + std::to_string(threads_) + " threads, " + cpu::kSimdName + ")";
}

Tensor CpuBackend::alloc(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype); }

Tensor CpuBackend::alloc_kept(const Shape& shape, DType dtype) {
  // Below 1 MB a 2 MB page would mostly hold nothing (a touched huge page is faulted whole).
  constexpr size_t kHugeFrom = size_t{1} << 20;
  return nbytes_of(shape, dtype) >= kHugeFrom ? huge_page_tensor(shape, dtype)
                                              : Tensor::empty(shape, dtype);
}

Tensor CpuBackend::upload(const Tensor& host) {
  ATTNRES_CHECK(host.device == Device::CPU, "upload expects a host tensor");
  return host;
}

void CpuBackend::download(const Tensor& src, void* host_dst) {
  ATTNRES_CHECK(src.device == Device::CPU, "download of a non-CPU tensor");
  if (src.nbytes()) std::memcpy(host_dst, src.data, src.nbytes());
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  const bool to_bf16 = src.dtype == DType::F32 && dst.dtype == DType::BF16;
  ATTNRES_CHECK(src.shape == dst.shape && (src.dtype == dst.dtype || to_bf16),
                "copy " + shape_str(src.shape) + " " + std::string(dtype_name(src.dtype)) + " -> " +
                    shape_str(dst.shape) + " " + std::string(dtype_name(dst.dtype)));
  if (!to_bf16) {
    if (src.nbytes() && src.data != dst.data) std::memmove(dst.data, src.data, src.nbytes());
    return;
  }
  // An entry entering a bf16 depth bank: rows of 4 KB and more, split over the threads.
  const int64_t total = src.numel();
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (total + kChunk - 1) / kChunk;
  const float* from = src.ptr<float>();
  uint16_t* to = dst.ptr<uint16_t>();
  pool_->parallel_for(chunks, threads_ > 1 && chunks > 1, [&](int64_t c) {
    const int64_t begin = c * kChunk;
    cpu::store_row_bf16(to + begin, from + begin, std::min(kChunk, total - begin));
  });
}

void CpuBackend::fill_zero(Tensor& dst) {
  if (dst.nbytes()) std::memset(dst.data, 0, dst.nbytes());
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

namespace cpu {

int64_t rows_of(const Tensor& t) {
  if (t.rank() == 0) return 1;
  return t.dim(-1) ? t.numel() / t.dim(-1) : 0;
}

void check_on_cpu(const Tensor& t, const char* what) {
  ATTNRES_CHECK(t.defined() || t.numel() == 0, std::string(what) + " is undefined");
  ATTNRES_CHECK(t.device == Device::CPU, std::string(what) + " is not a CPU tensor");
}

std::vector<float> widen_vector(const Tensor& t, int64_t n, const char* what) {
  check_on_cpu(t, what);
  std::vector<float> v(static_cast<size_t>(n));
  // A loop per dtype: element_as_float's call and checks per element were 2% of a 100M-shape
  // Phase 2, which widens its gain on every call.
  const auto* half = t.ptr<const uint16_t>();
  switch (t.dtype) {
    case DType::F32:
      std::copy_n(t.ptr<const float>(), n, v.begin());
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_f32(half[i]);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) v[i] = f16_to_f32(half[i]);
      break;
    case DType::I32:
    case DType::Q8_B32:
    case DType::Q6_B32:
    case DType::Q4_B32:
    case DType::Q4_K256:
    case DType::Q6_K256:
      ATTNRES_CHECK(false, std::string(what) + " is not of a float dtype");  // Backend refuses it
  }
  return v;
}

}  // namespace cpu
}  // namespace attnres
