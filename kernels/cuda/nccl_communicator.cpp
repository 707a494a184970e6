#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <string>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_backend.h"

namespace attnres {
namespace {

void nccl_check(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  throw Error(std::string("NCCL error in ") + call + " (" + file + ":" + std::to_string(line) +
              "): " + ncclGetErrorString(result));
}
#define NCCL_CHECK(call) nccl_check((call), #call, __FILE__, __LINE__)

void check_device_f32(const Tensor& t, const char* op) {
  if (t.device != Device::CUDA || t.dtype != DType::F32) {
    throw Error(std::string("NCCL ") + op + ": tensors must be f32 CUDA tensors");
  }
}

}  // namespace

struct NcclGroup::Impl {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::atomic<bool> aborted{false};
};

namespace {

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, NcclGroup::Impl& impl, int rank,
                   cudaStream_t stream)
      : group_(std::move(group)), impl_(impl), rank_(rank), stream_(stream) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(impl_.comms.size()); }
  std::string name() const override { return "nccl"; }

  void all_reduce_sum(Tensor& x) override {
    check_device_f32(x, "all_reduce_sum");
    check_alive();
    NCCL_CHECK(ncclAllReduce(x.data, x.data, static_cast<size_t>(x.numel()), ncclFloat, ncclSum,
                             comm(), stream_));
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    check_device_f32(in, "reduce_scatter_sum");
    check_device_f32(out, "reduce_scatter_sum");
    if (in.numel() != out.numel() * size()) {
      throw Error("reduce_scatter_sum: in has " + std::to_string(in.numel()) +
                  " elements, expected out's times the group size");
    }
    check_alive();
    NCCL_CHECK(ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()), ncclFloat,
                                 ncclSum, comm(), stream_));
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_device_f32(in, "all_gather");
    check_device_f32(out, "all_gather");
    if (out.numel() != in.numel() * size()) {
      throw Error("all_gather: out has " + std::to_string(out.numel()) +
                  " elements, expected in's times the group size");
    }
    check_alive();
    NCCL_CHECK(ncclAllGather(in.data, out.data, static_cast<size_t>(in.numel()), ncclFloat, comm(),
                             stream_));
  }

  void broadcast(Tensor& x, int root) override {
    check_device_f32(x, "broadcast");
    check_alive();
    NCCL_CHECK(ncclBroadcast(x.data, x.data, static_cast<size_t>(x.numel()), ncclFloat, root,
                             comm(), stream_));
  }

  void abort(const std::string& why) override {
    (void)why;
    // ncclCommAbort makes peers blocked in a collective with this rank return an error.
    if (!impl_.aborted.exchange(true)) {
      for (ncclComm_t c : impl_.comms) {
        if (c) ncclCommAbort(c);  // a process rank holds only its own
      }
      impl_.comms.assign(impl_.comms.size(), nullptr);
    }
  }

 private:
  ncclComm_t comm() const { return impl_.comms[rank_]; }
  void check_alive() const {
    if (impl_.aborted.load()) throw Error("tensor-parallel group aborted (NCCL)");
  }

  std::shared_ptr<NcclGroup> group_;  // keeps the communicators alive
  NcclGroup::Impl& impl_;
  int rank_;
  cudaStream_t stream_;
};

}  // namespace

std::shared_ptr<NcclGroup> NcclGroup::create(const std::vector<int>& devices) {
  if (devices.empty()) throw Error("NCCL group: no devices");
  auto impl = std::make_unique<Impl>();
  impl->devices = devices;
  impl->comms.resize(devices.size());
  NCCL_CHECK(ncclCommInitAll(impl->comms.data(), static_cast<int>(devices.size()), devices.data()));
  return std::shared_ptr<NcclGroup>(new NcclGroup(std::move(impl)));
}

std::shared_ptr<NcclGroup> NcclGroup::create_for_process(ProcessGroup& group, int device) {
  ncclUniqueId id{};
  if (group.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  group.broadcast_bytes(&id, sizeof(id), 0);
  auto impl = std::make_unique<Impl>();
  impl->devices.assign(group.size(), -1);
  impl->devices[group.rank()] = device;
  impl->comms.assign(group.size(), nullptr);
  if (cudaSetDevice(device) != cudaSuccess) {
    throw Error("NCCL: cannot use device " + std::to_string(device));
  }
  NCCL_CHECK(ncclCommInitRank(&impl->comms[group.rank()], group.size(), id, group.rank()));
  return std::shared_ptr<NcclGroup>(new NcclGroup(std::move(impl)));
}

NcclGroup::NcclGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NcclGroup::~NcclGroup() {
  for (ncclComm_t c : impl_->comms) {
    if (c) ncclCommDestroy(c);
  }
}

int NcclGroup::size() const { return static_cast<int>(impl_->comms.size()); }

std::unique_ptr<Communicator> NcclGroup::communicator(int rank, Backend& backend) {
  if (rank < 0 || rank >= size()) throw Error("NCCL group: rank out of range");
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) throw Error("NCCL needs the CUDA backend (--device cuda)");
  if (cuda->device_index() != impl_->devices[rank]) {
    throw Error("NCCL rank " + std::to_string(rank) + " drives device " +
                std::to_string(impl_->devices[rank]) + " but its backend is on device " +
                std::to_string(cuda->device_index()));
  }
  // The communicator keeps the group (and so every NCCL communicator) alive.
  return std::make_unique<NcclCommunicator>(shared_from_this(), *impl_, rank,
                                            reinterpret_cast<cudaStream_t>(cuda->stream()));
}

}  // namespace attnres
