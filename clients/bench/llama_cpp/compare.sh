#!/usr/bin/env bash
# Our CPU backend against llama.cpp (issues #19, #51), both on 2 threads, same random Qwen3
# weights, alternating in one sitting. Variants (VARIANTS, default "bf16 int8 int4"): bf16
# (llama.cpp reads the bf16 GGUF its own converter made), int8 (ours: --quantization int8;
# llama.cpp: the Q8_0 GGUF its llama-quantize made from that bf16 GGUF), int4 (ours:
# --quantization int4; llama.cpp: Q4_K_M). For each repetition, shape and variant: our engine
# rows, llama.cpp's, then the served rows (our server, then llama-server, each driven by the
# same `attnres bench serve` client). Our AttnRes twin is measured next to the plain model in
# the same `bench latency` call (ours only: llama.cpp has no AttnRes). Raw outputs go to
# OUT_DIR; OUT_DIR/rows.tsv holds every figure and the summary tables (medians over the
# repetitions) are printed at the end and kept in OUT_DIR/summary.md.
#   clients/bench/llama_cpp/build.sh            # once: llama.cpp from PyPI's sdist, the venv
#   clients/bench/llama_cpp/make_models.sh      # once: checkpoints + GGUFs (bf16, Q8_0, Q4_K_M)
#   clients/bench/llama_cpp/compare.sh [REPS] [OUT_DIR]          # defaults 3, bench-llama-cpp
#   QUICK=1 SHAPES=100m VARIANTS=bf16 clients/bench/llama_cpp/compare.sh 1 /tmp/smoke
#   DRY_RUN=1 clients/bench/llama_cpp/compare.sh 2 /tmp/plan     # prints the commands only
# Figures: prefill tok/s at 128 / 512-token prompts (ours: bench latency --input-len N;
# llama.cpp: llama-bench pp N), decode tok/s at context 128 / 512 (ours: 32 steps after an
# N-token prompt; llama.cpp: tg32 at depth N), served output tok/s, median TTFT and the
# prefix-cache hit rate with 1 and 8 clients (128-token prompts, 32 tokens out). Every served
# run draws its own prompts (a --seed no other run against that server used), so no run
# reads another's prompts from the prefix cache; the hit rate (prefix_hits.py, from /metrics
# before and after the run, warm-ups included) shows what the cache still found: mostly the
# warm-ups, which send the run's first prompt (so its first measured request finds it).
# Env: SHAPES (default "100m 0.6b"), VARIANTS, QUICK=1 (one iteration, few prompts), ATTNRES
# (the attnres binary; default this checkout's build), ATTNRES_LLAMA_DIR, HTTP_PORT /
# GRPC_PORT, DRY_RUN=1 (print each measuring command instead of running it).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
here=$repo/clients/bench/llama_cpp
reps=${1:-3}
out=${2:-bench-llama-cpp}
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "REPS must be a positive integer, not '$reps'" >&2; exit 2; }
cache=${ATTNRES_LLAMA_DIR:-$HOME/.cache/attnres-llama-cpp}
attnres=${ATTNRES:-${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres}
llama_bench=$cache/build/bin/llama-bench
llama_server=$cache/build/bin/llama-server
models=$cache/models
shapes=${SHAPES:-100m 0.6b}
variants=${VARIANTS:-bf16 int8 int4}
http_port=${HTTP_PORT:-8300}
grpc_port=${GRPC_PORT:-50351}
dry=${DRY_RUN:-0}
threads=2
if [ "${QUICK:-0}" = 1 ]; then
  iters=1 prompts_c1=4 prompts_c8=8 warmups=1
else
  iters=5 prompts_c1=16 prompts_c8=32 warmups=2
fi

# llama.cpp's file for each of our variants.
gguf_suffix() {
  case $1 in
    bf16) echo "" ;;
    int8) echo -Q8_0 ;;
    int4) echo -Q4_K_M ;;
    *) echo "unknown variant '$1' (bf16, int8 or int4)" >&2; exit 2 ;;
  esac
}
# Our flags for a variant: none for bf16 (the checkpoint as stored).
quant_flags() { [ "$1" = bf16 ] || echo "--quantization $1"; }
label() {
  case $1 in
    bf16) echo bf16 ;;
    int8) echo "int8 vs Q8_0" ;;
    int4) echo "int4 vs Q4_K_M" ;;
  esac
}
for v in $variants; do gguf_suffix "$v" >/dev/null; done

mkdir -p "$out"
rows=$out/rows.tsv
: >"$rows"
if [ "$dry" != 1 ]; then
  for f in "$attnres" "$llama_bench" "$llama_server"; do
    [ -x "$f" ] || { echo "missing $f (build.sh / the attnres build)" >&2; exit 1; }
  done
  for shape in $shapes; do
    for v in $variants; do
      f=$models/plain-$shape$(gguf_suffix "$v").gguf
      [ -f "$f" ] || { echo "missing $f (make_models.sh)" >&2; exit 1; }
    done
  done
  # The help is read whole first: `grep -q` in a pipe exits at the match, the help's writer
  # dies of SIGPIPE and pipefail would report the flag as missing.
  if [[ " $variants " =~ " int" ]] && ! grep -q -- --quantization <<<"$("$attnres" serve --help 2>&1)"; then
    echo "$attnres has no --quantization: run with VARIANTS=bf16" >&2
    exit 1
  fi
fi

# measure OUTFILE CMD...: runs CMD with stdout+stderr to OUTFILE; under DRY_RUN prints it.
measure() {
  local file=$1
  shift
  if [ "$dry" = 1 ]; then
    printf '%q ' "$@"
    echo
  else
    "$@" >"$file" 2>&1
  fi
}

source "$repo/clients/bench/serve_process.sh"  # start_server / stop_server for ours
if [ "$dry" = 1 ]; then
  start_server() { echo "serve: $*"; }
fi

# llama-server in place of start_server: 8 slots of 1024 tokens (8 clients, 160-token
# requests), /metrics on (the hit rate), its log beside ours; stop_server stops it too.
start_llama_server() {
  if [ "$dry" = 1 ]; then
    echo "llama-server: $1"
    return
  fi
  stop_server
  "$llama_server" -m "$1" -t $threads -np 8 -c 8192 --metrics --host 127.0.0.1 \
    --port "$http_port" >>"$out/llama-server.log" 2>&1 &
  server=$!
  wait_for_health llama-server "$out/llama-server.log" 600
}

row() { [ "$dry" = 1 ] || printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$rep" "$3" >>"$rows"; }

# Plain model and AttnRes twin in one call per prompt length, which goes first alternating
# with the repetition (the smoke runs showed the first model of a call measured slower).
ours_engine() {
  local shape=$1 variant=$2 n pair=("$models/plain-$shape" "$models/attnres-$shape")
  local name
  name="$shape $(label "$variant")"
  [ $((rep % 2)) = 0 ] && pair=("${pair[1]}" "${pair[0]}")
  for n in 128 512; do
    local json=$out/ours-engine-$shape-$variant-$n-$rep.json
    # shellcheck disable=SC2046
    measure "${json%.json}.txt" "$attnres" bench latency --model "${pair[0]}" --model "${pair[1]}" \
      --threads $threads $(quant_flags "$variant") --batch 1 --input-len $n --output-len 32 \
      --iters $iters --json "$json"
    [ "$dry" = 1 ] && continue
    python3 - "$json" <<'PY' | while IFS=$'\t' read -r side prefill decode; do
import json, sys
for r in json.load(open(sys.argv[1])):
    side = "attnres" if r["model"].rstrip("/").split("/")[-1].startswith("attnres-") else "ours"
    print(f"{side}\t{r['prefill_tokens_per_s']}\t{1000.0 / r['decode_ms_per_step']}")
PY
      row "$name prefill tok/s, $n-token prompt" "$side" "$prefill"
      row "$name decode tok/s, context $n" "$side" "$decode"
    done
  done
}

llama_engine() {  # prefill: pp128, pp512; decode: tg32 at depth 128 and 512
  local shape=$1 variant=$2 name
  name="$shape $(label "$variant")"
  local gguf=$models/plain-$shape$(gguf_suffix "$variant").gguf
  local jsonl=$out/llama-engine-$shape-$variant-$rep.jsonl
  measure "$jsonl.pp" "$llama_bench" -m "$gguf" -t $threads -r $iters -p 128,512 -n 0 -o jsonl
  measure "$jsonl.tg" "$llama_bench" -m "$gguf" -t $threads -r $iters -p 0 -n 32 -d 128,512 -o jsonl
  [ "$dry" = 1 ] && return
  grep -h '^{' "$jsonl.pp" "$jsonl.tg" >"$jsonl"
  python3 - "$jsonl" <<'PY' | while IFS=$'\t' read -r figure value; do
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["n_gen"] == 0:
        print(f"prefill tok/s, {r['n_prompt']}-token prompt\t{r['avg_ts']}")
    else:
        print(f"decode tok/s, context {r['n_depth']}\t{r['avg_ts']}")
PY
    row "$name $figure" llama.cpp "$value"
  done
}

# Every served run of the whole invocation takes the next seed: no two runs share prompts.
seed=0
served() {  # the same client against whichever server is up
  local shape=$1 variant=$2 side=$3 c prompts name
  name="$shape $(label "$variant")"
  for c in 1 8; do
    prompts=$prompts_c1
    [ $c = 8 ] && prompts=$prompts_c8
    seed=$((seed + 1))
    local json=$out/served-$side-$shape-$variant-c$c-$rep.json
    [ "$dry" = 1 ] || curl -sf "http://127.0.0.1:$http_port/metrics" >"${json%.json}.metrics0"
    measure "${json%.json}.txt" "$attnres" bench serve --disable-tqdm --seed $seed \
      --num-warmups $warmups --url "http://127.0.0.1:$http_port" --num-prompts "$prompts" \
      --random-input-len 128 --random-output-len 32 --max-concurrency $c --result-file "$json"
    [ "$dry" = 1 ] && continue
    curl -sf "http://127.0.0.1:$http_port/metrics" >"${json%.json}.metrics1"
    local hits
    hits=$(python3 "$here/prefix_hits.py" "${json%.json}.metrics0" "${json%.json}.metrics1")
    echo "  $side $name, $c client(s), seed $seed: prefix-cache hits $hits%" >&2
    python3 - "$json" <<'PY' | while IFS=$'\t' read -r tput ttft; do
import json, sys
r = json.load(open(sys.argv[1]))
if r.get("failed", 0) or r["completed"] == 0:
    sys.exit(f"{sys.argv[1]}: {r.get('failed', 0)} failed requests")
print(f"{r['output_throughput']}\t{r['median_ttft_ms']}")
PY
      row "$name served output tok/s, $c client(s)" "$side" "$tput"
      row "$name served median TTFT ms, $c client(s)" "$side" "$ttft"
    done
    [ "$hits" = - ] || row "$name served prefix-cache hit %, $c client(s)" "$side" "$hits"
  done
}

for rep in $(seq "$reps"); do
  for shape in $shapes; do
    for variant in $variants; do
      echo "rep $rep, $shape, $(label "$variant"): engine" >&2
      ours_engine "$shape" "$variant"
      llama_engine "$shape" "$variant"
      echo "rep $rep, $shape, $(label "$variant"): served" >&2
      # shellcheck disable=SC2046
      start_server "$attnres" --model "$models/plain-$shape" --threads $threads $(quant_flags "$variant")
      served "$shape" "$variant" ours
      start_llama_server "$models/plain-$shape$(gguf_suffix "$variant").gguf"
      served "$shape" "$variant" llama.cpp
      [ "$dry" = 1 ] || stop_server
    done
  done
done
[ "$dry" = 1 ] && exit 0
python3 "$here/summarize.py" "$rows" | tee "$out/summary.md"
