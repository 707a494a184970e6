#include "engine/parallel/mpi/mpi_host_communicator.h"

#include <cstring>
#include <limits>

#include "engine/core/error.h"
#include "engine/parallel/mpi/mpi_process_group.h"

namespace attnres {
namespace {

void check_host_f32(const Tensor& t, const char* op, const char* what) {
  if (t.device != Device::CPU || t.dtype != DType::F32) {
    throw Error(std::string("MPI communicator ") + op + ": " + what + " must be an f32 CPU tensor");
  }
}

int mpi_count(int64_t n, const char* op) {
  if (n > std::numeric_limits<int>::max()) {
    throw Error(std::string("MPI communicator ") + op + ": more than 2^31 elements");
  }
  return static_cast<int>(n);
}

// dst[i] = addends[0][i] + addends[1][i] + ... in rank order; addends is [P][n].
void sum_in_rank_order(const std::vector<float>& addends, int64_t n, int P, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    float acc = addends[i];
    for (int q = 1; q < P; ++q) acc += addends[q * n + i];
    dst[i] = acc;
  }
}

}  // namespace

MpiHostCommunicator::MpiHostCommunicator(MpiProcessGroup& group) : group_(group) {}

int MpiHostCommunicator::rank() const { return group_.rank(); }
int MpiHostCommunicator::size() const { return group_.size(); }

void MpiHostCommunicator::all_reduce_sum(Tensor& x) {
  check_host_f32(x, "all_reduce_sum", "x");
  const int P = size();
  const int64_t n = x.numel();
  scratch_.resize(static_cast<size_t>(n * P));
  MPI_Request request;
  check_mpi(MPI_Iallgather(x.data, mpi_count(n, "all_reduce_sum"), MPI_FLOAT, scratch_.data(),
                           static_cast<int>(n), MPI_FLOAT, group_.data_comm(), &request),
            "MPI_Iallgather");
  group_.wait(request, &aborted_);
  sum_in_rank_order(scratch_, n, P, x.ptr<float>());
}

void MpiHostCommunicator::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  check_host_f32(in, "reduce_scatter_sum", "in");
  check_host_f32(out, "reduce_scatter_sum", "out");
  const int P = size();
  const int64_t n = out.numel();
  if (in.numel() != n * P) {
    throw Error("reduce_scatter_sum: in has " + std::to_string(in.numel()) +
                " elements, expected " + std::to_string(n * P) + " (out's times the group size)");
  }
  // Rank q's block r goes to rank r: each rank receives its block from every rank, in order.
  scratch_.resize(static_cast<size_t>(n * P));
  MPI_Request request;
  check_mpi(MPI_Ialltoall(in.data, mpi_count(n, "reduce_scatter_sum"), MPI_FLOAT, scratch_.data(),
                          static_cast<int>(n), MPI_FLOAT, group_.data_comm(), &request),
            "MPI_Ialltoall");
  group_.wait(request, &aborted_);
  sum_in_rank_order(scratch_, n, P, out.ptr<float>());
}

void MpiHostCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_host_f32(in, "all_gather", "in");
  check_host_f32(out, "all_gather", "out");
  const int64_t n = in.numel();
  if (out.numel() != n * size()) {
    throw Error("all_gather: out has " + std::to_string(out.numel()) + " elements, expected " +
                std::to_string(n * size()) + " (in's times the group size)");
  }
  MPI_Request request;
  check_mpi(MPI_Iallgather(in.data, mpi_count(n, "all_gather"), MPI_FLOAT, out.data,
                           static_cast<int>(n), MPI_FLOAT, group_.data_comm(), &request),
            "MPI_Iallgather");
  group_.wait(request, &aborted_);
}

void MpiHostCommunicator::broadcast(Tensor& x, int root) {
  check_host_f32(x, "broadcast", "x");
  if (root < 0 || root >= size()) throw Error("broadcast: root " + std::to_string(root));
  MPI_Request request;
  check_mpi(MPI_Ibcast(x.data, mpi_count(x.numel(), "broadcast"), MPI_FLOAT, root,
                       group_.data_comm(), &request),
            "MPI_Ibcast");
  group_.wait(request, &aborted_);
}

void MpiHostCommunicator::abort(const std::string& why) {
  (void)why;  // the group's failure carries the reason
  aborted_ = true;
}

}  // namespace attnres
