"""Engine vs transformers itself, on tiny models that transformers saves (opt-in).

Skipped unless torch and transformers import. To run it:

    .venv/bin/pip install torch transformers
    ATTNRES_BUILD_DIR=build .venv/bin/python -m pytest tests/python/test_transformers_parity.py -q

For Qwen3, Qwen2 and Llama and every rope type transformers accepts, a random model is
built from a transformers config class and written with save_pretrained (transformers 5
writes rope_parameters and dtype; the "v4" cases rewrite that config.json into 4.x's
rope_theta / rope_scaling / torch_dtype). transformers then loads the same directory the
engine loads, so both read the same file. Checked: `attnres logits` (8-token prefill, then
decode steps) against transformers' logits, f32, relative error max|a-b|/max|b| <= 1e-4;
greedy tokens identical (a divergence at a near-tie is reported as XFAIL); the NumPy
reference's inv_freq and attention factor against transformers' own rope functions; and a
clear engine error for the rope type it does not serve (longrope).
"""

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attnres_ref as ref  # noqa: E402
from make_checkpoint import GPT2_EOS, _write_tokenizer  # noqa: E402
from engine_cli import (  # noqa: E402
    F32_TOL, NEAR_TIE, PREFILL, PROMPT_LEN, first_divergence, prompt_ids, relative_error, run_cli)

VOCAB = 50304  # the GPT-2 tokenizer's 50257 rows, padded
MAX_POSITIONS = 512
GREEDY_TOKENS = 16

# Scalings chosen (with theta 10000 and a small original context) so that each changes the
# frequencies at the short positions used here.
SCALINGS = {
    "default": {},
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_custom": {"factor": 8.0, "original_max_position_embeddings": 256, "beta_fast": 16,
                    "beta_slow": 2, "attention_factor": 1.25, "truncate": False},
}
ARCHITECTURES = ("qwen3", "qwen2", "llama")


def rope_parameters(rope):
    kind = "yarn" if rope.startswith("yarn") else rope
    return {"rope_type": kind, "rope_theta": 10000.0, **SCALINGS[rope]}


def hf_config(arch, rope):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=GPT2_EOS,
                  eos_token_id=GPT2_EOS, rope_parameters=rope_parameters(rope))
    if arch == "qwen3":
        return transformers.Qwen3Config(head_dim=32, **common)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common)
    return transformers.LlamaConfig(**common)


def randomize(model, seed):
    """Weights that make O(1) activations and logits (transformers' init gives ~uniform ones)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=gen))
            elif p.dim() == 1:  # biases
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def as_v4(config_path):
    """Rewrites a transformers 5 config.json into 4.x's keys."""
    c = json.loads(config_path.read_text())
    params = c.pop("rope_parameters")
    c["rope_theta"] = params.pop("rope_theta")
    c["rope_scaling"] = None if params["rope_type"] == "default" else params
    c["torch_dtype"] = c.pop("dtype", "float32")
    config_path.write_text(json.dumps(c, indent=2) + "\n")


@pytest.fixture(scope="module")
def saved_model(ckpt_root):
    """Factory: (arch, rope, form) -> directory saved by transformers; removed at the end."""
    made = {}

    def get(arch, rope, form):
        key = (arch, rope, form)
        if key not in made:
            out = ckpt_root / f"hf_{arch}_{rope}_{form}"
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(hf_config(arch, rope),
                                                                  dtype=torch.float32)
            randomize(model, seed=len(made) + 1)
            model.save_pretrained(out)
            if form == "v4":
                as_v4(out / "config.json")
            _write_tokenizer(out)
            made[key] = out
        return made[key]

    yield get
    for path in made.values():
        shutil.rmtree(path, ignore_errors=True)


def hf_model(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


CASES = ([(a, r, "v5") for a in ARCHITECTURES for r in SCALINGS]
         + [(a, r, "v4") for a in ARCHITECTURES for r in ("linear", "yarn")])


@pytest.mark.parametrize("arch,rope,form", CASES, ids=["-".join(c) for c in CASES])
def test_logits_match_transformers(attnres_bin, saved_model, tmp_path, arch, rope, form):
    model_dir = saved_model(arch, rope, form)
    ids = prompt_ids(0, PROMPT_LEN)
    out = tmp_path / "logits.npy"
    run_cli(attnres_bin, "logits", "--model", model_dir, "--token-ids", ",".join(map(str, ids)),
            "--prefill", PREFILL, "--out", out)
    engine = np.load(out)
    want = hf_logits(hf_model(model_dir), ids)
    assert engine.shape == want.shape
    rel = relative_error(engine, want)
    assert rel <= F32_TOL, f"{arch} {rope} ({form} config): relative error {rel:.3g} > {F32_TOL:g}"


@pytest.mark.parametrize("arch,rope", [(a, r) for a in ARCHITECTURES for r in SCALINGS])
def test_greedy_matches_transformers(attnres_bin, saved_model, arch, rope):
    model_dir = saved_model(arch, rope, "v5")
    prompt = prompt_ids(1, 6)
    out = json.loads(run_cli(
        attnres_bin, "generate", "--model", model_dir, "--prompt-ids", ",".join(map(str, prompt)),
        "--max-tokens", GREEDY_TOKENS, "--temperature", 0, "--ignore-eos", "--json"
    ).strip().splitlines()[-1])
    got = [int(t) for t in out["token_ids"]]
    model, ids, want, rows = hf_model(model_dir), list(prompt), [], []
    for _ in range(GREEDY_TOKENS):  # full recompute each step: no cache to disagree with
        row = hf_logits(model, ids)[-1]
        want.append(int(np.argmax(row)))
        rows.append(row)
        ids.append(want[-1])
    k = first_divergence(got, want)
    if k is None:
        return
    top2 = np.sort(rows[k])[-2:]
    detail = f"{arch} {rope}: diverges at token {k}\nengine:       {got}\ntransformers: {want}"
    if top2[1] - top2[0] < NEAR_TIE:
        pytest.xfail("NEAR-TIE divergence: " + detail)
    pytest.fail(detail, pytrace=False)


@pytest.mark.parametrize("rope", list(SCALINGS))
def test_reference_rope_matches_transformers(rope):
    """The NumPy reference's frequencies and attention factor are transformers' own."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = hf_config("qwen3", rope)
    kind = config.rope_parameters["rope_type"]
    theta, scaling = ref.rope_settings(json.loads(config.to_json_string()))
    want_freq, want_factor = (
        ROPE_INIT_FUNCTIONS[kind](config, "cpu") if kind != "default"
        else transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding.compute_default_rope_parameters(
            config))
    got = ref.rope_inv_freq(32, theta, scaling)
    np.testing.assert_allclose(got, want_freq.double().numpy(), rtol=1e-6)
    assert ref.rope_attention_factor(scaling) == pytest.approx(want_factor, rel=1e-9)


def test_engine_rejects_longrope_by_name(attnres_bin, saved_model, tmp_path):
    model_dir = saved_model("llama", "default", "v5")
    bad = tmp_path / "longrope"
    shutil.copytree(model_dir, bad)
    c = json.loads((bad / "config.json").read_text())
    c["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0,
                            "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                            "original_max_position_embeddings": 64}
    (bad / "config.json").write_text(json.dumps(c))
    import subprocess
    proc = subprocess.run([str(attnres_bin), "logits", "--model", str(bad), "--token-ids", "1,2",
                           "--prefill", "2", "--out", str(tmp_path / "x.npy")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "config.json: field rope_parameters: unsupported rope_type 'longrope'" in proc.stderr
