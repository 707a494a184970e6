// A tensor-parallel group whose ranks are threads of this process, each computing with its
// own CPU backend: how the CPU server runs --tensor-parallel-size N, and how every
// tensor-parallel and sequence-parallel test runs without GPUs.
//
// The ranks exchange pointers to their tensors through the shared group, wait at a barrier,
// then each rank does its own share of the work directly in the others' memory (for a sum,
// rank r adds up element chunk r of every rank's tensor, in rank order, so the result is the
// same bits on every rank). Barriers wait on a condition variable, not by spinning: with
// more ranks than cores a spinning rank would starve the one it waits for.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/parallel/communicator.h"

namespace attnres {

class InProcessGroup : public std::enable_shared_from_this<InProcessGroup> {
 public:
  // One group of `size` ranks; make one communicator per rank with communicator().
  static std::shared_ptr<InProcessGroup> create(int size);

  int size() const { return size_; }
  // The communicator rank `rank` uses (from its own thread).
  std::unique_ptr<Communicator> communicator(int rank);
  void abort(const std::string& why);

  // --- used by the communicators ---
  // Every rank posts one pointer and an element count; returns once all have (throws when
  // the group was aborted, or when the ranks disagree on the count: a bug).
  void post_and_wait(int rank, const char* op, void* data, int64_t count);
  // A plain barrier (throws when the group was aborted).
  void barrier();
  float* posted(int rank) const { return static_cast<float*>(slots_[rank]); }

 private:
  explicit InProcessGroup(int size);

  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<void*> slots_;
  std::vector<int64_t> counts_;
  std::vector<const char*> ops_;
};

}  // namespace attnres
