#include "engine/parallel/mpi/mpi_process_group.h"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>

#include "engine/core/error.h"
#include "engine/parallel/mpi/mpi_host_communicator.h"

namespace attnres {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStatusBytes = 512;  // a heartbeat: this rank's status, NUL-terminated
constexpr auto kHeartbeatPeriod = std::chrono::milliseconds(200);

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 1 || parsed > 86400) {
    throw Error(std::string(name) + ": expected whole seconds in [1, 86400], got '" + value + "'");
  }
  return static_cast<int>(parsed);
}

}  // namespace

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    throw Error(std::string(what) + " failed: " + std::string(text, length));
  }
}

std::unique_ptr<MpiProcessGroup> MpiProcessGroup::join() {
  const int timeout_s = env_int("ATTNRES_RANK_TIMEOUT", kDefaultRankTimeoutSeconds);
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw Error(
        "this MPI library does not support MPI_THREAD_MULTIPLE, which the rank watchdog "
        "needs");
  }
  return std::unique_ptr<MpiProcessGroup>(
      new MpiProcessGroup(std::chrono::milliseconds(timeout_s * 1000)));
}

MpiProcessGroup::MpiProcessGroup(std::chrono::milliseconds timeout) : timeout_(timeout) {
  // Errors come back as codes (turned into attnres::Error), not as an abort of the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &control_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &data_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &heartbeat_), "MPI_Comm_dup");
  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);

  // Where every rank runs, for the errors that name one.
  std::array<char, 256> mine{};
  char host[128] = {};
  gethostname(host, sizeof(host) - 1);
  std::snprintf(mine.data(), mine.size(), "pid %d on %s", static_cast<int>(getpid()), host);
  std::vector<char> all(mine.size() * static_cast<size_t>(size_));
  check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(),
                          static_cast<int>(mine.size()), MPI_CHAR, MPI_COMM_WORLD),
            "MPI_Allgather");
  for (int r = 0; r < size_; ++r) where_.emplace_back(all.data() + mine.size() * r);

  watchdog_ = std::thread([this] { watch(); });
}

MpiProcessGroup::~MpiProcessGroup() {
  stopping_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  bool healthy = false;
  {
    std::lock_guard lock(mutex_);
    healthy = failure_.empty() && local_status_.empty();
  }
  if (!healthy) {
    std::cerr << std::flush;
    MPI_Abort(MPI_COMM_WORLD, 1);  // does not return
  }
  MPI_Comm_free(&heartbeat_);
  MPI_Comm_free(&data_);
  MPI_Comm_free(&control_);
  MPI_Finalize();
}

std::string MpiProcessGroup::describe(int rank) const {
  if (rank < 0 || rank >= size_) return "rank " + std::to_string(rank);
  return "rank " + std::to_string(rank) + " (" + where_[rank] + ")";
}

void MpiProcessGroup::wait(MPI_Request& request, const std::atomic<bool>* aborted) const {
  // Spin briefly (a collective between busy ranks completes within microseconds), then yield,
  // then sleep with a growing pause: at most 100 us while the wait is young (a worker waiting
  // for the next decode step must not add a millisecond to it), up to 1 ms once it has lasted
  // 50 ms (an idle server's workers then use no core).
  const Clock::time_point start = Clock::now();
  auto pause = std::chrono::microseconds(10);
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    if (failed_.load()) throw Error(failure());
    if (aborted && aborted->load()) throw Error("the tensor-parallel group was aborted");
    if (polls < 2000) continue;
    if (polls < 4000) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    const bool idle = Clock::now() - start > std::chrono::milliseconds(50);
    pause = std::min<std::chrono::microseconds>(
        pause * 2, idle ? std::chrono::microseconds(1000) : std::chrono::microseconds(100));
  }
}

void MpiProcessGroup::broadcast_control(std::string& message) {
  if (rank_ == 0) {
    uint64_t length = message.size();
    if (length > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      throw Error("control message too large");
    }
    std::vector<MPI_Request> requests;
    for (int r = 1; r < size_; ++r) {
      requests.emplace_back();
      check_mpi(MPI_Isend(&length, 1, MPI_UINT64_T, r, 0, control_, &requests.back()), "MPI_Isend");
      requests.emplace_back();
      check_mpi(MPI_Isend(message.data(), static_cast<int>(length), MPI_CHAR, r, 1, control_,
                          &requests.back()),
                "MPI_Isend");
    }
    for (MPI_Request& request : requests) wait(request);
    return;
  }
  uint64_t length = 0;
  MPI_Request request;
  check_mpi(MPI_Irecv(&length, 1, MPI_UINT64_T, 0, 0, control_, &request), "MPI_Irecv");
  wait(request);
  message.resize(static_cast<size_t>(length));
  check_mpi(MPI_Irecv(message.data(), static_cast<int>(length), MPI_CHAR, 0, 1, control_, &request),
            "MPI_Irecv");
  wait(request);
}

void MpiProcessGroup::broadcast_bytes(void* data, size_t size, int root) {
  if (size > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw Error("broadcast: too large");
  MPI_Request request;
  check_mpi(MPI_Ibcast(data, static_cast<int>(size), MPI_BYTE, root, control_, &request),
            "MPI_Ibcast");
  wait(request);
}

void MpiProcessGroup::barrier() {
  MPI_Request request;
  check_mpi(MPI_Ibarrier(control_, &request), "MPI_Ibarrier");
  wait(request);
}

std::unique_ptr<Communicator> MpiProcessGroup::host_communicator() {
  return std::make_unique<MpiHostCommunicator>(*this);
}

void MpiProcessGroup::report_failure(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (local_status_.empty()) local_status_ = why.substr(0, kStatusBytes - 1);
}

void MpiProcessGroup::set_failure_listener(std::function<void(const std::string&)> listener) {
  std::lock_guard lock(mutex_);
  listener_ = std::move(listener);
}

std::string MpiProcessGroup::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void MpiProcessGroup::fail(const std::string& why) {
  std::function<void(const std::string&)> listener;
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) return;
    failure_ = why;
    listener = listener_;
  }
  failed_ = true;
  std::cerr << "attnres: " << describe(rank_) << ": the tensor-parallel group failed: " << why
            << std::endl;
  if (listener) listener(why);
}

void MpiProcessGroup::watch() {
  // Rank 0 watches every rank; the others watch rank 0.
  std::vector<int> peers;
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) peers.push_back(r);
  } else {
    peers.push_back(0);
  }
  struct Peer {
    int rank;
    MPI_Request send = MPI_REQUEST_NULL, receive = MPI_REQUEST_NULL;
    std::array<char, kStatusBytes> out{}, in{};
    Clock::time_point last_heard;
  };
  std::vector<Peer> watched(peers.size());
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < peers.size(); ++i) {
    watched[i].rank = peers[i];
    watched[i].last_heard = start;
    MPI_Irecv(watched[i].in.data(), kStatusBytes, MPI_CHAR, peers[i], 0, heartbeat_,
              &watched[i].receive);
  }
  Clock::time_point next_send = start;
  while (!stopping_.load()) {
    const Clock::time_point now = Clock::now();
    if (now >= next_send) {
      std::string status;
      {
        std::lock_guard lock(mutex_);
        status = local_status_;
      }
      for (Peer& p : watched) {
        int done = 1;
        if (p.send != MPI_REQUEST_NULL) MPI_Test(&p.send, &done, MPI_STATUS_IGNORE);
        if (!done) continue;  // the last one is still on its way
        p.out.fill(0);
        std::memcpy(p.out.data(), status.data(), std::min<size_t>(status.size(), kStatusBytes - 1));
        MPI_Isend(p.out.data(), kStatusBytes, MPI_CHAR, p.rank, 0, heartbeat_, &p.send);
      }
      next_send = now + kHeartbeatPeriod;
    }
    for (Peer& p : watched) {
      int done = 0;
      MPI_Test(&p.receive, &done, MPI_STATUS_IGNORE);
      while (done) {
        p.last_heard = now;
        if (p.in[0] != '\0') {
          std::string reported(p.in.data());
          fail(reported.rfind("rank ", 0) == 0 ? reported : describe(p.rank) + ": " + reported);
        }
        MPI_Irecv(p.in.data(), kStatusBytes, MPI_CHAR, p.rank, 0, heartbeat_, &p.receive);
        MPI_Test(&p.receive, &done, MPI_STATUS_IGNORE);
      }
      if (now - p.last_heard > timeout_) {
        const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout_).count();
        fail(describe(p.rank) + " has not answered for " + std::to_string(seconds) +
             " s: it died or hangs");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Leave no request behind: cancel the receives; a send to a live peer completes, one to a dead
  // peer is dropped with the job (MPI_Abort).
  for (Peer& p : watched) {
    if (p.receive != MPI_REQUEST_NULL) {
      MPI_Cancel(&p.receive);
      MPI_Request_free(&p.receive);
    }
    if (p.send != MPI_REQUEST_NULL && failure().empty()) {
      const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);
      int done = 0;
      while (!done && Clock::now() < deadline) MPI_Test(&p.send, &done, MPI_STATUS_IGNORE);
      if (!done) MPI_Request_free(&p.send);
    }
  }
}

}  // namespace attnres
