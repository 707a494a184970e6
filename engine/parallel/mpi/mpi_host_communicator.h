// The CPU backend's tensor-parallel communicator across processes: collectives on host f32
// tensors over MPI (the data communicator of an MpiProcessGroup). Sums are taken on every rank
// in rank order (0, 1, ..., P-1) after gathering the addends, so every rank ends with the same
// bits, and the same bits as the in-process group (in_process_communicator.h) would give.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "engine/parallel/communicator.h"

namespace attnres {

class MpiProcessGroup;

class MpiHostCommunicator : public Communicator {
 public:
  explicit MpiHostCommunicator(MpiProcessGroup& group);

  int rank() const override;
  int size() const override;
  std::string name() const override { return "mpi"; }

  void all_reduce_sum(Tensor& x) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& x, int root) override;
  // Makes this rank's waits throw (the group's failure does the same for every rank).
  void abort(const std::string& why) override;

 private:
  MpiProcessGroup& group_;
  std::atomic<bool> aborted_{false};
  std::vector<float> scratch_;  // the gathered addends of a sum
};

}  // namespace attnres
