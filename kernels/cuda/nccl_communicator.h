// The tensor-parallel group on GPUs: one NCCL communicator per rank, each rank a thread of this
// process driving its own GPU through its CudaBackend (ncclCommInitAll: NCCL reaches every GPU
// of the machine over NVLink / PCIe), or one rank per process of an mpirun job
// (create_for_process: the unique id broadcast over MPI, then ncclCommInitRank; NCCL reaches
// GPUs of other machines over the network). Every collective is queued on the rank's backend
// stream, so it orders with the kernels around it without host synchronisation.
//
// Part of attnres_kernels_cuda when NCCL is found (ATTNRES_HAVE_NCCL); register_cuda_backend()
// registers it as the "cuda" communicator group (engine/parallel/communicator_registry.h), which
// is how commands get it. A plain C++ header, usable from g++-compiled code.
#pragma once

#include <memory>
#include <vector>

#include "engine/core/backend.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/process_group.h"

namespace attnres {

class NcclGroup : public std::enable_shared_from_this<NcclGroup> {
 public:
  // One communicator per device in `devices` (rank r drives devices[r]). Throws attnres::Error
  // naming the NCCL error.
  static std::shared_ptr<NcclGroup> create(const std::vector<int>& devices);
  // This process's rank of a multi-process job (one GPU per process, process_group.h): rank 0
  // makes the NCCL unique id, the group broadcasts it, and every rank joins with
  // ncclCommInitRank on `device` (made current on the calling thread). Only communicator(
  // group.rank(), ...) is valid on the result.
  static std::shared_ptr<NcclGroup> create_for_process(ProcessGroup& group, int device);
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
