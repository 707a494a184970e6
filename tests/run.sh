#!/usr/bin/env bash
# Builds everything, then runs the C++ tests (ctest) and the Python tests (pytest: the
# independent references and the end-to-end tests against the real binaries).
# Needs `docker/install-deps.sh --tests` once (CI runs it first).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export ATTNRES_BUILD_DIR=${ATTNRES_BUILD_DIR:-$repo/build}
"$repo/docker/build.sh"
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || { echo "no $python: run docker/install-deps.sh --tests first" >&2; exit 1; }
ctest --test-dir "$ATTNRES_BUILD_DIR" --output-on-failure -j "$(nproc)"
cd "$repo" && "$python" -m pytest tests/python -q -p no:cacheprovider "$@"
