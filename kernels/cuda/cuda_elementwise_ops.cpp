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

void CudaBackend::embedding(const Tensor& table, const BatchMeta& batch, Tensor& out) {
  Impl& im = on_device();
  check_cuda(table, "embedding table");
  ATTNRES_CHECK(table.rank() == 2, "embedding table " + shape_str(table.shape));
  const int64_t vocab = table.dim(0), d = table.dim(1);
  check_f32_rows(out, d, "embedding out");
  const int64_t T = rows_of(out);
  ATTNRES_CHECK(T == batch.num_tokens && static_cast<int64_t>(batch.token_ids.size()) == T,
                "embedding: T mismatch");
  im.ensure_prepared(*this, batch);
  if (T == 0) return;
  // Ids were range-summarised on the host in prepare_batch: a bad id never reaches the GPU.
  if (im.min_token_id < 0 || im.max_token_id >= vocab) {
    const int32_t bad = im.min_token_id < 0 ? im.min_token_id : im.max_token_id;
    ATTNRES_CHECK(false, "embedding: token id " + std::to_string(bad) +
                             " outside the vocabulary of " + std::to_string(vocab));
  }
  cuda::launch_embedding(table.data, table.dtype, im.token_ids, T, d, f32(out), im.stream);
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  ATTNRES_CHECK(gate.rank() >= 1, "swiglu gate " + shape_str(gate.shape));
  const int64_t n = gate.dim(-1);
  check_f32_rows(gate, n, "swiglu gate");
  check_f32_rows(up, n, "swiglu up");
  check_activation_out(out, n, gate, "swiglu out");
  check_activation_out(out, n, up, "swiglu out");
  const int64_t total = gate.numel();
  ATTNRES_CHECK(up.numel() == total && out.numel() == total, "swiglu: shape mismatch");
  cuda::launch_swiglu(f32(gate), f32(up), out.data, out.dtype, total, on_device().stream);
}

void CudaBackend::add_inplace(Tensor& x, const Tensor& y) {
  ATTNRES_CHECK(x.shape == y.shape && x.dtype == DType::F32 && y.dtype == DType::F32,
                "add_inplace x " + shape_str(x.shape) + " y " + shape_str(y.shape));
  check_cuda(x, "add_inplace x");
  check_cuda(y, "add_inplace y");
  cuda::launch_add_inplace(f32(x), f32(y), x.numel(), on_device().stream);
}

void CudaBackend::gather_rows(const Tensor& x, std::span<const int32_t> rows, Tensor& out) {
  Impl& im = on_device();
  ATTNRES_CHECK(x.rank() >= 1 && out.rank() >= 1 && x.dtype == out.dtype,
                "gather_rows x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  check_cuda(x, "gather_rows x");
  check_cuda(out, "gather_rows out");
  const int64_t r_dim = x.dim(0);
  const int64_t n_out = static_cast<int64_t>(rows.size());
  ATTNRES_CHECK(out.dim(0) == n_out &&
                    (r_dim == 0 || out.numel() / std::max<int64_t>(n_out, 1) == x.numel() / r_dim),
                "gather_rows x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  ATTNRES_CHECK(x.data != out.data || n_out == 0, "gather_rows: x and out must not alias");
  for (int64_t i = 0; i < n_out; ++i)
    ATTNRES_CHECK(rows[i] >= 0 && rows[i] < r_dim, "gather_rows: row " + std::to_string(rows[i]));
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
