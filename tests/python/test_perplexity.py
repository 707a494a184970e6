"""`attnres perplexity` against a NumPy computation on tiny random checkpoints.

The tool cuts the text's tokens into --ctx chunks, scores positions ctx/2 .. ctx-2 of each on
the next token, and with --save-logits keeps those distributions (uint16 log-probabilities,
16 nats below the top, server/cli/log_prob_file.h); --kl-base scores another model against
such a file. Checked here: the saved tokens are the text's, the saved rows are the float64
reference's log-softmax, and perplexity, mean / median / 99th percentile / max KL divergence and
the same-top-token fraction are what NumPy computes from the reference logits of both models.

The compared model is the base checkpoint with 3% noise on its matrices (a quantization's
kind of error, made large enough that the figures resolve: mean KL ~0.01 nats, the top token
shared on part of the positions only).

Tolerances: the engine's f32 logits sit within ~1e-4 relative of the reference
(test_engine_parity; measured here ~1e-6 on these shapes), a saved log-probability within
16/65535/2 = 1.2e-4 of its value, so saved rows are held to 5e-4 absolute (measured 6e-5),
perplexity to 2e-4 relative and KL figures to 2e-4 absolute + 1e-3 relative (measured
~1e-6); the same-top count may differ only on rows whose top two logits lie within 1e-3.
"""

import json
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import attnres_ref as ref
from checkpoint_cache import checkpoint_fixture
from engine_cli import default_reference, run_cli

CTX = 32
FIRST = CTX // 2
# Plain English (a few hundred tokens), repeated words and all: enough for several chunks.
TEXT = (
    "The quick brown fox jumps over the lazy dog while the farmer watches from the gate. "
    "In the evening the lamps were lit, and the village gathered in the square to hear the "
    "news from the city: the river had risen, the bridge was closed, and the market would "
    "open a day late. Nobody minded much; the harvest was in, the barns were full, and the "
    "children ran between the stalls shouting the names of the boats on the water. "
) * 4


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="ppl", seed=1)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    path.write_text(TEXT)
    return path


def perturbed(model_dir, out, scale=0.03, seed=5):
    """A copy of the checkpoint with Gaussian noise of `scale` x each matrix's std added."""
    shutil.copytree(model_dir, out)
    rng = np.random.default_rng(seed)
    for f in sorted(out.glob("*.safetensors")):
        w = load_file(f)
        save_file({k: v + (scale * v.std() * rng.standard_normal(v.shape)).astype(v.dtype)
                   if v.ndim == 2 else v for k, v in w.items()}, f)
    return out


def read_saved(path):
    """(ctx, vocab, chunks, tokens [chunks, ctx], log_probs [chunks * scored, vocab])."""
    data = path.read_bytes()
    assert data[:8] == b"ARLPROB1"
    ctx, vocab, chunks = struct.unpack_from("<3i", data, 8)
    off = 20
    tokens = np.frombuffer(data, "<i4", chunks * ctx, off).reshape(chunks, ctx)
    off += 4 * chunks * ctx
    rows = []
    row_bytes = 8 + 2 * vocab
    assert len(data) - off == chunks * (ctx - 1 - ctx // 2) * row_bytes
    while off < len(data):
        scale, min_lp = struct.unpack_from("<2f", data, off)
        q = np.frombuffer(data, "<u2", vocab, off + 8).astype(np.float64)
        rows.append(min_lp + scale * q)
        off += row_bytes
    return ctx, vocab, chunks, tokens, np.array(rows)


def log_softmax(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def reference_log_probs(model, tokens):
    """[chunks * scored, vocab]: each chunk from an empty cache, rows FIRST .. CTX-2."""
    return np.concatenate([log_softmax(model.forward(list(chunk))[FIRST:CTX - 1])
                           for chunk in tokens])


def next_tokens(tokens):
    return np.concatenate([chunk[FIRST + 1:] for chunk in tokens])


def perplexity(binary, model_dir, text_file, *extra):
    out = run_cli(binary, "perplexity", "--model", model_dir, "--file", text_file, "--ctx", CTX,
                  "--json", *extra)
    return json.loads(out.strip().splitlines()[-1])


def test_perplexity_and_saved_distributions(attnres_bin, checkpoint, text_file, tmp_path):
    model_dir = checkpoint("attnres_block")
    saved = tmp_path / "base.arlp"
    result = perplexity(attnres_bin, model_dir, text_file, "--save-logits", saved)
    ctx, vocab, chunks, tokens, rows = read_saved(saved)
    assert (ctx, vocab) == (CTX, 50304) and chunks >= 3
    ids = json.loads(run_cli(attnres_bin, "generate", "--model", model_dir, "--prompt", TEXT,
                             "--no-special-tokens", "--max-tokens", 1, "--json"))["prompt_ids"]
    assert tokens.ravel().tolist() == ids[:chunks * CTX]
    assert len(ids) < (chunks + 1) * CTX  # every whole chunk scored

    lp = reference_log_probs(default_reference(attnres_bin, model_dir), tokens)
    nxt = next_tokens(tokens)
    ppl = float(np.exp(-lp[np.arange(len(nxt)), nxt].mean()))
    assert result["positions"] == len(nxt) == chunks * (CTX - 1 - FIRST)
    assert result["ppl"] == pytest.approx(ppl, rel=2e-4)
    kept = lp >= lp.max(axis=1, keepdims=True) - 16  # the file keeps 16 nats below the top
    assert np.max(np.abs(rows - lp)[kept]) < 5e-4

    limited = perplexity(attnres_bin, model_dir, text_file, "--chunks", 2)
    assert limited["positions"] == 2 * (CTX - 1 - FIRST)


def test_kl_divergence_against_base(attnres_bin, checkpoint, text_file, tmp_path):
    base_dir = checkpoint("attnres_block")
    other_dir = perturbed(base_dir, tmp_path / "noisy")
    saved = tmp_path / "base.arlp"
    perplexity(attnres_bin, base_dir, text_file, "--save-logits", saved)
    result = perplexity(attnres_bin, other_dir, text_file, "--kl-base", saved)
    tokens = read_saved(saved)[3]

    base = reference_log_probs(default_reference(attnres_bin, base_dir), tokens)
    other = reference_log_probs(default_reference(attnres_bin, other_dir), tokens)
    kl = np.sum(np.exp(base) * (base - other), axis=1)
    nxt = next_tokens(tokens)
    at = np.arange(len(nxt))
    assert result["positions"] == len(nxt)
    assert result["ppl"] == pytest.approx(float(np.exp(-other[at, nxt].mean())), rel=2e-4)
    assert result["ppl_base"] == pytest.approx(float(np.exp(-base[at, nxt].mean())), rel=2e-4)
    assert kl.mean() > 2e-3  # a figure the tolerances resolve
    for key, want in (("kl_mean", kl.mean()), ("kl_median", np.median(kl)),
                      ("kl_p99", np.percentile(kl, 99)), ("kl_max", kl.max())):
        assert result[key] == pytest.approx(float(want), rel=1e-3, abs=2e-4), key
    same = np.argmax(base, axis=1) == np.argmax(other, axis=1)
    assert 0 < same.sum() < len(same)  # the count can be wrong either way

    def near_ties(x):
        top2 = np.sort(x, axis=1)[:, -2:]
        return top2[:, 1] - top2[:, 0] < 1e-3

    slack = int(np.sum(near_ties(base) | near_ties(other)))
    assert abs(result["same_top_fraction"] * len(nxt) - same.sum()) <= slack

    # Against itself: no divergence, the same top token everywhere.
    own = perplexity(attnres_bin, base_dir, text_file, "--kl-base", saved)
    assert own["kl_max"] < 1e-3 and own["same_top_fraction"] == 1.0


def test_refuses_mismatched_base_and_short_text(attnres_bin, checkpoint, text_file, tmp_path):
    import subprocess
    model_dir = checkpoint("attnres_block")
    saved = tmp_path / "base.arlp"
    perplexity(attnres_bin, model_dir, text_file, "--save-logits", saved, "--chunks", 1)

    def fails(*args):
        proc = subprocess.run([str(attnres_bin), "perplexity", "--model", str(model_dir),
                               *map(str, args)], capture_output=True, text=True)
        assert proc.returncode == 1, proc.stderr
        return proc.stderr

    assert "--kl-base was saved with ctx 32" in fails("--file", text_file, "--ctx", 16,
                                                      "--kl-base", saved)
    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    assert "fewer than one --ctx chunk" in fails("--file", short, "--ctx", CTX)
    assert "--file is required" in fails("--ctx", CTX)
    not_saved = tmp_path / "text.arlp"
    not_saved.write_text(TEXT)
    assert "not an attnres perplexity --save-logits file" in fails(
        "--file", text_file, "--ctx", CTX, "--kl-base", not_saved)
