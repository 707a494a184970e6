#!/usr/bin/env bash
# A newcomer's first command: install the build dependencies, build, and serve the built-in
# demo model (or --model DIR) on http://127.0.0.1:8000 and gRPC 127.0.0.1:50051.
# Any arguments go to `attnres serve`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/docker/install-deps.sh"
"$repo/docker/build.sh"
exec "${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres" serve "$@"
