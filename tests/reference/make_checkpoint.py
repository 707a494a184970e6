#!/usr/bin/env python3
"""Writes a small random HF-format checkpoint directory for tests.

    python3 tests/reference/make_checkpoint.py --variant attnres_block --out DIR \
        [--seed S] [--dtype f32|bf16|f16] [--tied|--untied] [--shards N] [--layers L] ...

Variants:
    attnres_block        2a cumulative, attnres_mode block (6 layers, 3 blocks -> P = 2)
    attnres_full         2a cumulative, attnres_mode full
    attnres_block_reset  2b block sums with reset + final_res_* mix
    attnres_nobias       2a block, no *_res_bias tensors, no attnres_gate_type
    attnres_delta        docs/ATTNRES.md §2d modes (4 layers, 3 blocks -> P = 2): delta,
    attnres_delta_block    delta_block, delta_v, first_layer, pre_gated. They and the
    attnres_delta_v        block / full / block_reset variants take --gate (bias,
    attnres_first_layer    sigmoid_scalar, sigmoid_vector, learnable_alpha) and
    attnres_pre_gated      --null-source; the file then holds every tensor the open-attnres
                           code creates for that config, read by the mode or not.
    qwen3                plain Qwen3 (q_norm/k_norm)
    qwen2                plain Qwen2 (q/k/v biases, no q/k norm)
    llama                plain Llama, rope_scaling llama3, untied lm_head

Config options (any variant):
    --rope TYPE          default, linear, dynamic, llama3, yarn or yarn_custom (yarn with its
                         optional fields set): the scaling written (llama defaults to llama3,
                         the others to default); values chosen to change the short test positions
    --config-form v5     transformers 5's keys: rope_parameters (theta inside) and dtype,
                         instead of 4.x's rope_theta, rope_scaling and torch_dtype

Weights are drawn in float32 from one seeded generator in a fixed order and only then
cast to the requested dtype, so the same (variant, seed) gives bf16/f16 files that are
exactly the f32 file rounded. Output is deterministic in (variant, seed, dtype, options).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for attnres_ref (read-back check)

REPO_ROOT = Path(__file__).resolve().parents[2]
GPT2_TOKENIZER = REPO_ROOT / "engine" / "model" / "assets" / "gpt2" / "tokenizer.json"
GPT2_EOS = 50256  # <|endoftext|>, also bos in GPT-2
TOKENIZER_VOCAB = 50257  # real rows; vocab_size above this is padding

VARIANTS = ("attnres_block", "attnres_full", "attnres_block_reset", "attnres_nobias", "qwen3", "qwen2", "llama")
ATTNRES_VARIANTS = VARIANTS[:4]
# The §2d modes: kept out of VARIANTS so the server-level suites stay compact; the engine-
# level parity test runs them across every gate and null-source option.
MODE_VARIANTS = ("attnres_delta", "attnres_delta_block", "attnres_delta_v", "attnres_first_layer",
                 "attnres_pre_gated")
ALL_VARIANTS = VARIANTS + MODE_VARIANTS
# One checkpoint per way of mixing depth, with the options that exercise most of it (2b with a
# sharded file; delta_v with a vector gate and a null source): for the suites that check a
# numerics setting (--depth-bank-dtype, --linear-input-dtype) across every mode compactly.
MODE_CASES = (
    ("attnres_block", {}),
    ("attnres_full", {}),
    ("attnres_block_reset", {"shards": 2}),
    ("attnres_delta", {}),
    ("attnres_delta_block", {}),
    ("attnres_delta_v", {"gate": "sigmoid_vector", "null_source": True}),
    ("attnres_pre_gated", {}),
    ("attnres_first_layer", {}),
)
GATE_TYPES = ("bias", "sigmoid_scalar", "sigmoid_vector", "learnable_alpha")

# Scalings with a small original context so that they change frequencies at the short
# positions the tests use (yarn's ramp then covers the first dimensions).
ROPE_SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_type": "llama3"},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_custom": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256,
                    "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.25, "truncate": False},
}
CONFIG_FORMS = ("v4", "v5")

NP_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
TORCH_DTYPE_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _defaults(variant: str) -> dict:
    """Per-variant shape and flag defaults (all overridable)."""
    if variant not in ALL_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {ALL_VARIANTS}")
    qwen3_like = variant in ATTNRES_VARIANTS + MODE_VARIANTS or variant == "qwen3"
    return {
        "layers": 6 if variant in ("attnres_block", "attnres_block_reset", "attnres_nobias") else 4,
        "num_blocks": 3,
        # Qwen3-style models decouple head_dim from hidden/heads (the 2a checkpoints
        # use 64 where Qwen3 would use 128): exercise that with 4 x 32 = 128 != 64.
        "head_dim": 32 if qwen3_like else 16,
        "tied": variant != "llama",
        "attention_bias": False,
        "mlp_bias": False,
    }


def _mode_tensors(t, p, variant, hidden, gate, null_source, normal, gain, scalar):
    """The §2d tensors of one layer (prefix p), every one the open-attnres code creates for
    this config, all non-zero and O(1) so that a mode computed wrongly shows in the logits."""
    for side in ("attn", "mlp"):
        if gate == "sigmoid_scalar":
            scalar(p + f"{side}_res_gate_logit", 0.0, 1.0)
        elif gate == "sigmoid_vector":
            normal(p + f"{side}_res_gate_proj.weight", (hidden, hidden), 1.0 / np.sqrt(hidden))
            normal(p + f"{side}_res_gate_proj.bias", (hidden,), 0.5)
        elif gate == "learnable_alpha":
            scalar(p + f"{side}_res_alpha", 0.5, 0.2)
        if null_source:
            normal(p + f"{side}_null_source", (hidden,), 0.5)
        if variant == "attnres_pre_gated":
            normal(p + f"{side}_pre_gate.weight", (hidden, hidden), 1.0 / np.sqrt(hidden))
            normal(p + f"{side}_pre_gate.bias", (hidden,), 0.5)
    if variant == "attnres_delta_v":
        normal(p + "v_res_proj.weight", (1, hidden), 0.3)
        gain(p + "v_res_norm.weight", hidden)


def _rng_tensors(variant, seed, layers, hidden, heads, kv_heads, head_dim, ffn, vocab,
                 tied, attention_bias, mlp_bias, pad_scale=0.01, gate="bias",
                 null_source=False) -> dict[str, np.ndarray]:
    """All tensors as float32, drawn in a fixed order from one generator.

    Scales are chosen so that activations stay O(1), attention and depth softmaxes are
    neither uniform nor one-hot, and final logits are O(1): matrices ~ N(0, c/sqrt(fan_in)),
    norm gains ~ U(0.8, 1.2), AttnRes projections std 0.3 (depth logits std ~2.4) and
    biases ~ N(0, 1) so that depth weights are far from uniform. Nothing is zero.
    """
    rng = np.random.default_rng(seed)
    t: dict[str, np.ndarray] = {}

    def normal(name, shape, std):
        t[name] = rng.normal(0.0, std, size=shape).astype(np.float32)

    def gain(name, n):
        t[name] = rng.uniform(0.8, 1.2, size=(n,)).astype(np.float32)

    def bias0(name):  # 0-dim tensor, as the 2a checkpoints store it
        t[name] = np.array(rng.normal(0.0, 1.0), dtype=np.float32)

    def scalar(name, mean, std):  # a 0-dim gate logit or alpha
        t[name] = np.array(rng.normal(mean, std), dtype=np.float32)

    attnres = variant in ATTNRES_VARIANTS + MODE_VARIANTS
    res_bias = attnres and variant != "attnres_nobias"
    qk_norm = attnres or variant == "qwen3"
    qkv_bias = variant == "qwen2" or attention_bias
    o_bias = attention_bias and variant != "qwen2"

    def pad_small(name):
        # Rows past the tokenizer's vocab are padding: keep them random but small (as in
        # trained models) so greedy decoding never lands on a token that cannot be decoded.
        # A pad_scale > 1 makes them win instead, to test that the server never samples them.
        if vocab > TOKENIZER_VOCAB:
            t[name][TOKENIZER_VOCAB:] *= pad_scale

    normal("model.embed_tokens.weight", (vocab, hidden), 0.1)
    pad_small("model.embed_tokens.weight")
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        p = f"model.layers.{i}."
        gain(p + "input_layernorm.weight", hidden)
        # q/k at 1/sqrt(fan_in) so that attention scores have std ~1 even without q/k norm.
        normal(p + "self_attn.q_proj.weight", (q_out, hidden), 1.0 / np.sqrt(hidden))
        normal(p + "self_attn.k_proj.weight", (kv_out, hidden), 1.0 / np.sqrt(hidden))
        normal(p + "self_attn.v_proj.weight", (kv_out, hidden), 0.6 / np.sqrt(hidden))
        normal(p + "self_attn.o_proj.weight", (hidden, q_out), 0.6 / np.sqrt(q_out))
        if qkv_bias:
            normal(p + "self_attn.q_proj.bias", (q_out,), 0.2)
            normal(p + "self_attn.k_proj.bias", (kv_out,), 0.2)
            normal(p + "self_attn.v_proj.bias", (kv_out,), 0.2)
        if o_bias:
            normal(p + "self_attn.o_proj.bias", (hidden,), 0.05)
        if qk_norm:
            gain(p + "self_attn.q_norm.weight", head_dim)
            gain(p + "self_attn.k_norm.weight", head_dim)
        gain(p + "post_attention_layernorm.weight", hidden)
        normal(p + "mlp.gate_proj.weight", (ffn, hidden), 1.0 / np.sqrt(hidden))
        normal(p + "mlp.up_proj.weight", (ffn, hidden), 1.0 / np.sqrt(hidden))
        normal(p + "mlp.down_proj.weight", (hidden, ffn), 0.6 / np.sqrt(ffn))
        if mlp_bias:
            normal(p + "mlp.gate_proj.bias", (ffn,), 0.1)
            normal(p + "mlp.up_proj.bias", (ffn,), 0.1)
            normal(p + "mlp.down_proj.bias", (hidden,), 0.05)
        if attnres:
            for side in ("attn_res", "mlp_res"):
                normal(p + f"{side}_proj.weight", (1, hidden), 0.3)
                gain(p + f"{side}_norm.weight", hidden)
                if res_bias:
                    bias0(p + f"{side}_bias")
            _mode_tensors(t, p, variant, hidden, gate, null_source, normal, gain, scalar)
    gain("model.norm.weight", hidden)
    if variant == "attnres_block_reset":
        normal("model.final_res_proj.weight", (1, hidden), 0.3)
        gain("model.final_res_norm.weight", hidden)
        bias0("model.final_res_bias")
    if not tied:
        normal("lm_head.weight", (vocab, hidden), 0.1)
        pad_small("lm_head.weight")
    return t


def _config(variant, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied, dtype,
            num_blocks, attention_bias, mlp_bias, gate="bias", null_source=False) -> dict:
    """config.json with the fields real HF configs of each family carry."""
    c = {
        "architectures": None,
        "model_type": None,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "tie_word_embeddings": tied,
        "torch_dtype": TORCH_DTYPE_NAMES[dtype],
        "bos_token_id": GPT2_EOS,
        "eos_token_id": GPT2_EOS,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "transformers_version": "4.51.0",
    }
    if variant in ATTNRES_VARIANTS + MODE_VARIANTS or variant == "qwen3":
        c["architectures"] = ["Qwen3ForCausalLM"]
        c["model_type"] = "qwen3"
        c.update(attention_bias=attention_bias, use_sliding_window=False, sliding_window=None,
                 max_window_layers=layers)
    if variant in ATTNRES_VARIANTS + MODE_VARIANTS:
        c["architectures"] = ["Qwen3AttnResForCausalLM"]
        c["model_type"] = "qwen3_attnres"
        c["attnres_mode"] = ("full" if variant == "attnres_full" else "block"
                             if variant in ATTNRES_VARIANTS else variant[len("attnres_"):])
        c["attnres_num_blocks"] = num_blocks
        c["attnres_recency_bias_init"] = 1.0  # the file's biases are random: never trust the init
        if variant != "attnres_nobias":
            c["attnres_gate_type"] = gate
        if null_source:
            c["attnres_use_null_source"] = True
    elif variant == "qwen2":
        # Real Qwen2 configs have no attention_bias field: q/k/v biases are implied.
        c.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 use_sliding_window=False, sliding_window=None, max_window_layers=layers)
    elif variant == "llama":
        # Small theta and original context so that llama3 scaling changes frequencies in
        # all three regimes (kept, smoothed, divided by factor) at the short test positions.
        c.update(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
                 rope_theta=10000.0, attention_bias=attention_bias, mlp_bias=mlp_bias,
                 pretraining_tp=1,
                 rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64, "rope_type": "llama3"})
    return c


def _apply_rope_options(c: dict, rope: str | None, config_form: str) -> dict:
    """Replaces the variant's rope scaling by `rope` and writes the chosen config form."""
    if rope is not None:
        if rope not in ROPE_SCALINGS:
            raise ValueError(f"rope must be one of {sorted(ROPE_SCALINGS)}")
        c["rope_scaling"] = ROPE_SCALINGS[rope]
    if config_form not in CONFIG_FORMS:
        raise ValueError(f"config_form must be one of {CONFIG_FORMS}")
    if config_form == "v4":
        return c
    # transformers 5 serialises theta inside rope_parameters and renames torch_dtype.
    scaling = c.pop("rope_scaling") or {"rope_type": "default"}
    rope_parameters = {**scaling, "rope_theta": c.pop("rope_theta")}
    out = {k: v for k, v in c.items() if k != "torch_dtype"}
    out.update(rope_parameters=rope_parameters, dtype=c["torch_dtype"], transformers_version="5.0.0")
    return out


def _write_weights(out: Path, tensors: dict[str, np.ndarray], shards: int) -> None:
    meta = {"format": "pt"}
    if shards <= 1:
        save_file(tensors, str(out / "model.safetensors"), metadata=meta)
        return
    # Balance bytes over shards, keeping names in sorted order (as HF's sharding does).
    names = sorted(tensors)
    total = sum(tensors[n].nbytes for n in names)
    target = total / shards
    groups: list[list[str]] = [[] for _ in range(shards)]
    acc, g = 0, 0
    for n in names:
        if acc >= target * (g + 1) and g < shards - 1 and groups[g]:
            g += 1
        groups[g].append(n)
        acc += tensors[n].nbytes
    weight_map = {}
    for gi, group in enumerate(groups):
        fname = f"model-{gi + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(out / fname), metadata=meta)
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_tokenizer(out: Path) -> None:
    shutil.copyfile(GPT2_TOKENIZER, out / "tokenizer.json")
    tok_cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": None,
        "add_bos_token": False,
        "model_max_length": 512,
        "chat_template": CHATML_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")


def make_checkpoint(out, variant: str, seed: int = 0, dtype: str = "f32", tied: bool | None = None,
                    shards: int = 1, layers: int | None = None, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, head_dim: int | None = None, ffn: int = 128,
                    num_blocks: int | None = None, vocab_size: int = 50304,
                    attention_bias: bool | None = None, mlp_bias: bool | None = None,
                    pad_scale: float = 0.01, rope: str | None = None,
                    config_form: str = "v4", gate: str = "bias",
                    null_source: bool = False) -> Path:
    """Writes the checkpoint into `out` (created) and returns it as a Path. pad_scale scales
    the LM head's padding rows (ids past the GPT-2 tokenizer's 50257 tokens)."""
    d = _defaults(variant)
    layers = d["layers"] if layers is None else layers
    head_dim = d["head_dim"] if head_dim is None else head_dim
    tied = d["tied"] if tied is None else tied
    num_blocks = d["num_blocks"] if num_blocks is None else num_blocks
    attention_bias = d["attention_bias"] if attention_bias is None else attention_bias
    mlp_bias = d["mlp_bias"] if mlp_bias is None else mlp_bias
    if dtype not in NP_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(NP_DTYPES)}")
    if heads % kv_heads:
        raise ValueError("heads must be a multiple of kv_heads")
    if gate not in GATE_TYPES:
        raise ValueError(f"gate must be one of {GATE_TYPES}")
    if (gate != "bias" or null_source) and variant not in ATTNRES_VARIANTS + MODE_VARIANTS:
        raise ValueError("--gate / --null-source need an AttnRes variant")

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)  # re-generating into a dir must not mix layouts
    master = _rng_tensors(variant, seed, layers, hidden, heads, kv_heads, head_dim, ffn, vocab_size,
                          tied, attention_bias, mlp_bias, pad_scale, gate, null_source)
    tensors = {k: v.astype(NP_DTYPES[dtype]) for k, v in master.items()}
    _write_weights(out, tensors, shards)
    config = _config(variant, layers, hidden, heads, kv_heads, head_dim, ffn, vocab_size, tied, dtype,
                     num_blocks, attention_bias, mlp_bias, gate, null_source)
    config = _apply_rope_options(config, rope, config_form)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"bos_token_id": GPT2_EOS, "eos_token_id": GPT2_EOS, "do_sample": False,
           "transformers_version": "4.51.0"}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    _write_tokenizer(out)
    _verify_read_back(out, tensors)
    return out


def _verify_read_back(out: Path, tensors: dict[str, np.ndarray]) -> None:
    """Reads the files back with the reference's own reader: same names, dtypes, bytes."""
    from attnres_ref import read_checkpoint_tensors  # same directory

    back = read_checkpoint_tensors(out)
    if set(back) != set(tensors):
        raise RuntimeError(f"read-back names differ: {sorted(set(back) ^ set(tensors))[:5]}")
    for name, arr in tensors.items():
        b = back[name]
        if b.dtype != arr.dtype or b.shape != arr.shape or b.tobytes() != arr.tobytes():
            raise RuntimeError(f"read-back mismatch for {name}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", required=True, choices=ALL_VARIANTS)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="f32", choices=sorted(NP_DTYPES))
    ap.add_argument("--tied", dest="tied", action="store_true", default=None)
    ap.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--num-blocks", type=int)
    ap.add_argument("--vocab-size", type=int, default=50304)
    ap.add_argument("--attention-bias", action="store_true", default=None)
    ap.add_argument("--mlp-bias", action="store_true", default=None)
    ap.add_argument("--rope", choices=sorted(ROPE_SCALINGS))
    ap.add_argument("--config-form", default="v4", choices=CONFIG_FORMS)
    ap.add_argument("--gate", default="bias", choices=GATE_TYPES)
    ap.add_argument("--null-source", action="store_true")
    a = ap.parse_args(argv)
    out = make_checkpoint(a.out, a.variant, seed=a.seed, dtype=a.dtype, tied=a.tied, shards=a.shards,
                          layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                          head_dim=a.head_dim, ffn=a.ffn, num_blocks=a.num_blocks,
                          vocab_size=a.vocab_size, attention_bias=a.attention_bias, mlp_bias=a.mlp_bias,
                          rope=a.rope, config_form=a.config_form, gate=a.gate,
                          null_source=a.null_source)
    print(out)


if __name__ == "__main__":
    main()
