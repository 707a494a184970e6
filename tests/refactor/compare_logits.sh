#!/usr/bin/env bash
# Bit-exactness check for refactors of the forward: the CPU logits of every depth mode and
# plain model, from BASE_COMMIT's `attnres` and from this tree's, compared byte for byte.
#
#   tests/refactor/compare_logits.sh BASE_COMMIT [NEW_BINARY]
#
# BASE_COMMIT's sources are exported (git archive) into build/compare-base/<sha>/ and its
# `attnres` built there, in the default configuration so that ccache (base_dir) serves the
# objects the commits share, unless ATTNRES_BASE_BIN names a binary built from that commit.
# NEW_BINARY defaults to $ATTNRES_BUILD_DIR/server/cli/attnres (build/ by default).
#
# Each random checkpoint (tests/reference/make_checkpoint.py: every variant, in f32 and bf16,
# with the gate and null-source options) runs `attnres logits` over a 24-token prompt: a
# 20-token prefill step, then 4 decode steps, with 2 threads, under each setting:
#   float32   KV cache, depth bank and linear inputs f32
#   bfloat16  all three bf16 (bf16 checkpoints; linear inputs only where the CPU has
#             AVX512_BF16)
#   default   the auto dtypes (auto's linear inputs follow a timing of the CPU: should
#             it pick differently between the two runs, the explicit settings decide)
#   tp2       2 tensor-parallel ranks, every step all-reduced
#   tp2_sp    2 ranks, the prefill sequence-parallel (sharded bank)
# It prints one line per run (the first 16 hex digits of the base logits' sha256, "same" or
# "DIFFERENT") and exits non-zero if any run differs or fails. COMPARE_JOBS (default 4) runs
# that many comparisons at once. Not part of the suite: it builds a second binary.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
base=${1:?usage: compare_logits.sh BASE_COMMIT [NEW_BINARY]}
build=${ATTNRES_BUILD_DIR:-$repo/build}
new_bin=${2:-$build/server/cli/attnres}
python=${PYTHON:-$repo/.venv/bin/python}
sha=$(git -C "$repo" rev-parse --short=12 "$base^{commit}")

base_bin=${ATTNRES_BASE_BIN:-}
if [ -z "$base_bin" ]; then
  # Inside the worktree's build dir, with the same source/build layout as a normal build
  # (build under the source root), so ccache (base_dir) hits on files the commits share.
  src=$build/compare-base/$sha
  if [ ! -x "$src/build/server/cli/attnres" ]; then
    rm -rf "$src" && mkdir -p "$src"
    git -C "$repo" archive "$sha" | tar -x -C "$src"
    ATTNRES_BUILD_DIR=$src/build ATTNRES_BUILD_TARGETS=attnres \
      "$src/docker/build.sh"
  fi
  base_bin=$src/build/server/cli/attnres
fi
[ -x "$base_bin" ] || { echo "no base binary at $base_bin" >&2; exit 2; }
[ -x "$new_bin" ] || { echo "no binary at $new_bin" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" - "$repo/tests/reference" "$work" "$base_bin" "$new_bin" "${COMPARE_JOBS:-4}" <<'PY'
import concurrent.futures
import filecmp
import hashlib
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from make_checkpoint import make_checkpoint  # noqa: E402

work, base_bin, new_bin, jobs = Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
CASES = (  # (variant, make_checkpoint options)
    ("qwen3", {}), ("qwen2", {}), ("llama", {}),
    ("attnres_block", {}), ("attnres_full", {}), ("attnres_block_reset", {"shards": 2}),
    ("attnres_nobias", {}),
    ("attnres_block", {"gate": "sigmoid_scalar"}), ("attnres_full", {"gate": "sigmoid_vector"}),
    ("attnres_block", {"gate": "learnable_alpha"}),
    ("attnres_block_reset", {"gate": "sigmoid_vector"}),
    ("attnres_delta", {}), ("attnres_delta", {"null_source": True, "gate": "sigmoid_scalar"}),
    ("attnres_delta_block", {}),
    ("attnres_delta_block", {"null_source": True, "gate": "sigmoid_vector"}),
    ("attnres_delta_v", {}), ("attnres_delta_v", {"gate": "sigmoid_vector", "null_source": True}),
    ("attnres_first_layer", {}), ("attnres_pre_gated", {}),
)
rng = random.Random(3)
ids = ",".join(str(rng.randrange(50257)) for _ in range(24))
F32 = ["--kv-cache-dtype", "float32", "--depth-bank-dtype", "float32",
       "--linear-input-dtype", "float32"]


def logits(binary, model, out, flags):
    cmd = [binary, "logits", "--model", str(model), "--token-ids", ids, "--prefill", "20",
           "--threads", "2", "--out", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]


runs = []  # (label, model dir, flags)
bf16_linear = None
for i, (variant, options) in enumerate(CASES):
    label = variant + "".join(f" {k}={v}" for k, v in options.items())
    for dtype in ("f32", "bf16"):
        model = make_checkpoint(work / f"{i:02d}-{dtype}", variant, seed=7 + i, dtype=dtype,
                                **options)
        if dtype == "bf16" and bf16_linear is None:  # explicit bf16 inputs need AVX512_BF16
            probe = logits(base_bin, model, work / "probe.npy", ["--linear-input-dtype", "bfloat16"])
            bf16_linear = "bfloat16" if probe is None else "float32"
        bf16 = ["--kv-cache-dtype", "bfloat16", "--depth-bank-dtype", "bfloat16",
                "--linear-input-dtype", bf16_linear]
        explicit = bf16 if dtype == "bf16" else F32
        settings = [("float32", F32)] + ([("bfloat16", bf16)] if dtype == "bf16" else [])
        settings += [("default", []),
                     ("tp2", ["--tensor-parallel-size", "2", "--sequence-parallel-min-tokens",
                              "0", *explicit]),
                     ("tp2_sp", ["--tensor-parallel-size", "2", "--sequence-parallel-min-tokens",
                                 "8", *explicit])]
        runs += [(f"{label} {dtype} {name}", model, flags) for name, flags in settings]


def compare(index):
    label, model, flags = runs[index]
    outs = []
    for which, binary in (("base", base_bin), ("new", new_bin)):
        out = work / f"run{index}-{which}.npy"
        error = logits(binary, model, out, flags)
        if error:
            return f"{'':16} FAILED     {label}: {which}: {error}", False
        outs.append(out)
    digest = hashlib.sha256(outs[0].read_bytes()).hexdigest()[:16]
    same = filecmp.cmp(outs[0], outs[1], shallow=False)
    return f"{digest} {'same      ' if same else 'DIFFERENT '} {label}", same


with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    results = list(pool.map(compare, range(len(runs))))
for line, _ in results:
    print(line)
bad = sum(not ok for _, ok in results)
print(f"base {base_bin} vs {new_bin}: {len(runs)} runs compared, {bad} different or failed")
sys.exit(1 if bad else 0)
PY
