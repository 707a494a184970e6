#!/usr/bin/env bash
# Our CPU backend against llama.cpp (issue #19), both on 2 threads, same random Qwen3 weights
# (bf16; llama.cpp reads the GGUF its own converter made), alternating in one sitting: for each
# repetition and shape, our engine rows, then llama.cpp's, then the served rows (our server,
# then llama-server, each driven by the same `attnres bench serve` client). Our AttnRes twin
# is measured next to the plain model in the same `bench latency` call (ours only: llama.cpp
# has no AttnRes). Raw outputs go to OUT_DIR; OUT_DIR/rows.tsv holds every figure and the
# summary tables (medians over the repetitions) are printed at the end and kept in
# OUT_DIR/summary.md.
#   clients/bench/llama_cpp/build.sh            # once: llama.cpp from PyPI's sdist, the venv
#   clients/bench/llama_cpp/make_models.sh      # once: checkpoints + GGUFs
#   clients/bench/llama_cpp/compare.sh [REPS] [OUT_DIR]          # defaults 3, bench-llama-cpp
#   QUICK=1 SHAPES=100m clients/bench/llama_cpp/compare.sh 1 /tmp/smoke   # smoke run
# Figures: prefill tok/s at 128 / 512-token prompts (ours: bench latency --input-len N;
# llama.cpp: llama-bench pp N), decode tok/s at context 128 / 512 (ours: 32 steps after an
# N-token prompt; llama.cpp: tg32 at depth N), served output tok/s and median TTFT with 1 and
# 8 clients (128-token prompts, 32 tokens out). Env: SHAPES (default "100m 0.6b"), QUICK=1
# (one iteration, few prompts), ATTNRES (the attnres binary; default this checkout's build),
# ATTNRES_LLAMA_DIR, HTTP_PORT / GRPC_PORT.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
reps=${1:-3}
out=${2:-bench-llama-cpp}
cache=${ATTNRES_LLAMA_DIR:-$HOME/.cache/attnres-llama-cpp}
attnres=${ATTNRES:-${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres}
llama_bench=$cache/build/bin/llama-bench
llama_server=$cache/build/bin/llama-server
models=$cache/models
shapes=${SHAPES:-100m 0.6b}
http_port=${HTTP_PORT:-8300}
grpc_port=${GRPC_PORT:-50351}
threads=2
if [ "${QUICK:-0}" = 1 ]; then
  iters=1 prompts_c1=4 prompts_c8=8 warmups=1
else
  iters=5 prompts_c1=16 prompts_c8=32 warmups=2
fi
mkdir -p "$out"
rows=$out/rows.tsv
: >"$rows"
for f in "$attnres" "$llama_bench" "$llama_server"; do
  [ -x "$f" ] || { echo "missing $f (build.sh / the attnres build)" >&2; exit 1; }
done

source "$repo/clients/bench/serve_process.sh"  # start_server / stop_server for ours

# llama-server in place of start_server: 8 slots of 1024 tokens (8 clients, 160-token
# requests), its log beside ours; stop_server stops it too.
start_llama_server() {
  stop_server
  "$llama_server" -m "$1" -t $threads -np 8 -c 8192 --host 127.0.0.1 --port "$http_port" \
    >>"$out/llama-server.log" 2>&1 &
  server=$!
  wait_for_health llama-server "$out/llama-server.log" 600
}

row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$rep" "$3" >>"$rows"; }

# Plain model and AttnRes twin in one call per prompt length, which goes first alternating
# with the repetition (the smoke runs showed the first model of a call measured slower).
ours_engine() {
  local shape=$1 n pair=("$models/plain-$shape" "$models/attnres-$shape")
  [ $((rep % 2)) = 0 ] && pair=("${pair[1]}" "${pair[0]}")
  for n in 128 512; do
    local json=$out/ours-engine-$shape-$n-$rep.json
    "$attnres" bench latency --model "${pair[0]}" --model "${pair[1]}" --threads $threads \
      --batch 1 --input-len $n --output-len 32 --iters $iters --json "$json" >"${json%.json}.txt" 2>&1
    python3 - "$json" <<'PY' | while IFS=$'\t' read -r side prefill decode; do
import json, sys
for r in json.load(open(sys.argv[1])):
    side = "attnres" if r["model"].rstrip("/").split("/")[-1].startswith("attnres-") else "ours"
    print(f"{side}\t{r['prefill_tokens_per_s']}\t{1000.0 / r['decode_ms_per_step']}")
PY
      row "$shape prefill tok/s, $n-token prompt" "$side" "$prefill"
      row "$shape decode tok/s, context $n" "$side" "$decode"
    done
  done
}

llama_engine() {  # prefill: pp128, pp512; decode: tg32 at depth 128 and 512
  local shape=$1 gguf=$models/plain-$shape.gguf
  local jsonl=$out/llama-engine-$shape-$rep.jsonl
  { "$llama_bench" -m "$gguf" -t $threads -r $iters -p 128,512 -n 0 -o jsonl
    "$llama_bench" -m "$gguf" -t $threads -r $iters -p 0 -n 32 -d 128,512 -o jsonl
  } >"$jsonl" 2>"${jsonl%.jsonl}.log"
  python3 - "$jsonl" <<'PY' | while IFS=$'\t' read -r figure value; do
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["n_gen"] == 0:
        print(f"prefill tok/s, {r['n_prompt']}-token prompt\t{r['avg_ts']}")
    else:
        print(f"decode tok/s, context {r['n_depth']}\t{r['avg_ts']}")
PY
    row "$shape $figure" llama.cpp "$value"
  done
}

served() {  # the same client against whichever server is up
  local shape=$1 side=$2 c prompts
  for c in 1 8; do
    prompts=$prompts_c1
    [ $c = 8 ] && prompts=$prompts_c8
    local json=$out/served-$side-$shape-c$c-$rep.json
    "$attnres" bench serve --disable-tqdm --seed "$rep" --num-warmups $warmups \
      --url "http://127.0.0.1:$http_port" --num-prompts "$prompts" --random-input-len 128 \
      --random-output-len 32 --max-concurrency $c --result-file "$json" >"${json%.json}.txt"
    python3 - "$json" <<'PY' | while IFS=$'\t' read -r tput ttft; do
import json, sys
r = json.load(open(sys.argv[1]))
if r.get("failed", 0) or r["completed"] == 0:
    sys.exit(f"{sys.argv[1]}: {r.get('failed', 0)} failed requests")
print(f"{r['output_throughput']}\t{r['median_ttft_ms']}")
PY
      row "$shape served output tok/s, $c client(s)" "$side" "$tput"
      row "$shape served median TTFT ms, $c client(s)" "$side" "$ttft"
    done
  done
}

for rep in $(seq "$reps"); do
  for shape in $shapes; do
    echo "rep $rep, $shape: engine" >&2
    ours_engine "$shape"
    llama_engine "$shape"
    echo "rep $rep, $shape: served" >&2
    start_server "$attnres" --model "$models/plain-$shape" --threads $threads
    served "$shape" ours
    start_llama_server "$models/plain-$shape.gguf"
    served "$shape" llama.cpp
    stop_server
  done
done
python3 "$repo/clients/bench/llama_cpp/summarize.py" "$rows" | tee "$out/summary.md"
