"""Engine vs reference acceptance tests, through the `attnres` CLI.

CLI contract exercised (server/cli):
    attnres logits --model DIR --token-ids 1,2,3,... --prefill N --out FILE.npy
        float32 .npy [len(ids), vocab_size]; rows 0..N-1 from one prefill forward over
        the first N ids, each later row from one single-token decode step (KV cache).
    attnres generate --model DIR --prompt-ids 1,2,3 --max-tokens 32 --temperature 0 \
        --ignore-eos --json
        one JSON object on stdout: token_ids (generated only), text, logprobs.

Error measure used throughout ("relative"):  max|engine - ref| / max|ref|,  over the
whole [T, vocab] logits array, ref = float64 NumPy reference (tests/reference).
Tolerances: 1e-4 for f32 checkpoints; 2e-2 for bf16 and f16 checkpoints (the
reference widens the stored bf16/f16 weights exactly; the engine computes in f32 from
the same weights). The engine's defaults store a bf16 checkpoint's KV cache and depth bank
in bf16 (--kv-cache-dtype / --depth-bank-dtype auto), and on a CPU where bf16 dot products
are the faster ones (Zen 4) also round its linears' inputs to bf16 (--linear-input-dtype
auto), so the logits test compares with the reference rounding what this machine's engine
rounds (engine_cli.default_reference, from `attnres inspect`): measured <= 1.5e-3 on every
bf16 case but yarn's (<= 7e-3) with f32 linear inputs, where the unrounded reference sits up
to 6.6e-2 away (2b block sums: the final mix reads the bank straight into the hidden state);
with bf16 linear inputs a rounding-boundary flip moves a case by up to ~7e-3
(test_linear_input_dtype.py).

A missing binary makes every test here FAIL (not skip): these are acceptance tests.
"""

import numpy as np
import pytest

import attnres_ref as ref
from checkpoint_cache import checkpoint_fixture
from engine_cli import (F32_TOL, NEAR_TIE, PREFILL, PROMPT_LEN, default_reference,
                        first_divergence, parse_json_object, prompt_ids, relative_error,
                        require_binary, run_cli)
from make_checkpoint import GATE_TYPES, VARIANTS

PLAIN_VARIANTS = ("qwen3", "qwen2", "llama")
ROPE_TYPES = ref.ROPE_TYPES

LOW_PRECISION_TOL = 2e-2
TOLERANCE = {"f32": F32_TOL, "bf16": LOW_PRECISION_TOL, "f16": LOW_PRECISION_TOL}
GEN_PROMPT_LEN, GEN_TOKENS = 6, 32
GREEDY_SEEDS = (1, 2, 3)
LOGPROB_ATOL = 1e-3


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------












def reference_greedy(model, prompt, n):
    """Reference greedy tokens and the logits row each was chosen from."""
    cache = ref.KVCache()
    row = model.forward(list(prompt), cache)[-1]
    tokens, rows = [], []
    for _ in range(n):
        tok = int(np.argmax(row))
        tokens.append(tok)
        rows.append(row)
        row = model.forward([tok], cache)[-1]
    return tokens, rows


def log_softmax(row):
    z = row - row.max()
    return z - np.log(np.sum(np.exp(z)))




def engine_generate(binary, model_dir, prompt):
    out = parse_json_object(run_cli(
        binary, "generate", "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
        "--max-tokens", GEN_TOKENS, "--temperature", 0, "--ignore-eos", "--json"))
    for key in ("token_ids", "text", "logprobs"):
        assert key in out, f"generate --json output lacks {key!r}: {out}"
    return out


# ----------------------------------------------------------------------------
# checkpoints (full GPT-2 tokenizer, vocab_size 50304: padded vocabulary)
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    """Factory: checkpoint dir for (variant, dtype, options, seed=1)."""
    yield from checkpoint_fixture(ckpt_root, prefix="parity", seed=1)


def case_id(variant, dtype, kw):
    extra = "-".join(f"{k}{'' if v is True else v}" for k, v in sorted(kw.items()))
    return "-".join(x for x in (variant, dtype, extra) if x)


LOGIT_CASES = (
    [(v, "f32", {}) for v in VARIANTS]
    + [(v, "bf16", {}) for v in VARIANTS]
    + [(v, "f16", {}) for v in ("attnres_block", "attnres_block_reset", "qwen3", "llama")]
    + [
        ("attnres_block", "f32", {"tied": False, "shards": 3}),        # untied + sharded
        ("attnres_block", "f32", {"layers": 7}),                       # P = 3, ragged last block
        ("attnres_full", "f32", {"tied": False}),
        ("attnres_block_reset", "f32", {"layers": 5, "shards": 2}),    # P = 2, resets at 2 and 4
        ("attnres_block_reset", "bf16", {"shards": 2}),
        ("attnres_nobias", "f32", {"shards": 2}),
        ("qwen3", "f32", {"tied": False}),
        ("qwen2", "f32", {"tied": False, "shards": 2}),
        ("llama", "f32", {"tied": True, "shards": 2}),                 # tied llama, sharded
        ("llama", "f32", {"attention_bias": True, "mlp_bias": True}),  # q,k,v,o + MLP biases
    ]
    # Every rope type in transformers 5's config form (rope_parameters + dtype) for each
    # plain architecture, some in 4.x's form too, and yarn with all its optional fields.
    + [(v, "f32", {"rope": r, "config_form": "v5"}) for v in PLAIN_VARIANTS for r in ROPE_TYPES]
    + [
        ("qwen3", "f32", {"rope": "yarn"}),
        ("qwen2", "f32", {"rope": "linear"}),
        ("llama", "f32", {"rope": "dynamic"}),
        ("qwen3", "f32", {"rope": "yarn_custom", "config_form": "v5"}),
        ("llama", "f32", {"rope": "yarn_custom"}),
        ("qwen3", "bf16", {"rope": "yarn", "config_form": "v5"}),
        ("attnres_block", "f32", {"rope": "yarn", "config_form": "v5"}),
    ]
)

# docs/ATTNRES.md §2d: every attnres_mode x attnres_gate_type x null source the open-attnres code
# can produce, through the CLI (cheap: no server). A null source outside the delta modes and
# gate weights under first_layer / pre_gated are written but never read: those cases check
# they are ignored. A few bf16 cases, and delta_block with more blocks than layers.
_DELTA = ("attnres_delta", "attnres_delta_block", "attnres_delta_v")
_CUMULATIVE = ("attnres_block", "attnres_block_reset", "attnres_full")
MODE_CASES = (
    [(v, "f32", {"gate": g, "null_source": n}) for v in _DELTA for g in GATE_TYPES
     for n in (False, True)]
    + [(v, "f32", {"gate": g}) for v in _CUMULATIVE for g in GATE_TYPES]
    + [("attnres_block", "f32", {"gate": "sigmoid_vector", "null_source": True})]
    + [(v, "f32", kw) for v in ("attnres_first_layer", "attnres_pre_gated")
       for kw in ({}, {"gate": "sigmoid_vector", "null_source": True})]
    + [
        ("attnres_delta_block", "f32", {"num_blocks": 10}),  # more blocks than layers: P = 1
        ("attnres_delta_v", "bf16", {"gate": "sigmoid_vector", "null_source": True}),
        ("attnres_delta_block", "bf16", {"gate": "learnable_alpha"}),
        ("attnres_block_reset", "bf16", {"gate": "sigmoid_scalar"}),
        ("attnres_pre_gated", "bf16", {}),
        ("attnres_first_layer", "bf16", {"layers": 6}),
    ]
)
LOGIT_CASES = LOGIT_CASES + MODE_CASES


# ----------------------------------------------------------------------------
# tests
# ----------------------------------------------------------------------------


def test_binary_exists(attnres_bin):
    require_binary(attnres_bin)


@pytest.mark.parametrize("variant,dtype,kw", LOGIT_CASES,
                         ids=[case_id(*c) for c in LOGIT_CASES])
def test_logits_prefill_then_decode(attnres_bin, checkpoint, tmp_path, variant, dtype, kw):
    require_binary(attnres_bin)
    model_dir = checkpoint(variant, dtype=dtype, **kw)
    ids = prompt_ids(0, PROMPT_LEN)
    out = tmp_path / "logits.npy"
    run_cli(attnres_bin, "logits", "--model", model_dir, "--token-ids", ",".join(map(str, ids)),
            "--prefill", PREFILL, "--out", out)
    engine = np.load(out)
    model = default_reference(attnres_bin, model_dir)
    assert engine.dtype == np.float32, f"logits .npy dtype {engine.dtype}, want float32"
    assert engine.shape == (PROMPT_LEN, model.vocab), f"logits shape {engine.shape}"
    assert np.all(np.isfinite(engine)), "non-finite engine logits"
    want = model.logits(ids)

    tol = TOLERANCE[dtype]
    per_row = [relative_error(engine[t], want[t]) for t in range(PROMPT_LEN)]
    rel = relative_error(engine, want)
    assert rel <= tol, (
        f"{case_id(variant, dtype, kw)}: relative error {rel:.3g} > {tol:g} "
        f"(max|a-b|/max|b|); per row (rows >= {PREFILL} are decode steps): "
        + ", ".join(f"{t}:{e:.2g}" for t, e in enumerate(per_row)))


@pytest.mark.parametrize("variant,kw,expect", [
    ("llama", {}, "rope_theta=10000 (rope_theta) rope=llama3 factor=8 original_ctx=64 low/high_freq=1/4"),
    ("qwen3", {"rope": "yarn", "config_form": "v5"},
     "rope_theta=1e+06 (rope_parameters.rope_theta) rope=yarn factor=4 original_ctx=64 beta=32/1 "
     "attention_factor=1.13863"),
    ("qwen2", {"config_form": "v5"}, "rope_theta=1e+06 (rope_parameters.rope_theta) rope=default"),
])
def test_inspect_prints_the_rope_settings_used(attnres_bin, checkpoint, variant, kw, expect):
    """The config line (also the startup log of `attnres serve`) says what RoPE was built from."""
    out = run_cli(attnres_bin, "inspect", "--model", checkpoint(variant, **kw))
    assert expect in out, out


# One greedy run per scaled rope type in the v5 form, and per §2d mode (its gate and null
# source varied across them).
GREEDY_CASES = ([(v, s, {}) for v in VARIANTS for s in GREEDY_SEEDS]
                + [(v, 1, {"rope": r, "config_form": "v5"}) for v in PLAIN_VARIANTS
                   for r in ("linear", "yarn")]
                + [("attnres_delta", 1, {"gate": "sigmoid_scalar", "null_source": True}),
                   ("attnres_delta_block", 1, {"gate": "sigmoid_vector"}),
                   ("attnres_delta_v", 1, {"gate": "learnable_alpha", "null_source": True}),
                   ("attnres_first_layer", 1, {}),
                   ("attnres_pre_gated", 1, {})])


@pytest.mark.parametrize("variant,seed,kw", GREEDY_CASES,
                         ids=[case_id(v, f"seed{s}", kw) for v, s, kw in GREEDY_CASES])
def test_greedy_matches_reference(attnres_bin, checkpoint, variant, seed, kw):
    require_binary(attnres_bin)
    model_dir = checkpoint(variant, seed=seed, **kw)
    prompt = prompt_ids(seed, GEN_PROMPT_LEN)
    got = [int(t) for t in engine_generate(attnres_bin, model_dir, prompt)["token_ids"]]
    want, rows = reference_greedy(ref.load(model_dir), prompt, GEN_TOKENS)
    assert len(got) == GEN_TOKENS, f"--ignore-eos --max-tokens {GEN_TOKENS} gave {len(got)} tokens"
    k = first_divergence(got, want)
    if k is None:
        return
    row = rows[k]
    top2 = np.sort(row)[-2:]
    gap = float(top2[1] - top2[0])
    detail = (f"{variant} seed {seed}: greedy diverges at generated token {k}: engine {got[k]} "
              f"(ref logit {row[got[k]]:.6f}), reference {want[k]} (logit {row[want[k]]:.6f}); "
              f"reference top-2 gap {gap:.3g}\nengine:    {got}\nreference: {want}")
    if gap < NEAR_TIE and row[got[k]] >= top2[0]:
        # A genuine near-tie: either choice is correct, so this is not an engine bug,
        # but it is reported (XFAIL with the details), never silently passed.
        pytest.xfail("NEAR-TIE divergence (not a parity failure): " + detail)
    pytest.fail(detail, pytrace=False)


@pytest.mark.parametrize("variant", VARIANTS)
def test_generate_logprobs_match_reference(attnres_bin, checkpoint, variant):
    """logprobs[j] = log softmax of the reference logits at the chosen token (f32, seed 1)."""
    require_binary(attnres_bin)
    model_dir = checkpoint(variant, seed=1)
    prompt = prompt_ids(1, GEN_PROMPT_LEN)
    out = engine_generate(attnres_bin, model_dir, prompt)
    got = [int(t) for t in out["token_ids"]]
    logprobs = [lp["logprob"] if isinstance(lp, dict) else lp for lp in out["logprobs"]]
    assert len(logprobs) == len(got), f"{len(logprobs)} logprobs for {len(got)} tokens"
    want, rows = reference_greedy(ref.load(model_dir), prompt, GEN_TOKENS)
    k = first_divergence(got, want)
    same = len(got) if k is None else k + 1  # up to the divergence the contexts are equal
    for j in range(same):
        expect = float(log_softmax(rows[j])[got[j]])
        assert abs(float(logprobs[j]) - expect) <= LOGPROB_ATOL, (
            f"{variant}: logprob of token {j} ({got[j]}) is {logprobs[j]}, reference {expect:.6f}")


@pytest.mark.parametrize("variant", ["attnres_block", "qwen3"])
def test_generate_text_is_tokenizer_decode(attnres_bin, checkpoint, variant):
    """`text` is the GPT-2 tokenizer's decode of the generated ids."""
    from tokenizers import Tokenizer

    require_binary(attnres_bin)
    model_dir = checkpoint(variant, seed=1)
    out = engine_generate(attnres_bin, model_dir, prompt_ids(1, GEN_PROMPT_LEN))
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = [int(t) for t in out["token_ids"]]
    accepted = {tok.decode(ids, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=True)}
    assert out["text"] in accepted, f"text {out['text']!r} is none of {sorted(accepted)!r}"
