"""Tensor parallelism and sequence-parallel prefill, end to end through the `attnres` CLI and
the real server (ranks are threads on the CPU backend: engine/parallel/in_process_communicator).

What must hold (issue #7):
- TP = 1, 2, 4 give the same logits (within F32_TP_TOL of each other, and each within the
  parity tests' 1e-4 of the independent NumPy reference) and the same greedy tokens and text,
  for every variant; with and without sequence-parallel prefill.
- A 4,096-token prompt prefilled sequence-parallel (the bank sharded along the sequence)
  equals the unsharded prefill.
- An uneven vocabulary split (padded LM head slices) and TP = 3 are exact too.
- `attnres serve --tensor-parallel-size 2` serves the same greedy text as a single rank.
Per-rank bank memory (1/P) is measured in tests/cpp/engine/runner (ForwardFootprint).

Error measure: max|a - b| / max|b| over the whole [positions, vocab] logits array.
"""

import json
import subprocess

import numpy as np
import pytest

import attnres_ref as ref
from checkpoint_cache import checkpoint_fixture
from engine_cli import relative_error
from make_checkpoint import TOKENIZER_VOCAB, VARIANTS
from server_process import ServerProcess
from openai import OpenAI

REF_TOL = 1e-4      # engine vs float64 reference, f32 checkpoints (as test_engine_parity.py)
F32_TP_TOL = 1e-5   # TP = P vs TP = 1 engine: only the all-reduce summation order differs
BF16_TP_TOL = 1e-4  # same weights rounded to bf16; activations (and linear inputs) stay f32
PROMPT_LEN, PREFILL = 24, 16
GEN_TOKENS = 24
TIMEOUT_S = 600


def run_cli(binary, *args):
    if not binary.is_file():
        pytest.fail(f"attnres binary not found at {binary}: build first", pytrace=False)
    cmd = [str(binary), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(cmd)}\n{proc.stderr[-3000:]}", pytrace=False)
    return proc


def engine_logits(binary, model_dir, ids, prefill, out, tp, sp_min_tokens=0, stride=1, extra=()):
    run_cli(binary, "logits", "--model", model_dir, "--token-ids", ",".join(map(str, ids)),
            "--prefill", prefill, "--tensor-parallel-size", tp,
            "--sequence-parallel-min-tokens", sp_min_tokens, "--stride", stride, "--out", out,
            *extra)
    logits = np.load(out)
    assert np.all(np.isfinite(logits)), "non-finite logits"
    return logits


def engine_greedy(binary, model_dir, prompt, tp):
    proc = run_cli(binary, "generate", "--model", model_dir, "--prompt-ids",
                   ",".join(map(str, prompt)), "--max-tokens", GEN_TOKENS, "--temperature", 0,
                   "--ignore-eos", "--json", "--tensor-parallel-size", tp,
                   "--sequence-parallel-min-tokens", 1)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def prompt_ids(seed, n):
    return np.random.default_rng(2000 + seed).integers(0, TOKENIZER_VOCAB, n).tolist()


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="tp", seed=7)


@pytest.mark.parametrize("variant", VARIANTS)
def test_tp_logits_match_tp1_and_reference(attnres_bin, checkpoint, tmp_path, variant):
    """Prefill (16 tokens) then 8 decode steps at TP = 1, 2, 4; sequence-parallel prefill on
    and off. Defaults: 4 query heads, 2 KV heads (so TP = 4 replicates KV heads)."""
    model_dir = checkpoint(variant)
    ids = prompt_ids(1, PROMPT_LEN)
    want = ref.load(model_dir).logits(ids)
    base = engine_logits(attnres_bin, model_dir, ids, PREFILL, tmp_path / "tp1.npy", 1)
    assert relative_error(base, want) < REF_TOL
    for tp in (2, 4):
        for sp in (0, 1):
            got = engine_logits(attnres_bin, model_dir, ids, PREFILL, tmp_path / f"tp{tp}_{sp}.npy",
                                tp, sp_min_tokens=sp)
            assert got.shape == base.shape
            err = relative_error(got, base)
            assert err < F32_TP_TOL, f"TP={tp} sequence-parallel={sp}: {err:.2e} from TP=1"
            assert relative_error(got, want) < REF_TOL, f"TP={tp} sp={sp} vs reference"


@pytest.mark.parametrize("variant", ["attnres_block", "attnres_block_reset", "qwen2"])
def test_tp_bf16_logits_match_tp1(attnres_bin, checkpoint, tmp_path, variant):
    """bf16 weights with f32 linear inputs: only the all-reduce order differs. (With bf16 linear
    inputs, --linear-input-dtype auto on Zen 4, that order's f32-sized differences can move an
    input across a bf16 rounding boundary; test_linear_input_dtype.py checks TP there against
    the reference with bf16-sized bounds.)"""
    model_dir = checkpoint(variant, dtype="bf16")
    ids = prompt_ids(2, PROMPT_LEN)
    f32_inputs = ("--linear-input-dtype", "float32")
    base = engine_logits(attnres_bin, model_dir, ids, PREFILL, tmp_path / "tp1.npy", 1,
                         extra=f32_inputs)
    got = engine_logits(attnres_bin, model_dir, ids, PREFILL, tmp_path / "tp2.npy", 2, 1,
                        extra=f32_inputs)
    assert relative_error(got, base) < BF16_TP_TOL


def test_tp3_uneven_vocabulary(attnres_bin, checkpoint, tmp_path):
    """6 heads / 3 KV heads split 3 ways; vocab 50305 = 3 x 16769 - 2: the last LM head slice
    is padded, and its padding must not leak into the logits."""
    model_dir = checkpoint("attnres_block_reset", heads=6, kv_heads=3, ffn=192, vocab_size=50305)
    ids = prompt_ids(3, PROMPT_LEN)
    want = ref.load(model_dir).logits(ids)
    base = engine_logits(attnres_bin, model_dir, ids, PREFILL, tmp_path / "tp1.npy", 1)
    got = engine_logits(attnres_bin, model_dir, ids, PREFILL, tmp_path / "tp3.npy", 3, 1)
    assert got.shape == (PROMPT_LEN, 50305)
    assert relative_error(got, base) < F32_TP_TOL
    assert relative_error(got, want) < REF_TOL


def test_tp_rejects_impossible_splits(attnres_bin, checkpoint):
    model_dir = checkpoint("attnres_block")  # 4 heads, 2 KV heads, ffn 128
    proc = subprocess.run([str(attnres_bin), "generate", "--model", str(model_dir),
                           "--tensor-parallel-size", "3", "--max-tokens", "2"],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode != 0
    assert "num_attention_heads 4 is not divisible by 3" in proc.stderr
    proc = subprocess.run([str(attnres_bin), "generate", "--model", str(model_dir),
                           "--tensor-parallel-size", "0"], capture_output=True, text=True)
    assert proc.returncode != 0 and "--tensor-parallel-size must be >= 1" in proc.stderr
    proc = subprocess.run([str(attnres_bin), "generate", "--model", str(model_dir),
                           "--sequence-parallel-min-tokens", "-1"], capture_output=True, text=True)
    assert proc.returncode != 0 and "--sequence-parallel-min-tokens: must be >= 0" in proc.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_tp_greedy_text_identical(attnres_bin, checkpoint, variant):
    model_dir = checkpoint(variant)
    prompt = prompt_ids(4, 20)
    runs = {tp: engine_greedy(attnres_bin, model_dir, prompt, tp) for tp in (1, 2, 4)}
    assert len(runs[1]["token_ids"]) == GEN_TOKENS
    for tp in (2, 4):
        assert runs[tp]["token_ids"] == runs[1]["token_ids"], f"TP={tp} greedy tokens differ"
        assert runs[tp]["text"] == runs[1]["text"]
        for a, b in zip(runs[tp]["logprobs"], runs[1]["logprobs"]):
            assert abs(a["logprob"] - b["logprob"]) < 1e-4


@pytest.mark.parametrize("variant", ["attnres_block_reset", "attnres_full"])
def test_sequence_parallel_prefill_of_4096_tokens(attnres_bin, checkpoint, tmp_path, variant):
    """One 4,096-token prefill step, sharded along the sequence over 2 and 4 ranks, equals
    the unsharded one (every 64th position's logits compared, the last position included),
    and the unsharded one matches the reference at the last position."""
    model_dir = checkpoint(variant)
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["max_position_embeddings"] = 8192
    config_path.write_text(json.dumps(config))
    n = 4096
    ids = prompt_ids(5, n)
    base = engine_logits(attnres_bin, model_dir, ids, n, tmp_path / "tp1.npy", 1, stride=64)
    assert base.shape == (n // 64 + 1, 50304)
    for tp in (2, 4):
        got = engine_logits(attnres_bin, model_dir, ids, n, tmp_path / f"sp{tp}.npy", tp,
                            sp_min_tokens=1, stride=64)
        assert relative_error(got, base) < F32_TP_TOL, f"sequence-parallel over {tp} ranks"
    model = ref.load(model_dir)
    last = model.forward(ids, ref.KVCache())[-1]
    assert relative_error(base[-1], last) < REF_TOL


def test_server_with_two_ranks_serves_the_single_rank_text(attnres_bin):
    prompt = "Depth attention lets every layer choose"
    texts = {}
    for tp in (1, 2):
        with ServerProcess(attnres_bin, "--tensor-parallel-size", str(tp),
                           "--max-num-batched-tokens", "64") as server:
            client = OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
            r = client.completions.create(model="attnres-demo", prompt=prompt * 6, max_tokens=16,
                                          temperature=0)
            assert r.usage.completion_tokens == 16
            streamed = "".join(c.choices[0].text for c in client.completions.create(
                model="attnres-demo", prompt=prompt * 6, max_tokens=16, temperature=0,
                stream=True) if c.choices)
            assert streamed == r.choices[0].text
            texts[tp] = r.choices[0].text
            if tp == 2:
                assert "cpu" in server.log() and "x2 (in-process)" in server.log()
    assert texts[2] == texts[1]
