#!/usr/bin/env bash
# The checkpoints of the llama.cpp comparison (issue #19): for each shape, a plain Qwen3 and
# its AttnRes twin (open-attnres block variant, same seed, same dims), random bf16 weights from
# tests/reference/make_checkpoint.py with the published Qwen3 tokenizer copied in (real Qwen3
# vocab, which llama.cpp's converter recognises); the plain one is then converted to GGUF bf16
# by llama.cpp's own convert_hf_to_gguf.py (run clients/bench/llama_cpp/build.sh first), and
# that GGUF to Q8_0 and Q4_K_M (LLAMA_TYPES: any llama-quantize types) by its llama-quantize.
#   clients/bench/llama_cpp/make_models.sh [SHAPE...]    # default: 100m 0.6b
#   LLAMA_TYPES="Q5_K_S Q5_K_M" clients/bench/llama_cpp/make_models.sh 100m
# Writes $ATTNRES_LLAMA_DIR/models/{plain,attnres}-SHAPE/ and plain-SHAPE{,-TYPE}.gguf (with
# llama-quantize's log, its bits per weight included, in plain-SHAPE-TYPE.log); existing ones
# are kept.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
cache=${ATTNRES_LLAMA_DIR:-$HOME/.cache/attnres-llama-cpp}
llama_src=$(echo "$cache"/src/llama_cpp_python-*/vendor/llama.cpp)
# make_checkpoint.py needs numpy, ml_dtypes, safetensors: the repo's .venv, else build.sh's.
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=$cache/venv/bin/python
tokenizer=${QWEN3_TOKENIZER:-$repo/../shared/data/tokenizers/qwen3}
[ -f "$tokenizer/tokenizer.json" ] || { echo "no Qwen3 tokenizer at $tokenizer (set QWEN3_TOKENIZER)" >&2; exit 1; }
models=$cache/models
mkdir -p "$models"

# The shapes of builtin:plain-100m / builtin:plain-0.6b, except that 0.6b takes Qwen3-0.6B's
# real head_dim 128 (the built-in uses 64). Tied embeddings, Qwen3's 151936 vocab.
shape_args() {
  case $1 in
    100m) echo --hidden 512 --layers 12 --heads 8 --kv-heads 4 --head-dim 64 --ffn 1536 --num-blocks 4 ;;
    0.6b) echo --hidden 1024 --layers 28 --heads 16 --kv-heads 8 --head-dim 128 --ffn 3072 --num-blocks 8 ;;
    *) echo "unknown shape $1 (100m or 0.6b)" >&2; exit 1 ;;
  esac
}

shapes=${*:-100m 0.6b}
for shape in $shapes; do
  for kind in plain attnres; do
    dir=$models/$kind-$shape
    [ -f "$dir/config.json" ] && continue
    variant=qwen3
    [ $kind = attnres ] && variant=attnres_block
    # shellcheck disable=SC2046
    "$python" "$repo/tests/reference/make_checkpoint.py" --variant $variant --out "$dir.tmp" \
      --seed 0 --dtype bf16 --tied --vocab-size 151936 $(shape_args "$shape")
    cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$dir.tmp/"
    # The generated configs name GPT-2's <|endoftext|> (50256) and 512 positions: take
    # Qwen3's <|endoftext|> and 40960 positions (512-token prompts + 32 decode steps).
    "$python" - "$dir.tmp" <<'PY'
import json, sys, pathlib
for name in ("config.json", "generation_config.json"):
    p = pathlib.Path(sys.argv[1]) / name
    c = json.loads(p.read_text())
    c.update(bos_token_id=151643, eos_token_id=151643)
    if name == "config.json":
        c["max_position_embeddings"] = 40960
    p.write_text(json.dumps(c, indent=2) + "\n")
PY
    mv "$dir.tmp" "$dir"
  done
  gguf=$models/plain-$shape.gguf
  if [ ! -f "$gguf" ]; then
    "$cache/venv/bin/python" "$llama_src/convert_hf_to_gguf.py" "$models/plain-$shape" \
      --outtype bf16 --outfile "$models/plain-$shape.tmp.gguf"
    mv "$models/plain-$shape.tmp.gguf" "$gguf"
  fi
  # The quantized files a llama.cpp user would pick, made by llama.cpp's own llama-quantize
  # from that bf16 GGUF (no importance matrix: a random model has no text to calibrate on).
  for type in ${LLAMA_TYPES:-Q8_0 Q4_K_M}; do
    quantized=$models/plain-$shape-$type.gguf
    if [ ! -f "$quantized" ]; then
      "$cache/build/bin/llama-quantize" "$gguf" "$models/plain-$shape-$type.tmp.gguf" $type 2 \
        >"$models/plain-$shape-$type.log" 2>&1
      mv "$models/plain-$shape-$type.tmp.gguf" "$quantized"
    fi
  done
  echo "$shape: $models/plain-$shape $models/attnres-$shape $gguf (+ ${LLAMA_TYPES:-Q8_0 Q4_K_M})"
done
