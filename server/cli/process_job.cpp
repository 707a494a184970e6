#include "server/cli/process_job.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "engine/core/error.h"
#include "engine/runner/process_control.h"
#include "engine/sched/model_execution.h"
#ifdef ATTNRES_HAVE_MPI
#include "engine/parallel/mpi/mpi_process_group.h"
#endif

namespace attnres::cli {

bool launched_with_several_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* value = std::getenv(name); value && std::atoi(value) > 1) return true;
  }
  return false;
}

#ifdef ATTNRES_HAVE_MPI
namespace {

// When a rank dies, Open MPI's mpirun signals the others odls_base_sigkill_timeout seconds
// later (default 1): rank 0 must get the time to notice (the rank timeout) and fail its requests
// with an error naming the dead rank.
void warn_if_mpirun_kills_first(const MpiProcessGroup& group) {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return;  // not Open MPI
  const char* value = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  const long sigkill_s = value ? std::strtol(value, nullptr, 10) : 1;
  const long timeout_s = std::chrono::duration_cast<std::chrono::seconds>(group.timeout()).count();
  if (sigkill_s > timeout_s + 1) return;
  std::cerr << "attnres: warning: mpirun's odls_base_sigkill_timeout (" << sigkill_s
            << " s) is not longer than the rank timeout (" << timeout_s
            << " s): if a rank dies, mpirun kills this one before it can fail its requests with "
               "an error; launch with --mca odls_base_sigkill_timeout "
            << timeout_s + 5 << " (docs/PARALLELISM.md)\n";
}

// "rank 0 (pid 10 on a), rank 1 (pid 11 on b)": where every rank runs, for the operator.
std::string describe_ranks(const ProcessGroup& group) {
  std::string out;
  for (int r = 0; r < group.size(); ++r) out += (r ? ", " : "") + group.describe(r);
  return out;
}

}  // namespace

int run_in_process_job(const std::string& command, const std::function<int()>& run) {
  if (!launched_with_several_ranks()) return run();
  std::unique_ptr<MpiProcessGroup> group;
  try {
    group = MpiProcessGroup::join();
  } catch (const std::exception& e) {
    std::cerr << "attnres " << command << ": error: " << e.what() << "\n";
    return 1;
  }
  set_job_process_group(group.get());
  int status = 0;
  if (group->rank() != 0) {
    // Rank 0 decides when the job ends (it drains on SIGTERM, then says Exit); mpirun forwards
    // a signal to every rank, and a worker that left first would fail rank 0's last steps.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    status = run_process_rank(*group);
  } else {
    std::cerr << "attnres: " << group->size() << " processes: " << describe_ranks(*group) << "\n";
    warn_if_mpirun_kills_first(*group);
    status = run();
    if (group->failure().empty()) {
      try {
        std::string exit = encode_simple(ControlKind::Exit);
        group->broadcast_control(exit);
      } catch (const std::exception& e) {
        std::cerr << "attnres " << command << ": error: " << e.what() << "\n";
      }
    }
    if (!group->failure().empty() && status == 0) status = 1;
  }
  set_job_process_group(nullptr);
  group.reset();  // MPI_Finalize, or MPI_Abort when the group failed
  return status;
}

#else

int run_in_process_job(const std::string& command, const std::function<int()>& run) {
  if (launched_with_several_ranks()) {
    std::cerr << "attnres " << command
              << ": error: started by mpirun with several ranks, but this build has no MPI "
                 "(install libopenmpi-dev and rebuild)\n";
    return 1;
  }
  return run();
}

#endif

}  // namespace attnres::cli
