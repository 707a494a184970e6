#!/usr/bin/env bash
# Two `attnres` builds served side by side on the same machine: for each repetition, each
# build in turn gets a fresh `attnres serve` (built-in demo model, default flags) and the same
# `attnres bench serve` runs from ONE client binary (this checkout's), so only the server
# differs. Prints one line per run (output tok/s, median TTFT / TPOT / ITL) for
# docs/BENCHMARKS.md.
#   clients/bench/compare_servers.sh BEFORE_ATTNRES AFTER_ATTNRES [REPS] [OUT_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
before=${1:?usage: compare_servers.sh BEFORE_ATTNRES AFTER_ATTNRES [REPS] [OUT_DIR]}
after=${2:?usage: compare_servers.sh BEFORE_ATTNRES AFTER_ATTNRES [REPS] [OUT_DIR]}
reps=${3:-2}
out=${4:-bench-compare}
client=${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres
http_port=${HTTP_PORT:-8200}
grpc_port=${GRPC_PORT:-50251}
mkdir -p "$out"

source "$repo/clients/bench/serve_process.sh"

runs=(
  "short-c1|--num-prompts 48 --random-input-len 128 --random-output-len 32 --max-concurrency 1"
  "short-c16|--num-prompts 64 --random-input-len 128 --random-output-len 32 --max-concurrency 16"
  "short-c16-grpc|--backend grpc --num-prompts 64 --random-input-len 128 --random-output-len 32 --max-concurrency 16"
  "short-c64|--num-prompts 64 --random-input-len 128 --random-output-len 32 --max-concurrency 64"
)

for rep in $(seq "$reps"); do
  for side in before after; do
    binary=$before
    [ "$side" = after ] && binary=$after
    start_server "$binary"
    for entry in "${runs[@]}"; do
      name=${entry%%|*}
      read -r -a args <<<"${entry#*|}"
      url=(--url "http://127.0.0.1:$http_port")
      [ "${args[1]:-}" = grpc ] && url=(--url "127.0.0.1:$grpc_port")
      result="$out/$side-$name-$rep.json"
      "$client" bench serve --disable-tqdm --seed "$rep" --num-warmups 2 "${url[@]}" \
        "${args[@]}" --result-file "$result" >/dev/null
      python3 - "$result" "$side" "$name" "$rep" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[3]:16s} rep {sys.argv[4]} {sys.argv[2]:6s} ok {r['completed']:3d} failed {r.get('failed', 0)} "
      f"output tok/s {r['output_throughput']:7.1f}  TTFT median {r['median_ttft_ms']:7.1f} ms  "
      f"TPOT median {r['median_tpot_ms']:6.1f} ms  ITL median {r['median_itl_ms']:6.1f} ms")
EOF
    done
    stop_server
  done
done
