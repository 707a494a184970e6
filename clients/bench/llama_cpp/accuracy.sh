#!/usr/bin/env bash
# How far quantized weights move the model's next-token distribution (issue #51), ours and
# llama.cpp's, on the same checkpoint and the same text. For each shape:
#   llama.cpp: llama-perplexity on the bf16 GGUF with --kl-divergence-base (saves its
#     distributions), then on the Q8_0 and Q4_K_M GGUFs (LLAMA_TYPES; make_models.sh makes
#     them) with --kl-divergence against it;
#   ours: `attnres perplexity --save-logits` on the bf16 checkpoint, then each of VARIANTS
#     with --kl-base; also for the AttnRes twin (ours only);
#   greedy: PROMPTS prompts (windows of the text), 32 greedy tokens each from the bf16 model
#     and from each variant (`attnres generate --temperature 0`): how many match bf16's.
# Both tools score the same positions: chunks of CTX tokens, the second half of each on the
# token after it (llama-perplexity's convention). The text defaults to
# /usr/share/common-licenses/GPL-3 (English prose, ~35 KB, ~7.5k Qwen3
# tokens; verbatim copies allowed, on every Debian/Ubuntu host), read identically by both.
# Figures: mean / 99th percentile / max KL divergence, same top token %, PPL, and llama.cpp's
# bits per weight (the whole file, as llama-quantize reported it); in
# OUT_DIR/accuracy.tsv (SHAPE, MODEL, TOOL, VARIANT, figure..., one line each) and printed.
#   clients/bench/llama_cpp/accuracy.sh [OUT_DIR]                 # default bench-accuracy
#   VARIANTS=f32 SHAPES=100m clients/bench/llama_cpp/accuracy.sh   # pipeline check
# Env: SHAPES (default "100m 0.6b"), VARIANTS (ours, default "int8 int4": --quantization X;
# "f32" = the bf16 weights with f32 KV cache and linear inputs, which needs no
# quantization), LLAMA (default yes: the llama.cpp part; no = ours only), LLAMA_TYPES (default
# "Q8_0 Q4_K_M"), OURS (default yes; no = llama.cpp's KL only: no perplexity or greedy runs of
# ours), MODELS (ours, default "plain attnres"), GREEDY (default yes), CTX (512), CHUNKS
# (default 8: 8 x 255 scored positions), PROMPTS (20), TEXT, ATTNRES, ATTNRES_LLAMA_DIR,
# DRY_RUN=1 (print the commands only).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
out=${1:-bench-accuracy}
cache=${ATTNRES_LLAMA_DIR:-$HOME/.cache/attnres-llama-cpp}
attnres=${ATTNRES:-${ATTNRES_BUILD_DIR:-$repo/build}/server/cli/attnres}
llama_perplexity=$cache/build/bin/llama-perplexity
models=$cache/models
shapes=${SHAPES:-100m 0.6b}
variants=${VARIANTS:-int8 int4}
text=${TEXT:-/usr/share/common-licenses/GPL-3}
ctx=${CTX:-512}
chunks=${CHUNKS:-8}
prompts=${PROMPTS:-20}
llama=${LLAMA:-yes}
ours=${OURS:-yes}
llama_types=${LLAMA_TYPES:-Q8_0 Q4_K_M}
our_models=${MODELS:-plain attnres}
greedy=${GREEDY:-yes}
dry=${DRY_RUN:-0}
threads=2
for n in "$ctx" "$chunks" "$prompts"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "CTX, CHUNKS, PROMPTS must be positive integers" >&2; exit 2; }
done
variant_flags() {
  case $1 in
    int8 | int4) echo "--quantization $1" ;;
    f32) echo "--kv-cache-dtype float32 --linear-input-dtype float32" ;;
    *) echo "unknown variant '$1' (int8, int4 or f32)" >&2; exit 2 ;;
  esac
}
for v in $variants; do variant_flags "$v" >/dev/null; done
mkdir -p "$out"
tsv=$out/accuracy.tsv
if [ "$dry" != 1 ]; then
  [ -f "$text" ] || { echo "no text at $text (TEXT=)" >&2; exit 1; }
  [ $ours = no ] || [ -x "$attnres" ] || { echo "missing $attnres (the attnres build)" >&2; exit 1; }
  [ $llama = no ] || [ -x "$llama_perplexity" ] || { echo "missing $llama_perplexity (build.sh)" >&2; exit 1; }
  printf 'shape\tmodel\ttool\tvariant\tkl_mean\tkl_p99\tkl_max\tsame_top_pct\tppl\tppl_base\tbpw\n' >"$tsv"
fi
# run OUTFILE CMD...: CMD's stdout to OUTFILE (stderr to OUTFILE.log); under DRY_RUN prints it.
run() {
  local file=$1
  shift
  if [ "$dry" = 1 ]; then
    printf '%q ' "$@"
    echo
  else
    "$@" >"$file" 2>"$file.log"
  fi
}
record() { [ "$dry" = 1 ] || printf '%s\n' "$*" | tr ' ' '\t' >>"$tsv"; }

llama_side() {
  local shape=$1 base=$out/llama-$shape.kld
  run "$out/llama-$shape-bf16.txt" "$llama_perplexity" -m "$models/plain-$shape.gguf" -f "$text" \
    -c "$ctx" --chunks "$chunks" -t $threads --kl-divergence-base "$base"
  local type
  for type in $llama_types; do
    local res=$out/llama-$shape-$type.txt
    run "$res" "$llama_perplexity" -m "$models/plain-$shape-$type.gguf" -f "$text" -c "$ctx" \
      --chunks "$chunks" -t $threads --kl-divergence-base "$base" --kl-divergence
    [ "$dry" = 1 ] && continue
    # llama-perplexity prints its statistics on stdout, its progress on stderr.
    record "$shape" plain llama.cpp "$type" "$(python3 - "$res" "$models/plain-$shape-$type.log" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
q = re.search(r"quant size\s+=.*\((\S+) BPW\)", open(sys.argv[2]).read())
def f(pattern):
    m = re.search(pattern, t, re.MULTILINE)
    if not m:
        sys.exit(f"{sys.argv[1]}: no '{pattern}'")
    return float(m.group(1))
vals = [f(r"^Mean\s+KLD:\s+(\S+)"), f(r"^99\.0%\s+KLD:\s+(\S+)"), f(r"^Maximum KLD:\s+(\S+)"),
        f(r"^Same top p:\s+(\S+)"), f(r"^Mean PPL\(Q\)\s+:\s+(\S+)"), f(r"^Mean PPL\(base\)\s+:\s+(\S+)"),
        float(q.group(1)) if q else float("nan")]
print(" ".join(f"{v:.6g}" for v in vals))
PY
)"
  done
  [ "$dry" = 1 ] || rm -f "$base"  # ~0.3 GB per 1000 positions at Qwen3's vocabulary
}

ours_side() {
  local shape=$1 model=$2 dir=$models/$2-$shape base=$out/ours-$2-$shape.arlp v
  run "$out/ours-$model-$shape-bf16.json" "$attnres" perplexity --model "$dir" --threads $threads \
    --file "$text" --ctx "$ctx" --chunks "$chunks" --save-logits "$base" --json
  for v in $variants; do
    local res=$out/ours-$model-$shape-$v.json
    # shellcheck disable=SC2046
    run "$res" "$attnres" perplexity --model "$dir" --threads $threads $(variant_flags "$v") \
      --file "$text" --ctx "$ctx" --chunks "$chunks" --kl-base "$base" --json
    [ "$dry" = 1 ] && continue
    record "$shape" "$model" ours "$v" "$(python3 - "$res" <<'PY'
import json, re, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
# The bits per weight of the quantized matrices, from the quantize log line (none: nan).
q = re.search(r"(\S+) bits per weight", open(sys.argv[1] + ".log").read())
vals = [r["kl_mean"], r["kl_p99"], r["kl_max"], 100 * r["same_top_fraction"], r["ppl"], r["ppl_base"],
        float(q.group(1)) if q else float("nan")]
print(" ".join(f"{v:.6g}" for v in vals))
PY
)"
  done
  [ "$dry" = 1 ] || rm -f "$base"
}

# PROMPTS windows of 200 characters, evenly spaced through the text.
prompt_texts() {
  python3 - "$text" "$prompts" <<'PY'
import sys
t = " ".join(open(sys.argv[1], encoding="utf-8").read().split())
n = int(sys.argv[2])
step = max(1, (len(t) - 200) // n)
for i in range(n):
    print(t[i * step:i * step + 200])
PY
}

greedy_side() {  # how many prompts give each variant bf16's 32 greedy tokens
  local shape=$1 dir=$models/plain-$shape v i=0
  declare -A same=()
  while IFS= read -r prompt; do
    i=$((i + 1))
    local ref=$out/greedy-$shape-$i-bf16.json
    run "$ref" "$attnres" generate --model "$dir" --threads $threads --prompt "$prompt" \
      --max-tokens 32 --temperature 0 --ignore-eos --json
    for v in $variants; do
      local res=$out/greedy-$shape-$i-$v.json
      # shellcheck disable=SC2046
      run "$res" "$attnres" generate --model "$dir" --threads $threads $(variant_flags "$v") \
        --prompt "$prompt" --max-tokens 32 --temperature 0 --ignore-eos --json
      [ "$dry" = 1 ] && continue
      if python3 -c 'import json,sys; a,b=(json.loads(open(f).read().strip().splitlines()[-1])["token_ids"] for f in sys.argv[1:]); sys.exit(a!=b)' "$ref" "$res"; then
        same[$v]=$((${same[$v]:-0} + 1))
      fi
    done
  done < <(prompt_texts)
  [ "$dry" = 1 ] && return
  for v in $variants; do
    echo "$shape greedy: $v gives bf16's 32 tokens on ${same[$v]:-0} of $i prompts" | tee -a "$out/greedy.txt"
  done
}

for shape in $shapes; do
  echo "$shape: KL divergence" >&2
  [ $llama = no ] || llama_side "$shape"
  [ $ours = no ] && continue
  for model in $our_models; do ours_side "$shape" "$model"; done
  [ "$greedy" = no ] && continue
  echo "$shape: greedy tokens" >&2
  greedy_side "$shape"
done
[ "$dry" = 1 ] || column -t -s $'\t' "$tsv"
