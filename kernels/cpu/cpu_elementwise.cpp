// Row-wise and element-wise ops: embedding (gather + widen), swiglu, add_inplace (and
// add_inplace_push, the residual add that also writes a bf16 depth-bank entry), gather_rows. All
// are pure streaming over contiguous f32 rows (swiglu may write bf16 ones, a linear's input);
// each parallelises over rows (or flat chunks) only when the op is large enough to amortise
// waking the thread team.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_linear_quant.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which ops stay single-threaded

template <DType W>
void widen_row(const cpu::StoredT<W>* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + cpu::kLanes <= n; i += cpu::kLanes) cpu::vstore(dst + i, cpu::vload_w<W>(src + i));
  for (; i < n; ++i) dst[i] = cpu::load_scalar<W>(src + i);
}

template <DType W>
void embed_rows(const void* table, const int32_t* ids, int64_t t_dim, int64_t d, float* out,
                cpu::WorkerPool& pool) {
  const auto* tab = static_cast<const cpu::StoredT<W>*>(table);
  pool.parallel_for(t_dim, pool.size() > 1 && t_dim * d >= kParallelMin,
                    [&](int64_t t) { widen_row<W>(tab + ids[t] * d, d, out + t * d); });
}

// out = silu(g) * u with a vector exp; every element goes through the same lanes' arithmetic
// (the tail padded into a vector), so the result does not depend on the chunking. OutT:
// float, or uint16_t for bf16 rows (the result rounded at the store).
template <class OutT>
void swiglu_into(const float* g, const float* u, OutT* o, int64_t total, cpu::WorkerPool& pool) {
  const auto silu_mul = [](cpu::VecF gv, cpu::VecF uv) {
    const cpu::VecF one = cpu::vset1(1.0f);
    return cpu::vmul(cpu::vdiv(gv, cpu::vadd(one, cpu::vexp(cpu::vsub(cpu::vzero(), gv)))), uv);
  };
  constexpr int64_t kChunk = 4096;  // elements per task (a multiple of every kLanes)
  pool.parallel_for((total + kChunk - 1) / kChunk, pool.size() > 1 && total >= kParallelMin,
                    [&](int64_t c) {
                      const int64_t end = std::min(total, (c + 1) * kChunk);
                      int64_t i = c * kChunk;
                      for (; i + cpu::kLanes <= end; i += cpu::kLanes)
                        cpu::vstore_as(o + i, silu_mul(cpu::vload(g + i), cpu::vload(u + i)));
                      if (i < end) {
                        alignas(64) float gt[cpu::kLanes] = {}, ut[cpu::kLanes] = {};
                        std::copy(g + i, g + end, gt);
                        std::copy(u + i, u + end, ut);
                        cpu::vstore(gt, silu_mul(cpu::vload(gt), cpu::vload(ut)));
                        for (int64_t e = i; e < end; ++e) cpu::store_as(o + e, gt[e - i]);
                      }
                    });
}

}  // namespace

void CpuBackend::embedding_impl(const Tensor& table, const BatchMeta& batch, Tensor& out) {
  cpu::check_on_cpu(table, "embedding table");
  cpu::check_on_cpu(out, "embedding out");
  const int64_t d = table.dim(1);
  const int64_t t_dim = cpu::rows_of(out);
  const int32_t* ids = batch.token_ids.data();
  switch (table.dtype) {
    case DType::F32:
      return embed_rows<DType::F32>(table.data, ids, t_dim, d, out.ptr<float>(), *pool_);
    case DType::BF16:
      return embed_rows<DType::BF16>(table.data, ids, t_dim, d, out.ptr<float>(), *pool_);
    case DType::F16:
      return embed_rows<DType::F16>(table.data, ids, t_dim, d, out.ptr<float>(), *pool_);
    case DType::Q8_B32:
    case DType::Q6_B32:
    case DType::Q4_B32:
    case DType::Q4_K256:  // a quantized tied embedding / LM head: the rows dequantized
    case DType::Q6_K256:
      return cpu::embed_quantized(table.dtype, table.ptr<uint8_t>(), d, ids, t_dim,
                                  out.ptr<float>(), *pool_);
    default:
      ATTNRES_CHECK(false, "embedding table dtype " + std::string(dtype_name(table.dtype)));
  }
}

void CpuBackend::swiglu_impl(const Tensor& gate, const Tensor& up, Tensor& out) {
  cpu::check_on_cpu(gate, "swiglu gate");
  cpu::check_on_cpu(up, "swiglu up");
  cpu::check_on_cpu(out, "swiglu out");
  const int64_t total = gate.numel();
  if (out.dtype == DType::BF16) {
    swiglu_into(gate.ptr<float>(), up.ptr<float>(), out.ptr<uint16_t>(), total, *pool_);
  } else {
    swiglu_into(gate.ptr<float>(), up.ptr<float>(), out.ptr<float>(), total, *pool_);
  }
}

void CpuBackend::add_inplace_impl(Tensor& x, const Tensor& y) {
  cpu::check_on_cpu(x, "add_inplace x");
  cpu::check_on_cpu(y, "add_inplace y");
  const int64_t total = x.numel();
  float* xp = x.ptr<float>();
  const float* yp = y.ptr<float>();
  pool_->parallel_for(total, threads_ > 1 && total >= kParallelMin,
                      [&](int64_t i) { xp[i] += yp[i]; });
}

// One pass where add_inplace then copy() would read the pushed row back: in a 0.6B prefill of
// a bank-every-sublayer mode the pushes were ~1 ms of the ~12 ms of depth work.
void CpuBackend::add_inplace_push_impl(Tensor& x, const Tensor& y, Tensor& entry,
                                       PushedRow pushed) {
  // An f32 entry: nothing to fuse, the push is a plain copy (the default's two calls).
  if (entry.dtype == DType::F32) return Backend::add_inplace_push_impl(x, y, entry, pushed);
  cpu::check_on_cpu(x, "add_inplace_push x");
  cpu::check_on_cpu(y, "add_inplace_push y");
  cpu::check_on_cpu(entry, "add_inplace_push entry");
  const int64_t total = x.numel();
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (total + kChunk - 1) / kChunk;
  float* xp = x.ptr<float>();
  const float* yp = y.ptr<float>();
  uint16_t* ep = entry.ptr<uint16_t>();
  const bool push_sum = pushed == PushedRow::Sum;
  pool_->parallel_for(chunks, threads_ > 1 && total >= kParallelMin, [&](int64_t c) {
    const int64_t begin = c * kChunk, end = std::min(total, begin + kChunk);
    int64_t i = begin;
    for (; i + cpu::kLanes <= end; i += cpu::kLanes) {
      const cpu::VecF yv = cpu::vload(yp + i);
      const cpu::VecF sum = cpu::vadd(cpu::vload(xp + i), yv);
      cpu::vstore(xp + i, sum);
      cpu::vstore_bf16(ep + i, push_sum ? sum : yv);
    }
    for (; i < end; ++i) {
      xp[i] += yp[i];
      ep[i] = f32_to_bf16(push_sum ? xp[i] : yp[i]);
    }
  });
}

void CpuBackend::gather_rows_impl(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  cpu::check_on_cpu(x, "gather_rows x");
  cpu::check_on_cpu(out, "gather_rows out");
  const int64_t r_dim = x.dim(0);
  const int64_t n_out = static_cast<int64_t>(rows.size());
  const size_t row_bytes = r_dim ? x.nbytes() / static_cast<size_t>(r_dim) : 0;
  for (int64_t i = 0; i < n_out; ++i) {
    std::memcpy(static_cast<char*>(out.data) + i * row_bytes,
                static_cast<const char*>(x.data) + rows[i] * row_bytes, row_bytes);
  }
}

}  // namespace attnres
