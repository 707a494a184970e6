#!/usr/bin/env bash
# Evidence that both sides of compare.sh read the same weights: the greedy completion of one
# prompt from `attnres serve` (HF checkpoint) and from llama-server (its GGUF) must match.
#   clients/bench/llama_cpp/same_weights.sh [SHAPE...]    # default: 100m 0.6b
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
cache=${ATTNRES_LLAMA_DIR:-$HOME/.cache/attnres-llama-cpp}
attnres=${ATTNRES:-${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres}
out=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$out"' EXIT
request='{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
status=0
for shape in ${*:-100m 0.6b}; do
  "$cache/build/bin/llama-server" -m "$cache/models/plain-$shape.gguf" -t 2 --host 127.0.0.1 \
    --port 8322 >"$out/llama.log" 2>&1 &
  pids=($!)
  "$attnres" serve --model "$cache/models/plain-$shape" --threads 2 --port 8321 \
    --grpc-port 50371 >"$out/ours.log" 2>&1 &
  pids+=($!)
  texts=()
  for port in 8321 8322; do
    for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
    texts+=("$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "$request" | python3 -c 'import json, sys; print(repr(json.load(sys.stdin)["choices"][0]["text"]))')")
  done
  kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  pids=()
  echo "$shape ours:      ${texts[0]}"
  echo "$shape llama.cpp: ${texts[1]}"
  [ "${texts[0]}" = "${texts[1]}" ] || { echo "$shape: the greedy texts differ" >&2; status=1; }
done
exit $status
