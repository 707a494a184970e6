// The processes of a multi-process job: one tensor-parallel rank per process, started by a
// launcher (mpirun; the MPI group is engine/parallel/mpi/mpi_process_group.h). This interface is
// what the engine needs from the launcher, so engine/parallel does not depend on MPI.
//
// Rank 0 runs the command (the server: front ends, scheduler, sampling); it drives the other
// ranks with control messages (process_runner.h), and every rank computes its shard of each step.
// Liveness: every rank's watchdog expects a heartbeat from its peers (rank 0 from every rank, the
// others from rank 0); a rank that dies, hangs or reports a failure makes the group fail with a
// reason naming it, within the group's timeout. Then every wait of the group throws, and the
// failure listener is told once.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "engine/parallel/communicator.h"

namespace attnres {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's index among the ranks on its machine (its GPU), and how many there are (they
  // share its cores).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // "rank 1 (pid 1234 on host-b)", for logs and errors.
  virtual std::string describe(int rank) const = 0;

  // Rank 0 sends `message` to every other rank; each of them receives it into `message`.
  // Throws attnres::Error once the group has failed.
  virtual void broadcast_control(std::string& message) = 0;
  // `size` bytes from `root` to every rank (bootstrap data, e.g. NCCL's unique id).
  virtual void broadcast_bytes(void* data, size_t size, int root) = 0;
  // Waits until every rank has called it (throws attnres::Error once the group has failed).
  virtual void barrier() = 0;
  // Collectives between the processes on host f32 tensors (the CPU backend's communicator).
  virtual std::unique_ptr<Communicator> host_communicator() = 0;

  // This rank failed (its forward threw): its next heartbeat carries `why` to its peers.
  virtual void report_failure(const std::string& why) = 0;
  // Called once, on the watchdog's thread, when the group fails; must not block.
  virtual void set_failure_listener(std::function<void(const std::string& why)> listener) = 0;
  // Why the group failed; empty while every rank answers.
  virtual std::string failure() const = 0;
};

// The job's group when the process was started by a launcher with more than one rank (set once
// by main before any command runs); null otherwise.
ProcessGroup* job_process_group();
void set_job_process_group(ProcessGroup* group);

}  // namespace attnres
