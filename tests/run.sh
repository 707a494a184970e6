#!/usr/bin/env bash
# The test command: installs what the tests need (Debian packages, and the Python test
# packages into .venv/; both steps are no-ops once done), builds everything, then runs the
# C++ tests (ctest), every fuzzer briefly, the threaded parts under TSan, and the Python
# tests (pytest: the independent references and the end-to-end tests against the real
# binaries). Arguments go to pytest.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export ATTNRES_BUILD_DIR=${ATTNRES_BUILD_DIR:-$repo/build}
"$repo/docker/install-deps.sh" --tests
"$repo/docker/build.sh"
python=${PYTHON:-$repo/.venv/bin/python}
ctest --test-dir "$ATTNRES_BUILD_DIR" --output-on-failure -j "$(nproc)"
# Every fuzzer for 10 s (tests/fuzz/README.md; longer runs: docs/RELIABILITY.md), and the
# engine loop, streams and front-end units under ThreadSanitizer. (The ASan + UBSan run,
# tests/sanitizers/run.sh asan, is by hand: ~30 min on 2 cores.)
"$repo/tests/fuzz/run.sh" "${ATTNRES_FUZZ_SECONDS:-10}"
"$repo/tests/sanitizers/run.sh" tsan
cd "$repo" && "$python" -m pytest tests/python -q -p no:cacheprovider "$@"
