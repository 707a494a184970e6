// CudaBackend embedding, swiglu, add_inplace and gather_rows (the kernels:
// cuda_elementwise.cu).
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_op_checks.h"

namespace attnres {
using namespace cuda_ops;

void CudaBackend::embedding_impl(const Tensor& table, const BatchMeta& batch, Tensor& out) {
  Impl& im = on_device();
  check_cuda(table, "embedding table");
  check_cuda(out, "embedding out");
  const int64_t d = table.dim(1);
  const int64_t T = rows_of(out);
  im.ensure_prepared(*this, batch);
  if (T == 0) return;
  cuda::launch_embedding(table.data, table.dtype, im.token_ids, T, d, f32(out), im.stream);
}

void CudaBackend::swiglu_impl(const Tensor& gate, const Tensor& up, Tensor& out) {
  check_cuda(gate, "swiglu gate");
  check_cuda(up, "swiglu up");
  check_cuda(out, "swiglu out");
  const int64_t total = gate.numel();
  cuda::launch_swiglu(f32(gate), f32(up), out.data, out.dtype, total, on_device().stream);
}

void CudaBackend::add_inplace_impl(Tensor& x, const Tensor& y) {
  check_cuda(x, "add_inplace x");
  check_cuda(y, "add_inplace y");
  cuda::launch_add_inplace(f32(x), f32(y), x.numel(), on_device().stream);
}

void CudaBackend::gather_rows_impl(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  Impl& im = on_device();
  check_cuda(x, "gather_rows x");
  check_cuda(out, "gather_rows out");
  const int64_t r_dim = x.dim(0);
  const int64_t n_out = static_cast<int64_t>(rows.size());
  const size_t row_bytes = r_dim ? x.nbytes() / static_cast<size_t>(r_dim) : 0;
  if (n_out == 0 || row_bytes == 0) return;

  // Upload the row ids through a pinned buffer (reused once the previous copy is done).
  const size_t count = static_cast<size_t>(n_out);
  if (im.capturing()) {
    // See Impl::meta_staged_in_capture.
    ATTNRES_CHECK(!im.rows_staged_in_capture,
                  "gather_rows: a captured step may gather host rows once (every copy in the "
                  "graph would read the last rows staged)");
    ATTNRES_CHECK(count <= im.rows_host_count,
                  "gather_rows: these rows need a larger pinned staging buffer, which cannot be "
                  "allocated during a graph capture: run the step eagerly once first");
    im.rows_staged_in_capture = true;
  } else {
    CUDA_CHECK(cudaEventSynchronize(im.rows_copied));  // an eager copy's or a replay's
  }
  if (count > im.rows_host_count) {
    const size_t grown = std::max(count, im.rows_host_count * 2);
    im.rows_host.reset();
    im.rows_host_count = 0;
    im.rows_host = im.pinned_host(grown * sizeof(int32_t));
    im.rows_host_count = grown;
  }
  if (count > im.rows_device_count) {
    const size_t grown = std::max(count, im.rows_device_count * 2);
    im.rows_device = im.raw_alloc(grown * sizeof(int32_t));
    im.rows_device_count = grown;
  }
  int32_t* rows_host = static_cast<int32_t*>(im.rows_host.get());
  std::copy(rows.begin(), rows.end(), rows_host);
  im.rows_staged = n_out;
  int32_t* rows_dev = static_cast<int32_t*>(im.rows_device.get());
  CUDA_CHECK(cudaMemcpyAsync(rows_dev, rows_host, count * sizeof(int32_t), cudaMemcpyHostToDevice,
                             im.stream));
  if (!im.capturing()) CUDA_CHECK(cudaEventRecord(im.rows_copied, im.stream));  // not in a graph
  cuda::launch_gather_rows(x.data, rows_dev, n_out, row_bytes, out.data, im.stream);
}

}  // namespace attnres
