// The tensor-parallel group on GPUs: one NCCL communicator per rank, each rank a thread of this
// process driving its own GPU through its CudaBackend (ncclCommInitAll: NCCL reaches every GPU
// of the machine over NVLink / PCIe). Every collective is queued on the rank's backend stream,
// so it orders with the kernels around it without host synchronisation.
//
// Part of attnres_kernels_cuda when NCCL is found (ATTNRES_HAVE_NCCL); register_cuda_backend()
// registers it as the "cuda" communicator group (engine/parallel/communicator_registry.h), which
// is how commands get it. A plain C++ header, usable from g++-compiled code.
#pragma once

#include <memory>
#include <vector>

#include "engine/core/backend.h"
#include "engine/parallel/communicator.h"

namespace attnres {

class NcclGroup : public std::enable_shared_from_this<NcclGroup> {
 public:
  // One communicator per device in `devices` (rank r drives devices[r]). Throws attnres::Error
  // naming the NCCL error.
  static std::shared_ptr<NcclGroup> create(const std::vector<int>& devices);
  ~NcclGroup();

  int size() const;
  // Rank `rank`'s communicator; `backend` must be the CudaBackend of devices[rank], created on
  // the calling thread (the collectives run on its stream).
  std::unique_ptr<Communicator> communicator(int rank, Backend& backend);

  struct Impl;

 private:
  explicit NcclGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres
