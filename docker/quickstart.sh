#!/usr/bin/env bash
# A newcomer's first command: install the build dependencies, build, and run the main job
# on the built-in demo model (or on --model DIR). Any arguments go to `attnres generate`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/docker/install-deps.sh"
"$repo/docker/build.sh"
exec "${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres" generate "$@"
