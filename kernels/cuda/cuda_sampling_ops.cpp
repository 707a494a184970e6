// CudaBackend sampling (the kernels: cuda_sampling.cu).
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

// Backend::sample (cuda_sampling.cu). The parameters, ids and structured-output bitmasks (a
// few KB: a constrained row's logits never come back to the host) go up in one copy from the
// persistent pinned staging, the ids come back into it, and the call waits for them (the
// engine reads them next). No allocation once the staging has grown to the batch.
// Not capturable, and not meant to be (kernels/cuda/NOTES.md, "Sampling"): the decode graphs
// end before the LM head, and a graph would replay the parameters of the step it captured.
void CudaBackend::sample_impl(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) {
  queue_sample(logits, batch, out, 0, /*wait=*/true);
}

// The same queued work as sample(); the wait moves to wait_sampled(), so the host can prepare
// the next step while this one's forward and sampling run (async scheduling).
void CudaBackend::sample_async_impl(Tensor& logits, const SampleBatch& batch,
                                    std::span<int32_t> out) {
  queue_sample(logits, batch, out, 0, /*wait=*/false);
}

void CudaBackend::wait_sampled() {
  Impl& im = on_device();
  if (!im.sample_pending) return;
  im.sample_pending = false;
  CUDA_CHECK(cudaEventSynchronize(im.sample_ids_copied));
  std::memcpy(im.sample_out.data(), static_cast<char*>(im.sample_host.get()) + im.sample_out_offset,
              im.sample_out.size_bytes());
  im.sample_out = {};
}

// Runs the body without Backend::sample, so it checks the operands as that op does first.
void CudaBackend::sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out,
                         int ctas_per_row) {
  check_sample_operands(logits, batch, out);
  queue_sample(logits, batch, out, ctas_per_row, /*wait=*/true);
}

void CudaBackend::queue_sample(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out,
                               int ctas_per_row, bool wait) {
  // A call still in flight reads and writes the staging rewritten below: finish it first.
  wait_sampled();
  // Backend checked the shapes, the token ids and the bitmask rows (check_sample_operands).
  const int64_t rows = static_cast<int64_t>(batch.rows.size());
  check_cuda(logits, "sample: logits");
  const int64_t vocab = logits.dim(1);
  ATTNRES_CHECK(vocab > 0 && vocab < (int64_t{1} << 20),
                "sample: a vocabulary of " + std::to_string(vocab) +
                    " (the kernel's fixed-point masses need fewer than 2^20 ids)");
  if (rows == 0) return;
  // The id ranges the CPU's sample_row checks per row, here on the host before anything is
  // launched.
  const int64_t num_ids = static_cast<int64_t>(batch.token_ids.size());
  bool needs_counts = false;
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRow& row = batch.rows[r];
    for (auto [begin, count] : {std::pair{row.prompt_begin, row.prompt_count},
                                std::pair{row.output_begin, row.output_count},
                                std::pair{row.blocked_begin, row.blocked_count}}) {
      ATTNRES_CHECK(begin >= 0 && count >= 0 && int64_t{begin} + count <= num_ids,
                    "sample: ids [" + std::to_string(begin) + ", +" + std::to_string(count) +
                        ") outside the batch's " + std::to_string(num_ids) + " ids");
    }
    needs_counts = needs_counts || row.presence_penalty != 0.0f || row.frequency_penalty != 0.0f;
  }
  const int64_t bitmask_words = static_cast<int64_t>(batch.bitmask.size());
  Impl& im = on_device();
  ATTNRES_CHECK(!im.capturing(), "sample: cannot run inside a CUDA graph capture");
  if (ctas_per_row == 0) ctas_per_row = cuda::plan_sample_ctas_per_row(rows, vocab, im.sm_count);

  // Staging: grown (rarely), never shrunk. The last call was waited for, so nothing reads it.
  const cuda::SampleStagingLayout layout =
      cuda::sample_staging_layout(rows, num_ids, bitmask_words);
  if (layout.total_bytes > im.sample_host_bytes) {
    const size_t grown = cuda::grown_staging_bytes(im.sample_host_bytes, layout.total_bytes);
    im.sample_host.reset();  // freed first: the peak is the new one alone
    im.sample_host_bytes = 0;
    im.sample_host = im.pinned_host(grown);
    im.sample_host_bytes = grown;
  }
  if (layout.total_bytes > im.sample_device_bytes) {
    const size_t grown = cuda::grown_staging_bytes(im.sample_device_bytes, layout.total_bytes);
    im.sample_device = im.raw_alloc(grown);  // the old block returns to the cache
    im.sample_device_bytes = grown;
  }
  const size_t counts_bytes =
      needs_counts ? static_cast<size_t>(rows * vocab) * sizeof(int32_t) : 0;
  if (counts_bytes > im.sample_counts_bytes) {
    const size_t grown = cuda::grown_staging_bytes(im.sample_counts_bytes, counts_bytes);
    im.sample_counts = im.raw_alloc(grown);
    im.sample_counts_bytes = grown;
    CUDA_CHECK(cudaMemsetAsync(im.sample_counts.get(), 0, grown, im.stream));
  }

  char* host = static_cast<char*>(im.sample_host.get());
  char* device = static_cast<char*>(im.sample_device.get());
  std::memcpy(host, batch.rows.data(), batch.rows.size() * sizeof(SampleRow));
  if (num_ids) {
    std::memcpy(host + layout.ids_offset, batch.token_ids.data(),
                static_cast<size_t>(num_ids) * sizeof(int32_t));
  }
  if (bitmask_words) {
    std::memcpy(host + layout.bitmask_offset, batch.bitmask.data(),
                static_cast<size_t>(bitmask_words) * sizeof(int32_t));
  }
  CUDA_CHECK(cudaMemcpyAsync(device, host, layout.upload_bytes, cudaMemcpyHostToDevice, im.stream));
  // Null until a call has a penalty row: only such rows read counts.
  int32_t* counts = static_cast<int32_t*>(im.sample_counts.get());
  cuda::launch_sample(
      f32(logits), rows, vocab, batch.decodable, reinterpret_cast<const SampleRow*>(device),
      reinterpret_cast<const int32_t*>(device + layout.ids_offset),
      reinterpret_cast<const int32_t*>(device + layout.bitmask_offset), counts,
      reinterpret_cast<int32_t*>(device + layout.out_offset), ctas_per_row, im.stream);
  const size_t out_bytes = static_cast<size_t>(rows) * sizeof(int32_t);
  CUDA_CHECK(cudaMemcpyAsync(host + layout.out_offset, device + layout.out_offset, out_bytes,
                             cudaMemcpyDeviceToHost, im.stream));
  if (!wait) {
    CUDA_CHECK(cudaEventRecord(im.sample_ids_copied, im.stream));
    im.sample_out = out;
    im.sample_out_offset = layout.out_offset;
    im.sample_pending = true;
    return;
  }
  CUDA_CHECK(cudaStreamSynchronize(im.stream));
  std::memcpy(out.data(), host + layout.out_offset, out_bytes);
}

}  // namespace attnres
