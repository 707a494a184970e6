#!/usr/bin/env bash
# Sanitizer runs (tests/sanitizers/README.md):
#   tests/sanitizers/run.sh asan   ASan + UBSan build of everything (build-asan/): the whole
#                                  C++ suite, then the server's end-to-end tests against it
#   tests/sanitizers/run.sh tsan   TSan build (build-tsan/) of the engine loop, scheduler,
#                                  streams, the HTTP / gRPC front ends' and the CPU
#                                  backend thread pool's tests
# Extra arguments go to pytest (asan). A report fails the run: halt_on_error / abort.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
kind=${1:?usage: tests/sanitizers/run.sh asan|tsan [pytest args]}
shift
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
configure() {  # build dir, sanitizers
  cmake -S "$repo" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNRES_SANITIZE="$2" \
    -DATTNRES_ENABLE_CUDA=OFF "${launcher[@]}" >/dev/null
}
case "$kind" in
  asan)
    build=${ATTNRES_ASAN_BUILD_DIR:-$repo/build-asan}
    configure "$build" address,undefined
    cmake --build "$build" -j "$(nproc)"
    export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
    # The end-to-end tests that drive the server hardest: every request path, bad input,
    # disconnects, fault isolation, prefix caching. The server's exit code is checked by
    # each test, so a sanitizer report at shutdown fails it.
    python=${PYTHON:-$repo/.venv/bin/python}
    ATTNRES_BUILD_DIR="$build" "$python" -m pytest -q -p no:cacheprovider \
      "$repo/tests/python/test_http_api.py" "$repo/tests/python/test_http_errors.py" \
      "$repo/tests/python/test_http_limits.py" \
      "$repo/tests/python/test_grpc_api.py" "$repo/tests/python/test_fault_isolation.py" \
      "$repo/tests/python/test_prefix_caching.py" "$repo/tests/python/test_server_operations.py" "$@"
    ;;
  tsan)
    build=${ATTNRES_TSAN_BUILD_DIR:-$repo/build-tsan}
    configure "$build" thread
    # The threaded parts: engine thread vs front-end threads, streams, shutdown, the shared
    # front-end pipeline (Generation), the HTTP server in process (connections, request
    # workers, the engine's wake-ups; Boost.Asio is header-only, so instrumented) and gRPC;
    # and the CPU backend's thread pool (kernels/cpu/worker_pool.h: plain std::thread and
    # std::atomic, so fully instrumented since it replaced OpenMP).
    cmake --build "$build" -j "$(nproc)" --target attnres_scheduler_tests attnres_http_tests \
      attnres_grpc_tests attnres_server_common_tests attnres_worker_pool_tests
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
    # Every test of those five executables (the others are not built here), except the
    # health service's: they run a real gRPC server, and Debian's libgrpc / libabsl are not
    # TSan-instrumented, so their own (correctly locked) internals report hundreds of races.
    ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -E '_NOT_BUILT$|^HealthServiceTest[.]'
    ;;
  *)
    echo "usage: tests/sanitizers/run.sh asan|tsan [pytest args]" >&2
    exit 2
    ;;
esac
