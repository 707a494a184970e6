// `attnres` started by mpirun with several ranks (one tensor-parallel rank per process): rank 0
// runs the command, whose model runs on every rank (engine/runner/process_runner.h); the other
// ranks obey rank 0 until it says Exit. Without a launcher (or with one rank), the command just
// runs.
#pragma once

#include <functional>
#include <string>

namespace attnres::cli {

// Runs `command` (the body of main) as this process's rank requires; returns the exit status.
int run_in_process_job(const std::string& command, const std::function<int()>& run);

// True when an MPI launcher started this process with more than one rank (Open MPI's
// OMPI_COMM_WORLD_SIZE, or PMI_SIZE / PMIX_SIZE).
bool launched_with_several_ranks();

}  // namespace attnres::cli
