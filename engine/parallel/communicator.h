// Collective communication between the ranks of a tensor-parallel group: the four collectives
// Megatron-style tensor and sequence parallelism need (docs/ATTNRES.md §4). Every rank of the
// group calls the same collective in the same order with tensors of the same shape; a call
// returns when this rank's output is complete.
//
// Conventions for every collective:
// - Tensors live on the rank's own device (the backend it computes with) and are f32,
//   contiguous, row-major. "Rows" are the first dimension.
// - Sums are taken in rank order (0, 1, ..., P-1) wherever the implementation controls the
//   order, so every rank ends with bitwise the same result (replicated activations stay
//   replicated).
// - A failure on any rank (an exception in its forward, a dead peer) must not leave the
//   others waiting forever: abort() wakes every rank blocked in a collective, which then
//   throws attnres::Error.
//
// Implementations: in_process_communicator.h (ranks are threads of one process on the CPU
// backend: the tests' and the CPU server's), kernels/cuda/nccl_communicator.h (one GPU per
// rank). Commands get a group through communicator_registry.h, by backend name.
#pragma once

#include <string>

#include "engine/core/tensor.h"

namespace attnres {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // x = sum over ranks of x, in place. Used after a row-parallel projection (o_proj,
  // down_proj) on the ordinary tensor-parallel path.
  virtual void all_reduce_sum(Tensor& x) = 0;

  // in [P * n, ...] on every rank; out [n, ...] = sum over ranks of in's rows
  // [rank * n, (rank + 1) * n). The sequence-parallel replacement of all_reduce_sum: the
  // same sum, but each rank keeps only its slice of the sequence.
  virtual void reduce_scatter_sum(const Tensor& in, Tensor& out) = 0;

  // in [n, ...] on every rank; out [P * n, ...] with rank q's rows at [q * n, (q + 1) * n).
  // in must not alias out.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;

  // x = root's x on every rank, in place.
  virtual void broadcast(Tensor& x, int root) = 0;

  // Makes every pending and future collective of this group throw (called when one rank
  // failed, so that the others do not wait for it forever). Safe from any thread.
  virtual void abort(const std::string& why) = 0;
};

}  // namespace attnres
