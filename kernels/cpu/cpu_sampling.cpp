// CpuBackend::sample: Backend::sample on the host's cores. Each row runs sample_row
// (engine/sample/sample_row.h), the host Sampler's own pipeline (structured-output masks
// included), so sampling "on the device" with the CPU backend picks bit for bit what the
// engine's host path picks; rows are spread over the worker pool (a row is one task:
// 0.1-0.5 ms at a vocabulary of 151936).
#include <algorithm>
#include <string>

#include "engine/core/error.h"
#include "engine/core/sample_bitmask.h"
#include "engine/sample/sample_row.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres {

void CpuBackend::sample_impl(Tensor& logits, const SampleBatch& batch, std::span<int32_t> out) {
  const int64_t rows = static_cast<int64_t>(batch.rows.size());
  cpu::check_on_cpu(logits, "sample: logits");
  if (rows == 0) return;
  const int64_t vocab = logits.dim(1);  // Backend checked the bitmask rows against it
  float* data = logits.ptr<float>();
  // One row per claim: rows cost the same order of time, and there are few of them.
  cpu::DynamicSchedule schedule(rows, 1);
  const int team = static_cast<int>(std::min<int64_t>(rows, threads_));
  pool_->run(team, [&](int, int) {
    // Per OS thread, kept across calls: vocabulary-sized, and all zero between rows.
    thread_local SampleRowScratch scratch;
    for (int64_t r : schedule.claims()) {
      out[r] = sample_row(std::span<float>(data + r * vocab, static_cast<size_t>(vocab)),
                          batch.rows[r], batch.token_ids, batch.decodable, scratch,
                          sample_row_bitmask(batch, batch.rows[r], vocab));
    }
  });
}

}  // namespace attnres
