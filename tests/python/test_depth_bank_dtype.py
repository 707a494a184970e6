"""--depth-bank-dtype: the bf16 depth bank of the CPU backend, end to end through the CLI.

    attnres logits --model DIR --token-ids ... --prefill N --out FILE.npy --depth-bank-dtype D

The depth bank is the list of completed representations the depth mixes read (docs/ATTNRES.md §2:
e, the 2a snapshots of x, the 2b block sums, the delta modes' sublayer outputs and block
deltas, first_layer's out_1). With bfloat16 every entry is rounded to bf16 (round to nearest
even from the engine's f32 value) when it is appended; the running partial, the sublayer
outputs added into it, null sources, queries, gates and K/V are not (reference:
attnres_ref.Model(depth_bank_dtype="bfloat16"), _bank_entry).

(a) With --depth-bank-dtype bfloat16 the engine's logits match the float64 reference run with
    depth_bank_dtype="bfloat16", for every AttnRes mode. The checkpoints are f32, so the bank
    is the only low-precision step. Error measure as in test_kv_cache_dtype.py: relative =
    max|engine - ref| / max|ref|, per logits row and over the whole [T, vocab] array; and the
    engine must sit nearer the rounded reference than the unrounded one (median row against
    the rounded one over median row against the unrounded one: the "ratio").
    Measured (8 modes x checkpoint seeds 1-5 x prompt seeds 0-1, 80 cases, commit of this
    test): whole array <= 7.5e-4 (block_reset; the rest <= 6.5e-4), median row <= 3.6e-5,
    ratio <= 0.014. Most cases are within 1e-6; the larger ones are rounding-boundary flips
    (the engine rounds its f32 value, the reference its float64 one, and an element within an
    f32 rounding error of a bf16 midpoint lands on the other neighbour).
    What broken conversions give (simulated in the reference, seeds 1-3; minimum over seeds):
      no conversion (an f32 bank): whole array >= 1.4e-3 (delta_v; 2.0e-3 .. 1.2e-2 for the
        rest), median row >= 1.0e-3, ratio >= 3e4;
      truncation instead of round to nearest even: whole array >= 2.9e-3, median row
        >= 1.5e-3, ratio 1.2-1.9;
      the partial rounded too (2a / 2b / first_layer): >= 2.3e-3 / 1.9e-3 median row.
    Hence the tolerances: whole array BANK_BF16_TOL = 1.5e-3 (twice the worst measured; alone
    it would not catch delta_v without conversion), median row BANK_BF16_MEDIAN_TOL = 2e-4
    (5x the worst measured, 5x below the smallest broken case), ratio BANK_CLOSER_RATIO = 0.1.
(b) --depth-bank-dtype auto (also the default, the flag left out) picks bfloat16 for a bf16
    checkpoint and float32 for an f32 one on the CPU: the logits equal those of the explicit
    setting bit for bit and differ from the other.
(c) A plain model has no bank: the flag is accepted and changes nothing, bit for bit.
(d) An unknown value is refused with a message naming the allowed ones.
(e) Combined with --kv-cache-dtype bfloat16 the engine matches the reference with both
    roundings, nearer it than either single rounding (each alone is >= 4.4e-3 whole array /
    3.4e-3 median row from the combined reference on attnres_delta, seeds 1-3).
(f) `attnres serve` names the resolved dtype in its log for an AttnRes model.
(g) Tensor parallelism with a sequence-parallel prefill (the bank sharded along the sequence,
    each rank rounding its rows) matches the same reference.
"""

import subprocess

import numpy as np
import pytest

import attnres_ref as ref
from checkpoint_cache import checkpoint_fixture
from engine_cli import (PREFILL, PROMPT_LEN, engine_logits, parse_json_object, prompt_ids,
                        relative_error, require_binary, run_cli)
from make_checkpoint import MODE_CASES
from server_process import ServerProcess

BANK_BF16_TOL = 1.5e-3
BANK_BF16_MEDIAN_TOL = 2e-4
BANK_CLOSER_RATIO = 0.1

BANK_CASES = MODE_CASES


def row_errors(engine, want):
    return [relative_error(engine[t], want[t]) for t in range(engine.shape[0])]


def check_against(engine, want, unrounded, what):
    """engine within tolerance of `want`, and nearer to it than to `unrounded` (the reference
    without the rounding under test): a flag the engine ignores fails the second check."""
    per_row = row_errors(engine, want)
    rel = relative_error(engine, want)
    median = float(np.median(per_row))
    median_unrounded = float(np.median(row_errors(engine, unrounded)))
    rows = ", ".join(f"{t}:{e:.2g}" for t, e in enumerate(per_row))
    assert rel <= BANK_BF16_TOL and median <= BANK_BF16_MEDIAN_TOL, (
        f"{what}: relative error {rel:.3g} (limit {BANK_BF16_TOL:g}), median row {median:.3g} "
        f"(limit {BANK_BF16_MEDIAN_TOL:g}); median row against the unrounded reference "
        f"{median_unrounded:.3g}; per row (rows >= {PREFILL} are decode steps): {rows}")
    assert median <= BANK_CLOSER_RATIO * median_unrounded, (
        f"{what}: median row {median:.3g} against the rounded reference is not below "
        f"{BANK_CLOSER_RATIO:g} x {median_unrounded:.3g} against the unrounded one: the "
        f"rounding is missing or wrong; per row: {rows}")


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="bank_dtype", seed=1)


@pytest.mark.parametrize("variant,kw", BANK_CASES,
                         ids=[v + "".join(f"-{k}{val}" for k, val in kw.items())
                              for v, kw in BANK_CASES])
def test_bf16_bank_matches_reference_with_rounded_bank(attnres_bin, checkpoint, tmp_path,
                                                       variant, kw):
    require_binary(attnres_bin)
    model_dir = checkpoint(variant, dtype="f32", **kw)
    ids = prompt_ids(0, PROMPT_LEN)
    engine = engine_logits(attnres_bin, model_dir, ids, tmp_path / "logits.npy",
                           "--depth-bank-dtype", "bfloat16")
    assert engine.dtype == np.float32 and np.all(np.isfinite(engine))
    want = ref.load(model_dir, depth_bank_dtype="bfloat16").logits(ids)
    unrounded = ref.load(model_dir).logits(ids)
    check_against(engine, want, unrounded, f"{variant} (bf16 bank)")


@pytest.mark.parametrize("dtype,resolved,other", [("bf16", "bfloat16", "float32"),
                                                  ("f32", "float32", "bfloat16")])
def test_auto_follows_the_checkpoint_dtype(attnres_bin, checkpoint, tmp_path, dtype, resolved,
                                           other):
    require_binary(attnres_bin)
    model_dir = checkpoint("attnres_full", dtype=dtype)  # a bank entry after every sublayer
    ids = prompt_ids(1, PROMPT_LEN)
    auto = engine_logits(attnres_bin, model_dir, ids, tmp_path / "auto.npy",
                         "--depth-bank-dtype", "auto")
    default = engine_logits(attnres_bin, model_dir, ids, tmp_path / "default.npy")
    same = engine_logits(attnres_bin, model_dir, ids, tmp_path / "same.npy",
                         "--depth-bank-dtype", resolved)
    different = engine_logits(attnres_bin, model_dir, ids, tmp_path / "other.npy",
                              "--depth-bank-dtype", other)
    assert np.array_equal(auto, same), f"auto on a {dtype} checkpoint is not {resolved}"
    assert np.array_equal(default, auto), "the default is not auto"
    assert not np.array_equal(auto, different), f"{resolved} and {other} banks agree exactly"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_plain_model_accepts_the_flag_and_is_unchanged(attnres_bin, checkpoint, tmp_path, dtype):
    require_binary(attnres_bin)
    model_dir = checkpoint("qwen3", dtype=dtype)
    ids = prompt_ids(2, PROMPT_LEN)
    runs = {d: engine_logits(attnres_bin, model_dir, ids, tmp_path / f"{d}.npy",
                             "--depth-bank-dtype", d)
            for d in ("float32", "bfloat16", "auto")}
    assert np.array_equal(runs["float32"], runs["bfloat16"]), "a model without a bank changed"
    assert np.array_equal(runs["float32"], runs["auto"])


def test_unknown_depth_bank_dtype_is_refused(attnres_bin, checkpoint, tmp_path):
    require_binary(attnres_bin)
    model_dir = checkpoint("qwen3")
    proc = subprocess.run([str(attnres_bin), "logits", "--model", str(model_dir), "--token-ids",
                           "1,2,3", "--prefill", "2", "--out", str(tmp_path / "x.npy"),
                           "--depth-bank-dtype", "float16"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "--depth-bank-dtype: 'float16' is not one of auto, bfloat16, float32" in proc.stderr


def test_bf16_bank_with_bf16_kv_cache_matches_reference_with_both(attnres_bin, checkpoint,
                                                                  tmp_path):
    require_binary(attnres_bin)
    model_dir = checkpoint("attnres_delta", dtype="f32")
    ids = prompt_ids(0, PROMPT_LEN)
    engine = engine_logits(attnres_bin, model_dir, ids, tmp_path / "logits.npy",
                           "--depth-bank-dtype", "bfloat16", "--kv-cache-dtype", "bfloat16")
    assert engine.dtype == np.float32 and np.all(np.isfinite(engine))
    want = ref.load(model_dir, kv_cache_dtype="bfloat16", depth_bank_dtype="bfloat16").logits(ids)
    kv_only = ref.load(model_dir, kv_cache_dtype="bfloat16").logits(ids)
    bank_only = ref.load(model_dir, depth_bank_dtype="bfloat16").logits(ids)
    check_against(engine, want, kv_only, "attnres_delta (bf16 bank + bf16 KV; vs KV-only)")
    check_against(engine, want, bank_only, "attnres_delta (bf16 bank + bf16 KV; vs bank-only)")


def test_generate_accepts_the_flag(attnres_bin, checkpoint):
    """Every command that loads a model takes the flag; generate as a second one."""
    require_binary(attnres_bin)
    model_dir = checkpoint("attnres_full", dtype="f32")
    out = parse_json_object(run_cli(
        attnres_bin, "generate", "--model", model_dir, "--prompt-ids",
        ",".join(map(str, prompt_ids(3, 6))), "--max-tokens", 4, "--temperature", 0,
        "--ignore-eos", "--json", "--depth-bank-dtype", "bfloat16"))
    assert len(out.get("token_ids", [])) == 4, f"generate --depth-bank-dtype bfloat16: {out}"


@pytest.mark.parametrize("variant,kw", [("attnres_full", {}), ("attnres_delta_block", {})])
def test_bf16_bank_sequence_parallel_matches_reference(attnres_bin, checkpoint, tmp_path, variant,
                                                       kw):
    """Two ranks, the 8-token prefill sequence-parallel: each rank rounds its rows of every
    entry (the sharded path writes the bank through copies, never in place)."""
    require_binary(attnres_bin)
    model_dir = checkpoint(variant, dtype="f32", **kw)
    ids = prompt_ids(4, PROMPT_LEN)
    engine = engine_logits(attnres_bin, model_dir, ids, tmp_path / "logits.npy",
                           "--depth-bank-dtype", "bfloat16", "--tensor-parallel-size", 2,
                           "--sequence-parallel-min-tokens", 2)
    want = ref.load(model_dir, depth_bank_dtype="bfloat16").logits(ids)
    unrounded = ref.load(model_dir).logits(ids)
    check_against(engine, want, unrounded, f"{variant} (bf16 bank, TP 2, sequence-parallel)")


@pytest.mark.parametrize("dtype,resolved", [("bf16", "bfloat16"), ("f32", "float32")])
def test_serve_logs_the_depth_bank_dtype(attnres_bin, checkpoint, dtype, resolved):
    require_binary(attnres_bin)
    model_dir = checkpoint("attnres_full", dtype=dtype)
    with ServerProcess(attnres_bin, "--model", model_dir, "--kv-cache-memory", "8MiB") as server:
        log = server.log()
    assert f"attnres serve: depth bank {resolved}\n" in log, log
