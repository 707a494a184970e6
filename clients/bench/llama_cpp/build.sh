#!/usr/bin/env bash
# Builds the llama.cpp that clients/bench/llama_cpp/compare.sh measures against (issue #19).
# The source comes from PyPI's sdist of llama-cpp-python, which vendors the whole llama.cpp
# tree (vendor/llama.cpp): PyPI is the one source registry our machines reach, and the pin
# fixes the llama.cpp commit (0.3.36 vendors ggml-org/llama.cpp@0c1e57098). Only the tools we
# run are built (llama-bench, llama-server, llama-quantize for the Q8_0 / Q4_K_M files,
# llama-perplexity for their KL divergence), static, Release, -march=native, with no network
# features. A venv beside it holds what llama.cpp's convert_hf_to_gguf.py imports.
# Everything lands in the cache dir, outside the repo:
#   clients/bench/llama_cpp/build.sh        # prints the paths; re-running skips done steps
# Env: ATTNRES_LLAMA_DIR (default ~/.cache/attnres-llama-cpp), JOBS (default 2).
set -euo pipefail
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e  # of that sdist
cache=${ATTNRES_LLAMA_DIR:-$HOME/.cache/attnres-llama-cpp}
jobs=${JOBS:-2}
src=$cache/src/llama_cpp_python-$version/vendor/llama.cpp
build=$cache/build
venv=$cache/venv
mkdir -p "$cache/sdist" "$cache/src"

tarball=$cache/sdist/llama_cpp_python-$version.tar.gz
if [ ! -f "$tarball" ]; then
  python3 -m pip download "llama-cpp-python==$version" --no-binary :all: --no-deps -d "$cache/sdist"
fi
echo "$sha256  $tarball" | sha256sum -c --quiet
[ -f "$src/CMakeLists.txt" ] || tar xzf "$tarball" -C "$cache/src"

# OPENSSL / prebuilt UI off: nothing at build or run time reaches the network (the UI
# assets would come from a Hugging Face bucket). Static so the binaries run from anywhere.
# AMX: GGML_NATIVE compiles with -march=native, so on a CPU with AMX (Sapphire Rapids and
# later Xeons: amx_int8 in /proc/cpuinfo) the compiler defines __AMX_INT8__ and ggml's AMX
# path (ggml-cpu/amx/, quantized weights multiplied on the tile units) is built in, as
# GGML_AMX_INT8=ON would ask for. On a CPU without AMX that code compiles out: the Zen 4 dev
# machine has AVX-512 (VNNI, BF16) and no AMX, so its llama.cpp runs the AVX-512 repacked
# kernels, and llama.cpp issue #20824 (a segfault in ggml_backend_amx_mul_mat, which issue
# #51 met with GCC 12 on an AMX Xeon) cannot occur there: no patch is applied. On an AMX
# host built with GCC 12, check that llama-bench runs a Q4_K_M file at all; where it crashes
# in the AMX path, `llama-bench --repack 0` measures without the AMX and repacked buffers
# (and says so in the figures), or build with another compiler (CC= CXX= for cmake).
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
  echo "note: this CPU has AMX: ggml's AMX path is built in (see llama.cpp #20824 above)" >&2
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
fi
nice -n 10 cmake --build "$build" --target llama-bench llama-server llama-quantize llama-perplexity -j "$jobs"

# The converter imports torch at the top and handles every tensor as a torch tensor, even for
# safetensors input, so torch is needed. PyPI's Linux torch wheel needs its CUDA dependencies
# just to import (GBs of download; the CPU-only index is not reachable), so it is installed
# whole. gguf-py comes from the same tree, so converter and format match.
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, gguf, transformers, safetensors, sentencepiece, ml_dtypes' 2>/dev/null; then
  "$venv/bin/pip" install -q torch safetensors sentencepiece 'transformers==4.57.6' \
    'protobuf>=4.21,<5' tqdm pyyaml requests ml_dtypes  # ml_dtypes: for make_models.sh
  "$venv/bin/pip" install -q --no-deps "$src/gguf-py"
fi

echo "llama-bench:  $build/bin/llama-bench"
echo "llama-server: $build/bin/llama-server"
echo "llama-quantize: $build/bin/llama-quantize"
echo "llama-perplexity: $build/bin/llama-perplexity"
echo "converter:    $venv/bin/python $src/convert_hf_to_gguf.py"
