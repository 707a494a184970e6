#!/usr/bin/env bash
# Installs what building (and, with --tests, testing) AttnRes Serve needs on Debian 12.
# Shared by CI (.ci/run), the Dockerfiles and a newcomer's first command.
#   docker/install-deps.sh           build dependencies (Debian packages)
#   docker/install-deps.sh --tests   also what the tests need: Clang with libFuzzer (tests/fuzz),
#                                    and the Python test packages, in .venv/
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

packages=(build-essential cmake ninja-build pkg-config git
          nlohmann-json3-dev libutf8proc-dev libgtest-dev libgmock-dev libcli11-dev
          libcpp-httplib-dev libboost-dev libpng-dev libgrpc++-dev libprotobuf-dev
          protobuf-compiler
          protobuf-compiler-grpc
          curl ca-certificates  # install-xgrammar.sh fetches xgrammar's sdist from PyPI
          libopenmpi-dev openmpi-bin)  # mpirun: one tensor-parallel rank per process
# The fuzzers (tests/fuzz) build with Clang's libFuzzer runtime. (No OpenMP: the CPU backend
# has its own worker pool, kernels/cpu/worker_pool.h.) The web playground's tests run it in
# Debian's browsers: Chromium through its chromedriver (Selenium), firefox-esr over WebDriver
# BiDi (tests/python/test_web_ui*.py).
test_packages=(clang libclang-rt-14-dev chromium chromium-driver firefox-esr)

sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"

# Installs those of the named Debian packages that are missing (a no-op once they are there).
install_missing() {
  local missing=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "installing: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
}

install_missing "${packages[@]}"
# xgrammar's C++ core (structured output), from its pinned PyPI sdist; a no-op once built.
"$repo/docker/install-xgrammar.sh"

if [ "${1:-}" = "--tests" ]; then
  install_missing "${test_packages[@]}"
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
