#!/usr/bin/env bash
# The serving benchmarks recorded in docs/perf-log/serving.md, sized for a 2-core CPU:
#   load (default)  "Server under load on the CPU": starts `attnres serve` (built-in demo
#                   model, default flags) on spare ports, runs `attnres bench serve` over a
#                   sweep of settings (a few minutes in all), plots them;
#   prefix          "Prefix caching on the CPU": a 1024-token shared prefix + 128 unique tokens,
#                   and a 4-turn chat, each with prefix caching on and off, alternating on/off
#                   for REPS repetitions (default 2), a fresh server per run so that no run
#                   starts with another's cache.
# One result JSON per run goes into OUT_DIR (default bench-results/), tables into
# OUT_DIR/tables.txt. Usage: clients/bench/cpu_serving_benchmarks.sh [OUT_DIR] [load|prefix]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${ATTNRES_BUILD_DIR:-$repo/build}
attnres=$build/server/cli/attnres
python=${PYTHON:-$repo/.venv/bin/python}
out=${1:-bench-results}
sweep=${2:-load}
http_port=${HTTP_PORT:-8100}
grpc_port=${GRPC_PORT:-50151}
mkdir -p "$out"

source "$repo/clients/bench/serve_process.sh"

run() {  # run NAME ARGS...: one benchmark, its table appended to $out/tables.txt
  local name=$1
  shift
  echo "== $name: attnres bench serve $*" | tee -a "$out/tables.txt"
  "$attnres" bench serve --disable-tqdm --seed 0 --label "$name" --save-detailed \
    --result-file "$out/$name.json" "$@" | sed -n '/Serving Benchmark Result/,$p' |
    tee -a "$out/tables.txt"
}

http=(--url "http://127.0.0.1:$http_port")

if [ "$sweep" = prefix ]; then
  # One warm-up each (the first prompt): with caching on it leaves the shared prefix cached,
  # the steady state of a server whose system prompt is in use; off, it is only a warm-up.
  # Greedy, so that both sides get the same answers and so the same multi-turn histories.
  shared=(--num-prompts 24 --random-prefix-len 1024 --random-input-len 128
    --random-output-len 32 --max-concurrency 4 --num-warmups 1 --temperature 0)
  chat=(--backend openai-chat --num-prompts 8 --multi-turn 4 --random-input-len 128
    --random-output-len 32 --max-concurrency 4 --temperature 0)
  for rep in $(seq "${REPS:-2}"); do
    # Alternate which side goes first, so that drift in the machine's load hits both.
    order=(on off)
    [ $((rep % 2)) -eq 0 ] && order=(off on)
    for workload in shared chat; do
      for mode in "${order[@]}"; do
        if [ "$mode" = on ]; then start_server "$attnres"; else start_server "$attnres" --no-enable-prefix-caching; fi
        declare -n args=$workload
        run "$workload-$mode-$rep" "${http[@]}" "${args[@]}"
      done
    done
  done
  exit 0
fi

start_server "$attnres"
# Short prompts: 128 in / 32 out, a burst of 64 requests at several concurrency limits.
for c in 1 4 16 64; do
  run "short-c$c" "${http[@]}" --num-prompts 64 --random-input-len 128 --random-output-len 32 \
    --max-concurrency "$c" --num-warmups 2
done
# Long prompts: vLLM's default 1024 in / 128 out, 16 requests.
for c in 1 4; do
  run "long-c$c" "${http[@]}" --num-prompts 16 --random-input-len 1024 --random-output-len 128 \
    --max-concurrency "$c" --num-warmups 1
done
# Poisson arrivals at 8 requests/s, no concurrency limit.
run "short-poisson8" "${http[@]}" --num-prompts 64 --random-input-len 128 \
  --random-output-len 32 --request-rate 8 --burstiness 1
# The three protocols on the same load.
run "short-c16-chat" "${http[@]}" --backend openai-chat --num-prompts 64 \
  --random-input-len 128 --random-output-len 32 --max-concurrency 16 --num-warmups 2
run "short-c16-grpc" --backend grpc --url "127.0.0.1:$grpc_port" --num-prompts 64 \
  --random-input-len 128 --random-output-len 32 --max-concurrency 16 --num-warmups 2

"$python" "$repo/clients/bench/plot_results.py" "$out"/short-c{1,4,16,64}.json \
  --out-dir "$out/plots-short" --x max_concurrency
"$python" "$repo/clients/bench/plot_results.py" "$out"/short-c16.json "$out"/short-c16-chat.json \
  "$out"/short-c16-grpc.json --out-dir "$out/plots-protocols" --x label
