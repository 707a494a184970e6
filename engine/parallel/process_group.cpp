#include "engine/parallel/process_group.h"

#include <atomic>

namespace attnres {
namespace {
std::atomic<ProcessGroup*> job_group{nullptr};
}  // namespace

ProcessGroup* job_process_group() { return job_group.load(); }
void set_job_process_group(ProcessGroup* group) { job_group.store(group); }

}  // namespace attnres
