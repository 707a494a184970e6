"""Running the `attnres` CLI from tests, and the measures its output is judged by.

Shared by the reference-parity modules (test_engine_parity, test_kv_cache_dtype,
test_depth_bank_dtype, test_transformers_parity, test_mpi), so that none imports another
test module.

Error measure ("relative"): max|engine - ref| / max|ref| over the whole array.
"""

import json
import re
import subprocess

import numpy as np
import pytest

import attnres_ref
from make_checkpoint import TOKENIZER_VOCAB

PROMPT_LEN, PREFILL = 12, 8  # the logits tests' shape: an 8-token prefill, then 4 decode steps
F32_TOL = 1e-4               # f32 checkpoints against the float64 reference
NEAR_TIE = 1e-5              # top-2 reference logits closer than this = a tie
CLI_TIMEOUT_S = 300


def require_binary(path):
    if not path.is_file():
        pytest.fail(f"attnres binary not found at {path}: build it (cmake --build build) "
                    f"or point ATTNRES_BUILD_DIR at the build directory", pytrace=False)


def run_cli(binary, *args):
    """stdout of `binary args...`; a non-zero exit or a timeout fails the test with stderr."""
    require_binary(binary)
    cmd = [str(binary), *map(str, args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {CLI_TIMEOUT_S}s: {' '.join(cmd)}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(cmd)}\n--- stderr ---\n{proc.stderr[-4000:]}"
                    f"\n--- stdout ---\n{proc.stdout[-2000:]}", pytrace=False)
    return proc.stdout


def parse_json_object(stdout):
    """The one JSON object the CLI prints (tolerates log lines before it)."""
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        for line in reversed(text.splitlines()):
            if line.lstrip().startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    break
    pytest.fail(f"generate --json did not print a JSON object; stdout:\n{stdout[-2000:]}", pytrace=False)


def engine_logits(binary, model_dir, ids, out, *extra, prefill=PREFILL):
    """`attnres logits`: rows 0..prefill-1 from one prefill forward, each later row from one
    decode step; extra flags appended (--kv-cache-dtype, --depth-bank-dtype, ...)."""
    run_cli(binary, "logits", "--model", model_dir, "--token-ids", ",".join(map(str, ids)),
            "--prefill", prefill, "--out", out, *extra)
    return np.load(out)


def engine_settings(binary, model_dir, *flags):
    """What the engine resolves for this model on this machine (`attnres inspect`'s engine line,
    "engine:     cpu, KV cache bfloat16, depth bank bfloat16, linear inputs float32"):
    {"kv_cache": ..., "depth_bank": ..., "linear_inputs": ...}, each "bfloat16" or "float32".
    auto's linear inputs depend on the CPU (kernels/cpu/bf16_dot_rate.h), so a reference of
    the default engine asks rather than assumes."""
    out = run_cli(binary, "inspect", "--model", model_dir, *flags)
    found = re.search(r"^engine: .*KV cache (\w+), depth bank (\w+), linear inputs (\w+)$", out,
                      re.MULTILINE)
    if not found:
        pytest.fail(f"attnres inspect printed no engine line:\n{out}", pytrace=False)
    return dict(zip(("kv_cache", "depth_bank", "linear_inputs"), found.groups()))


def default_reference(binary, model_dir):
    """The float64 reference rounding what the default engine rounds here: K/V, bank entries
    and linear inputs where engine_settings says bfloat16."""
    s = engine_settings(binary, model_dir)
    as_ref = {"bfloat16": "bfloat16", "float32": "float64"}
    return attnres_ref.load(model_dir, kv_cache_dtype=as_ref[s["kv_cache"]],
                            depth_bank_dtype=as_ref[s["depth_bank"]],
                            linear_input_dtype=as_ref[s["linear_inputs"]])


def relative_error(engine, reference):
    """max|engine - reference| / max|reference|."""
    return float(np.max(np.abs(engine - reference)) / np.max(np.abs(reference)))


def prompt_ids(seed, n):
    """Random ids over the real tokenizer vocabulary (padded rows are never inputs)."""
    return np.random.default_rng(1000 + seed).integers(0, TOKENIZER_VOCAB, n).tolist()


def first_divergence(a, b):
    """The first index where two token lists differ (or the shorter one's end); None if equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))
