#!/usr/bin/env bash
# Installs what building (and, with --tests, testing) AttnRes Serve needs on Debian 12.
# Shared by CI (.ci/run), the Dockerfiles and a newcomer's first command.
#   docker/install-deps.sh           build dependencies (Debian packages)
#   docker/install-deps.sh --tests   also the Python test dependencies, in .venv/
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

packages=(build-essential cmake ninja-build pkg-config git
          nlohmann-json3-dev libutf8proc-dev libgtest-dev libgmock-dev
          libcpp-httplib-dev libgrpc++-dev libprotobuf-dev protobuf-compiler
          protobuf-compiler-grpc)

sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${1:-}" = "--tests" ]; then
  # A virtual environment keeps the test packages off the system Python (PEP 668).
  if [ ! -x "$repo/.venv/bin/python" ]; then
    python3 -m venv "$repo/.venv" 2>/dev/null || {
      echo "python3 -m venv failed; installing python3-venv" >&2
      DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq python3-venv
      python3 -m venv "$repo/.venv"
    }
  fi
  "$repo/.venv/bin/python" -m pip install -q --upgrade pip
  "$repo/.venv/bin/python" -m pip install -q -r "$repo/tests/requirements.txt"
fi
