"""Independent NumPy reference forward for AttnRes Serve (float64 compute).

Written straight from the math (docs/ATTNRES.md) and from how HF transformers
computes the Qwen3 / Qwen2 / Llama backbones. It deliberately uses the *direct*
softmax form of the depth mix (all logits over bank + [partial], softmax, weighted
sum) and never the two-phase / online form the engine uses, so the two stay
independent. Weights are read as stored (f32 / f16 / bf16) and widened exactly to
float64; every computation then runs in float64.

API:
    m = load(model_dir)    (kv_cache_dtype="bfloat16": K and V rounded to bf16 as they
                            enter the KV cache, like the engine's --kv-cache-dtype bfloat16;
                            depth_bank_dtype="bfloat16": every depth-bank entry rounded to
                            bf16 as it is appended, like --depth-bank-dtype bfloat16;
                            linear_input_dtype="bfloat16": the input rows of every linear
                            whose weight is stored in bf16 rounded to bf16 first, like
                            --linear-input-dtype bfloat16 (and a bf16 model's own PyTorch
                            code); with both this and kv_cache_dtype "bfloat16", attention's
                            queries and its softmax numerators are rounded to bf16 as well
                            before they meet K and V, the denominator summed unrounded, as the
                            engine's bf16-input attention does. Otherwise independent; all
                            default to "float64" = no rounding)
    m.logits(ids)          -> np.ndarray [T, vocab]   full causal forward
    m.greedy(prompt, n)    -> list[int]               argmax, no EOS stop
    m.depth_weights(ids)   -> list of [T, n_sources]  one per depth mix, in order
    m.depth_names()        -> names of those mixes ("layers.0.attn", ..., "final";
                              delta_v's V-stream mix is "layers.0.attn_v")
    m.depth_matrices(ids)  -> [T, mixes, width] alphas laid out as sublayer x source slot
    m.depth_sources()      -> the label of each source slot (column) of those matrices

Every attnres_mode, attnres_gate_type and null source of docs/ATTNRES.md §2d is written out as
its own function below (_cumulative, _block_reset, _delta, _first_layer), each from that
page's pseudocode.
    m.forward(ids, cache)  -> logits of `ids` appended after the cache's tokens
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

# ----------------------------------------------------------------------------
# safetensors reading (hand-written on purpose: numpy's safetensors loader
# cannot read BF16, and an own reader is one more independent check)
# ----------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Returns {name: array in its stored dtype} for one .safetensors file."""
    raw = Path(path).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * dt.itemsize:
            raise ValueError(f"{path}: {name}: byte range does not match shape/dtype")
        arr = np.frombuffer(raw, dtype=dt, count=count, offset=base + begin)
        out[name] = arr.reshape(shape).copy()
    return out


def read_checkpoint_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint dir, single file or sharded via the index."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(model_dir / shard))
        missing = set(weight_map) - set(tensors)
        if missing:
            raise ValueError(f"index names tensors not in any shard: {sorted(missing)[:5]}")
        return tensors
    return read_safetensors(model_dir / "model.safetensors")


# ----------------------------------------------------------------------------
# Backbone pieces, as HF transformers computes them
# ----------------------------------------------------------------------------


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * g over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return z / np.sum(z, axis=axis, keepdims=True)


ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def rope_settings(config: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from either config form, as transformers 5 reads them.

    transformers 5 writes "rope_parameters" (theta and scaling keys in one object); 4.x
    wrote top-level "rope_theta" and "rope_scaling". Transformers 5 converts the old form:
    a non-empty rope_scaling replaces rope_parameters, theta is the chosen object's
    rope_theta, else the top-level rope_theta, else 10000 (the Llama/Qwen2/Qwen3 default);
    llama3/yarn take original_max_position_embeddings from the top level, else the
    object, else max_position_embeddings. The scaling returned has those filled in.
    """
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    theta = params.get("rope_theta") or config.get("rope_theta") or 10000.0
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise NotImplementedError(f"rope type {kind!r}")
    if kind == "default":
        return float(theta), None
    params["rope_type"] = kind
    if kind in ("llama3", "yarn"):
        params["original_max_position_embeddings"] = config.get(
            "original_max_position_embeddings",
            params.get("original_max_position_embeddings", config["max_position_embeddings"]))
    return float(theta), params


def yarn_attention_factor(scaling: dict) -> float:
    """YaRN's cos/sin multiplier: attention_factor, else 0.1 m ln(s) + 1 (ratio of two m's)."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    s = scaling["factor"]

    def mscale(m):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
    return mscale(1.0)


def rope_attention_factor(scaling: dict | None) -> float:
    return yarn_attention_factor(scaling) if scaling and scaling["rope_type"] == "yarn" else 1.0


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """inv_freq = 1/theta^(arange(0,hd,2)/hd), scaled as HF's rope types do (float64)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in ("default", "dynamic"):
        # dynamic NTK: base * (factor * L / max_pos - (factor - 1))^(d / (d - 2)) with
        # L = max(seq_len, max_pos): the base itself while L <= max_position_embeddings.
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, scaling)
    if kind != "llama3":
        raise NotImplementedError(f"rope_scaling type {kind!r}")
    # HF _compute_llama3_parameters, line for line.
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


def _yarn_inv_freq(inv_freq: np.ndarray, head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """YaRN (arXiv 2309.00071): dimension i keeps its frequency when it turns more than
    beta_fast times over the original context, is divided by factor when it turns fewer than
    beta_slow times, and blends linearly (in i) between those two dimensions."""
    factor = scaling["factor"]
    context = scaling["original_max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def dim_for(rotations):  # solve context / (2 pi theta^(2i/d)) = rotations for i
        return head_dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    return inv_freq / factor * ramp + inv_freq * (1.0 - ramp)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray,
               attention_factor: float = 1.0) -> np.ndarray:
    """x: [heads, T, hd]; HF rotate-half layout; cos and sin times attention_factor (yarn)."""
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, hd]
    return x * (np.cos(emb) * attention_factor) + rotate_half(x) * (np.sin(emb) * attention_factor)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """HF nn.Linear: weight [out, in]."""
    y = x @ w.T
    return y if b is None else y + b


# ----------------------------------------------------------------------------
# KV cache (ordinary attention only: depth mixing is per token and needs none)
# ----------------------------------------------------------------------------


@dataclass
class KVCache:
    keys: list = field(default_factory=list)    # per layer: [n_kv, T, hd] (after RoPE)
    values: list = field(default_factory=list)  # per layer: [n_kv, T, hd]

    @property
    def length(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded the way the engine stores a bf16 KV cache: to f32 (where the engine computes
    K and V), then to bf16 with round-to-nearest-even (ml_dtypes), widened back to float64."""
    return x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


KV_CACHE_DTYPES = ("float64", "bfloat16")
DEPTH_BANK_DTYPES = ("float64", "bfloat16")
LINEAR_INPUT_DTYPES = ("float64", "bfloat16")


class Model:
    def __init__(self, config: dict, tensors: dict[str, np.ndarray],
                 kv_cache_dtype: str = "float64", depth_bank_dtype: str = "float64",
                 linear_input_dtype: str = "float64"):
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}")
        if depth_bank_dtype not in DEPTH_BANK_DTYPES:
            raise ValueError(f"depth_bank_dtype must be one of {DEPTH_BANK_DTYPES}")
        if linear_input_dtype not in LINEAR_INPUT_DTYPES:
            raise ValueError(f"linear_input_dtype must be one of {LINEAR_INPUT_DTYPES}")
        # "bfloat16": every K and V row is rounded (round_to_bf16) when it enters the cache,
        # i.e. before attention reads it, for the tokens of the current step too.
        self.kv_cache_dtype = kv_cache_dtype
        # "bfloat16": every depth-bank entry is rounded (round_to_bf16) when it is appended
        # (see _bank_entry); every later read of it (logit, rms, weighted sum) sees the
        # rounded value. The running partial, sublayer outputs added into it, null sources,
        # queries and gates stay float64.
        self.depth_bank_dtype = depth_bank_dtype
        # "bfloat16": a linear whose weight is stored in bf16 (projections, gates, the LM
        # head) reads its input rounded with round_to_bf16 (_linear); the rest stays float64.
        self.linear_input_dtype = linear_input_dtype
        self.config = config
        self.stored = tensors  # as stored (for dtype checks)
        self.w = {k: v.astype(np.float64) for k, v in tensors.items()}
        c = config
        self.model_type = c["model_type"]
        self.d = c["hidden_size"]
        self.n_layers = c["num_hidden_layers"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv = c.get("num_key_value_heads") or self.n_heads
        self.head_dim = c.get("head_dim") or self.d // self.n_heads
        self.vocab = c["vocab_size"]
        self.eps = c["rms_norm_eps"]
        theta, scaling = rope_settings(c)
        self.inv_freq = rope_inv_freq(self.head_dim, theta, scaling)
        self.rope_attention_factor = rope_attention_factor(scaling)

        self.attnres = "model.layers.0.attn_res_proj.weight" in self.w
        self.block_reset = "model.final_res_proj.weight" in self.w  # variant 2b
        self.mode = c.get("attnres_mode", "block")
        if self.attnres and self.block_reset and self.mode != "block":
            raise ValueError("final_res_* (variant 2b) requires attnres_mode 'block'")
        # Missing keys take the open-attnres code's defaults (docs/ATTNRES.md §2d).
        nb = min(c.get("attnres_num_blocks") or 8, self.n_layers)
        self.block_layers = math.ceil(self.n_layers / nb)  # P
        self.gate_type = c.get("attnres_gate_type") or "bias"
        self.null_source = bool(c.get("attnres_use_null_source", False))
        if self.attnres and self.mode not in ("block", "full", "delta", "delta_block", "delta_v",
                                              "first_layer", "pre_gated"):
            raise ValueError(f"unknown attnres_mode {self.mode!r}")

        # LM head: HF ties when tie_word_embeddings (these model classes default it to
        # False); a checkpoint without lm_head.weight can only mean tied.
        tied = c.get("tie_word_embeddings", False) or "lm_head.weight" not in self.w
        self.lm_head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
        self.lm_head = self.w[self.lm_head_name]
        if self.lm_head.shape[0] != self.vocab:
            raise ValueError(f"LM head rows {self.lm_head.shape[0]} != vocab_size {self.vocab}")

    # --- small accessors -------------------------------------------------------

    def _get(self, name: str) -> np.ndarray | None:
        return self.w.get(name)

    def _layer(self, i: int, suffix: str) -> np.ndarray | None:
        return self.w.get(f"model.layers.{i}.{suffix}")

    def _linear(self, x: np.ndarray, prefix: str) -> np.ndarray:
        """The linear `prefix`.weight (+ `prefix`.bias when present) over x; with
        linear_input_dtype "bfloat16" and a bf16-stored weight, over x rounded to bf16."""
        weight = f"{prefix}.weight"
        return linear(self._linear_input(x, weight), self.w[weight], self.w.get(f"{prefix}.bias"))

    def _linear_input(self, x: np.ndarray, weight: str) -> np.ndarray:
        bf16 = self.stored[weight].dtype == np.dtype(ml_dtypes.bfloat16)
        return round_to_bf16(x) if self.linear_input_dtype == "bfloat16" and bf16 else x

    # --- sublayers (public so the self-check can drive its own two-phase loop) --

    def attn_sublayer(self, i: int, h: np.ndarray, positions: np.ndarray, cache: KVCache | None,
                      h_v: np.ndarray | None = None) -> np.ndarray:
        """Attention sublayer output for layer i given its (unnormalised) input h [T, d].
        h_v (delta_v): v comes from input_layernorm(h_v) instead, q and k from h."""
        L = lambda s: self._layer(i, s)
        x = rms_norm(h, L("input_layernorm.weight"), self.eps)
        x_v = x if h_v is None else rms_norm(h_v, L("input_layernorm.weight"), self.eps)
        T, hd = h.shape[0], self.head_dim
        P = f"model.layers.{i}.self_attn"
        q = self._linear(x, f"{P}.q_proj")
        k = self._linear(x, f"{P}.k_proj")
        v = self._linear(x_v, f"{P}.v_proj")
        q = q.reshape(T, self.n_heads, hd).transpose(1, 0, 2)  # [H, T, hd]
        k = k.reshape(T, self.n_kv, hd).transpose(1, 0, 2)
        v = v.reshape(T, self.n_kv, hd).transpose(1, 0, 2)
        if L("self_attn.q_norm.weight") is not None:  # Qwen3: per-head RMSNorm before RoPE
            q = rms_norm(q, L("self_attn.q_norm.weight"), self.eps)
            k = rms_norm(k, L("self_attn.k_norm.weight"), self.eps)
        q = apply_rope(q, positions, self.inv_freq, self.rope_attention_factor)
        k = apply_rope(k, positions, self.inv_freq, self.rope_attention_factor)
        if self.kv_cache_dtype == "bfloat16":
            k, v = round_to_bf16(k), round_to_bf16(v)
        if cache is not None:
            if len(cache.keys) > i:
                k = np.concatenate([cache.keys[i], k], axis=1)
                v = np.concatenate([cache.values[i], v], axis=1)
                cache.keys[i], cache.values[i] = k, v
            else:
                cache.keys.append(k)
                cache.values.append(v)
        group = self.n_heads // self.n_kv  # GQA: query head j uses kv head j // group
        k = np.repeat(k, group, axis=0)
        v = np.repeat(v, group, axis=0)
        bf16_inputs = self.kv_cache_dtype == "bfloat16" and self.linear_input_dtype == "bfloat16"
        if bf16_inputs:
            q = round_to_bf16(q)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd)  # [H, T, S]
        key_pos = np.arange(k.shape[1])
        causal = key_pos[None, :] <= positions[:, None]
        scores = np.where(causal[None], scores, -np.inf)
        if bf16_inputs:  # the numerators rounded for the V product, the denominator not
            num = np.exp(scores - scores.max(axis=-1, keepdims=True))
            ctx = (round_to_bf16(num) @ v) / num.sum(axis=-1, keepdims=True)
        else:
            ctx = softmax(scores, axis=-1) @ v  # [H, T, hd]
        ctx = ctx.transpose(1, 0, 2).reshape(T, self.n_heads * hd)
        return self._linear(ctx, f"{P}.o_proj")

    def mlp_sublayer(self, i: int, h: np.ndarray) -> np.ndarray:
        x = rms_norm(h, self._layer(i, "post_attention_layernorm.weight"), self.eps)
        P = f"model.layers.{i}.mlp"
        gate = self._linear(x, f"{P}.gate_proj")
        up = self._linear(x, f"{P}.up_proj")
        return self._linear(silu(gate) * up, f"{P}.down_proj")

    def mix_params(self, prefix: str):
        """(w [d], g [d], bias or None) of one depth mix; prefix like 'model.layers.3.attn_res'."""
        w = self.w[f"{prefix}_proj.weight"].reshape(-1)
        g = self.w[f"{prefix}_norm.weight"]
        b = self.w.get(f"{prefix}_bias")
        return w, g, (None if b is None else float(b))

    def mix(self, sources: list[np.ndarray], prefix: str, name: str, trace: list | None,
            use_bias: bool = True, labels: list[str] | None = None,
            columns: list[int] | None = None) -> np.ndarray:
        """Direct form: logit_j = w . RMSNorm(src_j) (+ bias on the LAST source when use_bias
        and the checkpoint has one), softmax, sum. labels / columns: what each source holds and
        its column in depth_matrices (default: columns 0..n-1)."""
        w, g, b = self.mix_params(prefix)
        S = np.stack(sources)                       # [n_src, T, d]
        logits = rms_norm(S, g, self.eps) @ w       # [n_src, T]
        if b is not None and use_bias:
            logits[-1] += b
        alpha = softmax(logits, axis=0)
        h = np.sum(alpha[:, :, None] * S, axis=0)
        if trace is not None:
            trace.append({"name": name, "alpha": alpha.T.copy(), "h": h.copy(), "sources": S.copy(),
                          "labels": labels or [""] * len(sources),
                          "columns": columns or list(range(len(sources)))})
        return h

    def gate(self, i: int, side: str, x: np.ndarray, h_mix: np.ndarray) -> np.ndarray:
        """attnres_gate_type's blend of x (the sublayer's partial before any reset) and the
        mix (docs/ATTNRES.md §2d); side is 'attn' or 'mlp'."""
        p = f"model.layers.{i}.{side}"
        if self.gate_type == "sigmoid_scalar":
            s = sigmoid(self.w[f"{p}_res_gate_logit"])
        elif self.gate_type == "sigmoid_vector":
            s = sigmoid(self._linear(x, f"{p}_res_gate_proj"))
        elif self.gate_type == "learnable_alpha":
            s = self.w[f"{p}_res_alpha"]
        elif self.gate_type == "bias":
            return h_mix
        else:
            raise ValueError(f"unknown attnres_gate_type {self.gate_type!r}")
        return (1 - s) * x + s * h_mix

    def _bank_entry(self, v: np.ndarray) -> np.ndarray:
        """The value a depth-bank entry holds once appended: v itself (float64), or v rounded
        to bf16 (depth_bank_dtype "bfloat16"). Only the bank copy is rounded: the caller keeps
        using the unrounded v as its partial / residual stream."""
        return round_to_bf16(v) if self.depth_bank_dtype == "bfloat16" else v

    # --- the variants, each written as docs/ATTNRES.md's pseudocode ---------------------

    def hidden_states(self, ids, positions, cache=None, trace=None) -> np.ndarray:
        """Final normed hidden [T, d]."""
        e = self.w["model.embed_tokens.weight"][np.asarray(ids)]
        if not self.attnres:
            return self._plain(e, positions, cache)
        if self.block_reset:
            return self._block_reset(e, positions, cache, trace)
        if self.mode in ("delta", "delta_block", "delta_v", "pre_gated"):
            return self._delta(e, positions, cache, trace)
        if self.mode == "first_layer":
            return self._first_layer(e, positions, cache, trace)
        return self._cumulative(e, positions, cache, trace)

    def _plain(self, e, positions, cache):  # 2c
        x = e
        for i in range(self.n_layers):
            x = x + self.attn_sublayer(i, x, positions, cache)
            x = x + self.mlp_sublayer(i, x)
        return rms_norm(x, self.w["model.norm.weight"], self.eps)

    def _cumulative(self, e, positions, cache, trace):  # 2a
        full = self.mode == "full"
        P = self.block_layers
        bank, x = [self._bank_entry(e)], e
        names = ["embedding"]
        for i in range(self.n_layers):
            lab = names + ["partial (running sum)"]
            h = self.mix(bank + [x], f"model.layers.{i}.attn_res", f"layers.{i}.attn", trace, labels=lab)
            x = x + self.attn_sublayer(i, self.gate(i, "attn", x, h), positions, cache)
            if full:
                bank, names = bank + [self._bank_entry(x)], names + [f"after layer {i} attention"]
            lab = names + ["partial (running sum)"]
            h = self.mix(bank + [x], f"model.layers.{i}.mlp_res", f"layers.{i}.mlp", trace, labels=lab)
            x = x + self.mlp_sublayer(i, self.gate(i, "mlp", x, h))
            if full or (i + 1) % P == 0:
                bank, names = bank + [self._bank_entry(x)], names + [f"after layer {i}"]
        return rms_norm(x, self.w["model.norm.weight"], self.eps)

    def _block_label(self, k: int) -> str:
        P = self.block_layers
        first, last = (k - 1) * P, min(k * P, self.n_layers) - 1
        span = f"(layer {first})" if first == last else f"(layers {first}-{last})"
        return ("embedding + " if k == 1 else "") + f"block {k} {span}"

    def _block_reset(self, e, positions, cache, trace):  # 2b
        P = self.block_layers
        bank, p = [self._bank_entry(e)], e
        names = ["embedding"]
        for i in range(self.n_layers):
            lab = names + [self._block_label(len(bank))]
            h = self.mix(bank + [p], f"model.layers.{i}.attn_res", f"layers.{i}.attn", trace, labels=lab)
            h = self.gate(i, "attn", p, h)  # x = the partial before the reset
            if i > 0 and i % P == 0:  # after the attention-side mix
                bank, names = bank + [self._bank_entry(p)], names + [self._block_label(len(bank))]
                p = np.zeros_like(p)
            p = p + self.attn_sublayer(i, h, positions, cache)
            lab = names + [self._block_label(len(bank))]
            h = self.mix(bank + [p], f"model.layers.{i}.mlp_res", f"layers.{i}.mlp", trace, labels=lab)
            p = p + self.mlp_sublayer(i, self.gate(i, "mlp", p, h))
        lab = names + [self._block_label(len(bank))]
        h = self.mix(bank + [p], "model.final_res", "final", trace, labels=lab)  # never gated
        return rms_norm(h, self.w["model.norm.weight"], self.eps)

    def _delta_mix(self, i, side, query, bank, names, x, trace, name):
        """x + mix_nobias([null?] + bank); pre_gated gates the sources first."""
        prefix = f"model.layers.{i}.{side}"
        sources, labels = list(bank), list(names)
        if self.mode == "pre_gated":
            g = sigmoid(self._linear(x, f"{prefix}_pre_gate"))
            sources = [g * s for s in sources]
        elif self.null_source:
            null = self.w[f"{prefix}_null_source"]
            sources = [np.broadcast_to(null, x.shape)] + sources
            labels = ["null source"] + labels
        return x + self.mix(sources, f"model.layers.{i}.{query}", name, trace, use_bias=False,
                            labels=labels)

    def _delta(self, e, positions, cache, trace):  # delta, delta_block, delta_v, pre_gated
        P = self.block_layers
        per_block = self.mode == "delta_block"
        bank, names, x, x_start = [self._bank_entry(e)], ["embedding"], e, e
        gated = self.mode != "pre_gated"
        for i in range(self.n_layers):
            h = self._delta_mix(i, "attn", "attn_res", bank, names, x, trace, f"layers.{i}.attn")
            h = self.gate(i, "attn", x, h) if gated else h
            h_v = None
            if self.mode == "delta_v":  # the V stream: its own query, the attention's gate
                h_v = self._delta_mix(i, "attn", "v_res", bank, names, x, trace, f"layers.{i}.attn_v")
                h_v = self.gate(i, "attn", x, h_v)
            out = self.attn_sublayer(i, h, positions, cache, h_v=h_v)
            x = x + out
            if not per_block:
                bank = bank + [self._bank_entry(out)]
                names = names + [f"attention output of layer {i}"]
            h = self._delta_mix(i, "mlp", "mlp_res", bank, names, x, trace, f"layers.{i}.mlp")
            out = self.mlp_sublayer(i, self.gate(i, "mlp", x, h) if gated else h)
            x = x + out
            if not per_block:
                bank, names = bank + [self._bank_entry(out)], names + [f"mlp output of layer {i}"]
            elif (i + 1) % P == 0:
                k = len(bank)
                first, last = (k - 1) * P, min(k * P, self.n_layers) - 1
                span = f"(layer {first})" if first == last else f"(layers {first}-{last})"
                bank = bank + [self._bank_entry(x - x_start)]
                names = names + [f"block {k} delta {span}"]
                x_start = x
        return rms_norm(x, self.w["model.norm.weight"], self.eps)

    def _first_layer(self, e, positions, cache, trace):
        """Layer 0 unmixed; later sublayers mix [x, out_1] (out_1 = layer 0's MLP output),
        no bias, no gate. The engine lists out_1's column first: columns [1, 0]."""
        x = e
        out_1 = None
        for i in range(self.n_layers):
            lab = ["partial (running sum)", "mlp output of layer 0"]
            h = x if out_1 is None else self.mix([x, out_1], f"model.layers.{i}.attn_res", f"layers.{i}.attn",
                                                 trace, use_bias=False, labels=lab, columns=[1, 0])
            x = x + self.attn_sublayer(i, h, positions, cache)
            h = x if out_1 is None else self.mix([x, out_1], f"model.layers.{i}.mlp_res", f"layers.{i}.mlp",
                                                 trace, use_bias=False, labels=lab, columns=[1, 0])
            out = self.mlp_sublayer(i, h)
            x = x + out
            if i == 0:
                out_1 = self._bank_entry(out)  # a bank entry; x above took the unrounded out
        return rms_norm(x, self.w["model.norm.weight"], self.eps)

    # --- public API ---------------------------------------------------------------

    def forward(self, ids, cache: KVCache | None = None, trace: list | None = None) -> np.ndarray:
        """Logits [len(ids), vocab] of ids placed after the tokens already in `cache`."""
        start = cache.length if cache is not None else 0
        positions = np.arange(start, start + len(ids))
        hidden = self.hidden_states(ids, positions, cache, trace)
        return self._linear_input(hidden, self.lm_head_name) @ self.lm_head.T

    def logits(self, token_ids) -> np.ndarray:
        return self.forward(list(token_ids))

    def greedy(self, prompt_ids, n: int, decodable: int | None = None) -> list[int]:
        """n argmax tokens after the prompt (no EOS stop), using the KV cache; with
        `decodable`, over ids [0, decodable) only (the rest are padding rows)."""
        cache = KVCache()
        logits = self.forward(list(prompt_ids), cache)
        out = []
        for _ in range(n):
            tok = int(np.argmax(logits[-1][:decodable]))
            out.append(tok)
            logits = self.forward([tok], cache)
        return out

    def depth_weights(self, token_ids) -> list[np.ndarray]:
        """alpha per depth mix (order of depth_names()), each [T, n_sources]."""
        trace = []
        self.forward(list(token_ids), trace=trace)
        return [t["alpha"] for t in trace]

    def _trace_one_token(self) -> list:
        trace = []
        self.forward([0], trace=trace)
        return trace

    def depth_matrices(self, token_ids) -> np.ndarray:
        """Every token's depth-attention matrix (docs/ATTNRES.md §5): [T, mixes, width], row k is
        mix k (order of depth_names()) and its alpha over its sources sits in the columns the
        mix names (bank + [partial] in columns [0, n_sources) for 2a / 2b, the partial in column
        n_sources - 1; [null] + bank for the delta modes; first_layer's [x, out_1] in columns
        [1, 0]); other cells are NaN. width = one past the last column any mix uses. A plain
        model: [T, 0, 0]. Position t's matrix is that of the forward at t: depth mixing never
        looks at other tokens, so one causal pass over prompt + generated tokens gives every
        step's."""
        trace = []
        self.forward(list(token_ids), trace=trace)
        T = len(token_ids)
        width = max((max(t["columns"]) + 1 for t in trace), default=0)
        out = np.full((T, len(trace), width), np.nan)
        for k, t in enumerate(trace):
            out[:, k, t["columns"]] = t["alpha"]
        return out

    def depth_names(self) -> list[str]:
        if not self.attnres:
            return []
        return [t["name"] for t in self._trace_one_token()]

    def depth_sources(self) -> list[str]:
        """Column labels of depth_matrices: what each source slot holds. A column shared by a
        bank entry and an earlier mix's partial (2a) is named after the bank entry."""
        if not self.attnres:
            return []
        trace = self._trace_one_token()
        width = max(max(t["columns"]) + 1 for t in trace)
        labels = [None] * width
        partial = {"partial (running sum)"}
        for t in trace:
            for col, lab in zip(t["columns"], t["labels"]):
                if labels[col] is None or (labels[col] in partial and lab not in partial):
                    labels[col] = lab
        return labels


def load(model_dir, kv_cache_dtype: str = "float64", depth_bank_dtype: str = "float64",
         linear_input_dtype: str = "float64") -> Model:
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    return Model(config, read_checkpoint_tensors(model_dir), kv_cache_dtype=kv_cache_dtype,
                 depth_bank_dtype=depth_bank_dtype, linear_input_dtype=linear_input_dtype)
