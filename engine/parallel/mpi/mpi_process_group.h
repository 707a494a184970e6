// The ProcessGroup (engine/parallel/process_group.h) of a job started by an MPI launcher
// (Open MPI's mpirun, from Debian: `mpirun -np N attnres serve ... --tensor-parallel-size N`,
// with a hostfile across machines). Its own library, attnres_mpi, built when CMake finds MPI.
//
// Three duplicates of MPI_COMM_WORLD keep the traffic apart: control (rank 0's messages to the
// others), data (the host collectives of the CPU backend's communicator) and heartbeat (the
// watchdog thread's; MPI_THREAD_MULTIPLE is required). Every wait polls its request with
// MPI_Test, spinning briefly, then yielding, then sleeping (up to 100 us, up to 1 ms once the
// wait has lasted 50 ms): an idle worker costs nothing, more ranks than cores still make
// progress, and a wait gives up (throws) as soon as the group has failed, which blocking MPI
// calls cannot.
//
// The watchdog: each rank sends a heartbeat every 200 ms (rank 0 to every rank, the others to
// rank 0) carrying its status: empty, or the failure it reported. A peer whose heartbeat is
// older than the timeout (ATTNRES_RANK_TIMEOUT seconds, default 5) or that reported a failure
// fails the group, with a reason that names it ("rank 1 (pid 4242 on node-b) ...").
//
// When a rank dies, Open MPI's mpirun signals the others after odls_base_sigkill_timeout
// seconds (default 1), before rank 0's watchdog could fail its requests with a clear error:
// launch with `--mca odls_base_sigkill_timeout 10` (longer than the rank timeout; rank 0 warns
// otherwise). Its recovery mode (orte_enable_recovery) would keep rank 0 alive too, but then
// mpirun exits 0 whatever happened, which hides the failure from a supervisor.
// docs/PARALLELISM.md.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "engine/parallel/process_group.h"

namespace attnres {

constexpr int kDefaultRankTimeoutSeconds = 5;

// Throws attnres::Error "<what> failed: <MPI's error string>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* what);

class MpiProcessGroup : public ProcessGroup {
 public:
  // Initialises MPI and joins the job (call it only when a launcher started this process).
  // Throws attnres::Error when MPI cannot give the thread support the watchdog needs, or
  // ATTNRES_RANK_TIMEOUT is malformed.
  static std::unique_ptr<MpiProcessGroup> join();

  // Stops the watchdog, then MPI_Finalize when the group is healthy, or MPI_Abort with status 1
  // when it failed (finalizing would wait for the dead rank).
  ~MpiProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string describe(int rank) const override;

  void broadcast_control(std::string& message) override;
  void broadcast_bytes(void* data, size_t size, int root) override;
  void barrier() override;
  std::unique_ptr<Communicator> host_communicator() override;

  void report_failure(const std::string& why) override;
  void set_failure_listener(std::function<void(const std::string&)> listener) override;
  std::string failure() const override;

  // Waits for `request`, polling; throws attnres::Error once the group has failed or `aborted`
  // (when given) is set. Used by the host communicator too.
  void wait(MPI_Request& request, const std::atomic<bool>* aborted = nullptr) const;
  MPI_Comm data_comm() const { return data_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  MpiProcessGroup(std::chrono::milliseconds timeout);
  void watch();  // the watchdog thread
  void fail(const std::string& why);

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::vector<std::string> where_;  // per rank: "pid N on HOST"
  MPI_Comm control_ = MPI_COMM_NULL, data_ = MPI_COMM_NULL, heartbeat_ = MPI_COMM_NULL;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mutex_;
  std::string failure_;       // guarded by mutex_
  std::string local_status_;  // what this rank reported (guarded by mutex_)
  std::function<void(const std::string&)> listener_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> stopping_{false};
  std::thread watchdog_;
};

}  // namespace attnres
