"""--kv-cache-dtype: the bf16 KV cache of the CPU backend, end to end through the CLI.

    attnres logits --model DIR --token-ids ... --prefill N --out FILE.npy --kv-cache-dtype D

(a) With --kv-cache-dtype bfloat16 the engine's logits match the float64 reference run with
    kv_cache_dtype="bfloat16" (K and V rounded to f32, then to bf16 with round-to-nearest-even,
    as they enter its cache). The checkpoints are f32, so the bf16 cache is the only
    low-precision step. Error measure: relative = max|engine - ref| / max|ref|, per logits row
    and over the whole [T, vocab] array. Tolerances, from measurements over 7 variants x 3
    checkpoint seeds (21 cases):
      whole array <= KV_BF16_TOL = 1.5e-3 and median row <= KV_BF16_MEDIAN_TOL = 5e-4.
    Correct rounding: most cases are within 2e-6 (f32 summation order); the rest are at most
    5.4e-4 (median row 1.9e-4). Those are rounding-boundary flips, not a defect: the engine
    computes K/V in f32, so an element within an f32 rounding error of a bf16 midpoint can land
    on the other bf16 neighbour than in the float64 reference, and one flipped element early in
    the sequence moves all later rows a little.
    Broken conversions fail by a clear margin (checked by breaking the engine once):
      no conversion (an f32 cache): whole array >= 3.7e-3, median row >= 1.6e-3;
      truncation instead of round-to-nearest-even: >= 6.5e-3, median row >= 3.5e-3.
    The exact rounding and the attention over a bf16 cache are checked bit for bit in C++
    (tests/cpp/kernels/cpu/cpu_kv_bf16_test.cpp).
(b) --kv-cache-dtype auto picks bfloat16 for a bf16 checkpoint and float32 for an f32 one on
    the CPU: the logits equal those of the explicit setting bit for bit, and `attnres serve`
    names the dtype in its KV cache line, with twice the tokens in the same memory for bf16.
"""

import re

import numpy as np
import pytest

import attnres_ref as ref
from checkpoint_cache import checkpoint_fixture
from engine_cli import (PREFILL, PROMPT_LEN, engine_logits, prompt_ids, relative_error,
                        require_binary)
from server_process import ServerProcess

KV_BF16_TOL = 1.5e-3
KV_BF16_MEDIAN_TOL = 5e-4

PARITY_CASES = (
    ("attnres_block", {}),
    ("attnres_full", {}),
    ("attnres_block_reset", {"shards": 2}),
    ("qwen3", {}),
    ("llama", {}),                    # head_dim 16, GQA
    ("attnres_delta_v", {"gate": "sigmoid_vector", "null_source": True}),  # §2d mode
    ("attnres_pre_gated", {}),        # §2d mode
)




@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="kv_dtype", seed=1)


@pytest.mark.parametrize("variant,kw", PARITY_CASES,
                         ids=[v + "".join(f"-{k}{val}" for k, val in kw.items())
                              for v, kw in PARITY_CASES])
def test_bf16_cache_matches_reference_with_rounded_kv(attnres_bin, checkpoint, tmp_path,
                                                      variant, kw):
    require_binary(attnres_bin)
    model_dir = checkpoint(variant, dtype="f32", **kw)
    ids = prompt_ids(0, PROMPT_LEN)
    engine = engine_logits(attnres_bin, model_dir, ids, tmp_path / "logits.npy",
                           "--kv-cache-dtype", "bfloat16")
    assert engine.dtype == np.float32 and np.all(np.isfinite(engine))
    want = ref.load(model_dir, kv_cache_dtype="bfloat16").logits(ids)
    per_row = [relative_error(engine[t], want[t]) for t in range(PROMPT_LEN)]
    rel = relative_error(engine, want)
    median = float(np.median(per_row))
    assert rel <= KV_BF16_TOL and median <= KV_BF16_MEDIAN_TOL, (
        f"{variant}: relative error {rel:.3g} (limit {KV_BF16_TOL:g}), median row {median:.3g} "
        f"(limit {KV_BF16_MEDIAN_TOL:g}) against the reference with bf16-rounded K/V; per row "
        f"(rows >= {PREFILL} are decode steps): "
        + ", ".join(f"{t}:{e:.2g}" for t, e in enumerate(per_row)))


@pytest.mark.parametrize("dtype,resolved,other", [("bf16", "bfloat16", "float32"),
                                                  ("f32", "float32", "bfloat16")])
def test_auto_follows_the_checkpoint_dtype(attnres_bin, checkpoint, tmp_path, dtype, resolved,
                                           other):
    require_binary(attnres_bin)
    model_dir = checkpoint("attnres_block", dtype=dtype)
    ids = prompt_ids(1, PROMPT_LEN)
    auto = engine_logits(attnres_bin, model_dir, ids, tmp_path / "auto.npy")
    explicit_auto = engine_logits(attnres_bin, model_dir, ids, tmp_path / "auto2.npy",
                                  "--kv-cache-dtype", "auto")
    same = engine_logits(attnres_bin, model_dir, ids, tmp_path / "same.npy",
                         "--kv-cache-dtype", resolved)
    different = engine_logits(attnres_bin, model_dir, ids, tmp_path / "other.npy",
                              "--kv-cache-dtype", other)
    assert np.array_equal(auto, same), f"auto on a {dtype} checkpoint is not {resolved}"
    assert np.array_equal(auto, explicit_auto)
    assert not np.array_equal(auto, different), f"{resolved} and {other} caches agree exactly"


KV_LINE = re.compile(r"KV cache (\d+) blocks x (\d+) tokens = (\d+) tokens (\w+) \(([\d.]+) MiB")


def serve_kv_line(attnres_bin, model_dir, *extra):
    with ServerProcess(attnres_bin, "--model", model_dir, "--kv-cache-memory", "8MiB",
                       *extra) as server:
        log = server.log()
    m = KV_LINE.search(log)
    assert m, f"no KV cache line in the serve log:\n{log}"
    return int(m.group(1)), m.group(4), float(m.group(5))


def test_serve_logs_the_kv_cache_dtype(attnres_bin, checkpoint):
    require_binary(attnres_bin)
    bf16_dir = checkpoint("attnres_block", dtype="bf16")
    blocks_auto, dtype_auto, mib_auto = serve_kv_line(attnres_bin, bf16_dir)
    blocks_f32, dtype_f32, mib_f32 = serve_kv_line(attnres_bin, bf16_dir,
                                                   "--kv-cache-dtype", "float32")
    assert (dtype_auto, dtype_f32) == ("bfloat16", "float32")
    # Twice the blocks in the same memory (up to the floor of the division).
    assert blocks_auto in (2 * blocks_f32, 2 * blocks_f32 + 1), (blocks_auto, blocks_f32)
    assert abs(mib_auto - mib_f32) < 0.1
    _, dtype_f32_ckpt, _ = serve_kv_line(attnres_bin, checkpoint("attnres_block", dtype="f32"))
    assert dtype_f32_ckpt == "float32"


def test_unknown_kv_cache_dtype_is_refused(attnres_bin, checkpoint, tmp_path):
    require_binary(attnres_bin)
    import subprocess
    model_dir = checkpoint("qwen3")
    proc = subprocess.run([str(attnres_bin), "logits", "--model", str(model_dir), "--token-ids",
                           "1,2,3", "--prefill", "2", "--out", str(tmp_path / "x.npy"),
                           "--kv-cache-dtype", "float16"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "--kv-cache-dtype: 'float16' is not one of auto, bfloat16, float32" in proc.stderr
