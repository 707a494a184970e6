#include "engine/parallel/in_process_communicator.h"

#include <algorithm>
#include <cstring>

#include "engine/core/error.h"

namespace attnres {
namespace {

// Element range [begin, end) of chunk `part` when n elements are split into `parts` chunks.
std::pair<int64_t, int64_t> chunk(int64_t n, int part, int parts) {
  return {n * part / parts, n * (part + 1) / parts};
}

void check_cpu_f32(const Tensor& t, const char* op, const char* what) {
  if (t.device != Device::CPU || t.dtype != DType::F32) {
    throw Error(std::string("in-process communicator ") + op + ": " + what +
                " must be an f32 CPU tensor");
  }
}

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string name() const override { return "in-process"; }

  void all_reduce_sum(Tensor& x) override {
    check_cpu_f32(x, "all_reduce_sum", "x");
    const int P = size();
    const int64_t n = x.numel();
    group_->post_and_wait(rank_, "all_reduce_sum", x.data, n);
    // Phase 1: this rank sums its element chunk over all ranks into its own tensor (nobody
    // else reads or writes that chunk of anybody's tensor in this phase).
    const auto [begin, end] = chunk(n, rank_, P);
    float* mine = x.ptr<float>();
    for (int64_t i = begin; i < end; ++i) {
      float acc = group_->posted(0)[i];
      for (int q = 1; q < P; ++q) acc += group_->posted(q)[i];
      mine[i] = acc;
    }
    group_->barrier();
    // Phase 2: copy the other chunks from the ranks that own them.
    for (int q = 0; q < P; ++q) {
      if (q == rank_) continue;
      const auto [b, e] = chunk(n, q, P);
      std::memcpy(mine + b, group_->posted(q) + b, static_cast<size_t>(e - b) * sizeof(float));
    }
    group_->barrier();  // nobody returns (and reuses its tensor) while others still read it
  }

  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    check_cpu_f32(in, "reduce_scatter_sum", "in");
    check_cpu_f32(out, "reduce_scatter_sum", "out");
    const int P = size();
    const int64_t n = out.numel();
    if (in.numel() != n * P) {
      throw Error("reduce_scatter_sum: in has " + std::to_string(in.numel()) +
                  " elements, expected " + std::to_string(n * P) + " (out's times the group size)");
    }
    group_->post_and_wait(rank_, "reduce_scatter_sum", in.data, in.numel());
    float* dst = out.ptr<float>();
    const int64_t offset = n * rank_;
    for (int64_t i = 0; i < n; ++i) {
      float acc = group_->posted(0)[offset + i];
      for (int q = 1; q < P; ++q) acc += group_->posted(q)[offset + i];
      dst[i] = acc;
    }
    group_->barrier();
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    check_cpu_f32(in, "all_gather", "in");
    check_cpu_f32(out, "all_gather", "out");
    const int P = size();
    const int64_t n = in.numel();
    if (out.numel() != n * P) {
      throw Error("all_gather: out has " + std::to_string(out.numel()) + " elements, expected " +
                  std::to_string(n * P) + " (in's times the group size)");
    }
    group_->post_and_wait(rank_, "all_gather", in.data, n);
    float* dst = out.ptr<float>();
    for (int q = 0; q < P; ++q) {
      std::memcpy(dst + n * q, group_->posted(q), static_cast<size_t>(n) * sizeof(float));
    }
    group_->barrier();
  }

  void broadcast(Tensor& x, int root) override {
    check_cpu_f32(x, "broadcast", "x");
    if (root < 0 || root >= size()) throw Error("broadcast: root " + std::to_string(root));
    group_->post_and_wait(rank_, "broadcast", x.data, x.numel());
    if (rank_ != root) {
      std::memcpy(x.data, group_->posted(root), x.nbytes());
    }
    group_->barrier();
  }

  void abort(const std::string& why) override { group_->abort(why); }

 private:
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
};

}  // namespace

std::shared_ptr<InProcessGroup> InProcessGroup::create(int size) {
  if (size < 1) throw Error("tensor-parallel group size must be >= 1, got " + std::to_string(size));
  return std::shared_ptr<InProcessGroup>(new InProcessGroup(size));
}

InProcessGroup::InProcessGroup(int size)
    : size_(size), slots_(size, nullptr), counts_(size, 0), ops_(size, nullptr) {}

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  ATTNRES_CHECK(rank >= 0 && rank < size_, "rank out of range");
  return std::make_unique<InProcessCommunicator>(shared_from_this(), rank);
}

void InProcessGroup::abort(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = why;
  }
  changed_.notify_all();
}

void InProcessGroup::barrier() {
  std::unique_lock lock(mutex_);
  if (aborted_) throw Error("tensor-parallel group aborted: " + abort_reason_);
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    changed_.notify_all();
    return;
  }
  changed_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation) throw Error("tensor-parallel group aborted: " + abort_reason_);
}

void InProcessGroup::post_and_wait(int rank, const char* op, void* data, int64_t count) {
  {
    std::lock_guard lock(mutex_);
    slots_[rank] = data;
    counts_[rank] = count;
    ops_[rank] = op;
  }
  barrier();
  // After the barrier every rank has posted and nobody posts again before the next barrier.
  for (int q = 0; q < size_; ++q) {
    if (counts_[q] != count || std::strcmp(ops_[q], op) != 0) {
      const std::string why = std::string("ranks disagree: rank ") + std::to_string(rank) + " " +
                              op + " of " + std::to_string(count) + " elements, rank " +
                              std::to_string(q) + " " + ops_[q] + " of " +
                              std::to_string(counts_[q]);
      abort(why);
      throw Error("tensor-parallel group aborted: " + why);
    }
  }
}

}  // namespace attnres
