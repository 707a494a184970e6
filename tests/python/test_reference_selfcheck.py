"""Checks of the NumPy reference itself (no C++ engine needed).

(a) the reference's direct-softmax depth mix equals an independent two-phase /
    online-softmax execution (docs/ATTNRES.md §3) to 1e-10 in float64;
(b) with all res_proj weights and biases zeroed, every depth mix is a uniform average;
(c) prompt-at-once equals prefill + token-by-token decode with the reference KV cache;
(d) bf16/f16 checkpoints read back as exactly the f32 values rounded.

Checkpoints here use a small vocabulary (512) so the whole file runs in seconds.
"""

import json
import math

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

import attnres_ref as ref
from make_checkpoint import ATTNRES_VARIANTS, MODE_VARIANTS, VARIANTS, make_checkpoint

SMALL_VOCAB = 512


@pytest.fixture(scope="module")
def small_ckpt(ckpt_root):
    """Factory: small-vocab checkpoint, generated once per distinct argument set."""
    cache = {}

    def get(variant, seed=0, **kw):
        key = (variant, seed, tuple(sorted(kw.items())))
        if key not in cache:
            name = "self_" + "_".join(str(x) for x in (variant, seed, *sorted(kw.items())))
            name = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in name)
            cache[key] = make_checkpoint(ckpt_root / name, variant, seed=seed,
                                         vocab_size=kw.pop("vocab_size", SMALL_VOCAB), **kw)
        return cache[key]

    return get


def random_ids(seed, n, vocab=SMALL_VOCAB):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


# ----------------------------------------------------------------------------
# (a) two-phase equals direct
# ----------------------------------------------------------------------------


def depth_plan(model):
    """The op list of one forward, built from config + weights as a flat plan.

    Ops: ("mix", prefix), ("attn", i), ("mlp", i), ("snapshot",): bank += [p],
    ("reset",): bank += [p]; p = 0. The bank only changes at snapshot/reset, so the
    mixes between two such ops form one block for Phase 1.
    """
    c = model.config
    L = c["num_hidden_layers"]
    P = math.ceil(L / c.get("attnres_num_blocks", 1))
    block_reset = "model.final_res_proj.weight" in model.w
    full = c.get("attnres_mode") == "full"
    ops = []
    for i in range(L):
        ops.append(("mix", f"model.layers.{i}.attn_res"))
        if block_reset and i > 0 and i % P == 0:
            ops.append(("reset",))
        ops.append(("attn", i))
        if not block_reset and full:
            ops.append(("snapshot",))
        ops.append(("mix", f"model.layers.{i}.mlp_res"))
        ops.append(("mlp", i))
        if not block_reset and (full or (i + 1) % P == 0):
            ops.append(("snapshot",))
    if block_reset:
        ops.append(("mix", "model.final_res"))
    return ops


def folded_query(model, prefix):
    """RMSNorm gain folded into the pseudo-query: w . (g * src / rms) = (w*g) . src / rms."""
    w, g, b = model.mix_params(prefix)
    return w * g, (0.0 if b is None else b)


def source_logit(src, q, eps):
    rms = np.sqrt(np.mean(src * src, axis=-1) + eps)  # once per source and token
    return (src @ q) / rms


def phase1(bank, queries, eps):
    """One pass over the bank for all S queries of a block: (m, s, o) per query."""
    B = np.stack(bank)                                        # [N, T, d]
    rms = np.sqrt(np.mean(B * B, axis=-1) + eps)              # [N, T]
    Q = np.stack(queries)                                     # [S, d]
    logits = np.einsum("ntd,sd->snt", B, Q) / rms[None]       # [S, N, T]
    m = logits.max(axis=1)                                    # [S, T]
    z = np.exp(logits - m[:, None])
    return m, z.sum(axis=1), np.einsum("snt,ntd->std", z, B)  # m, s [S,T], o [S,T,d]


def phase2(m, s, o, p, q, bias, eps):
    """Online-softmax merge of the partial p into one query's bank summary."""
    ql = source_logit(p, q, eps) + bias
    mm = np.maximum(m, ql)
    a, c = np.exp(m - mm), np.exp(ql - mm)
    return (a[:, None] * o + c[:, None] * p) / (a * s + c)[:, None]


def two_phase_forward(model, ids):
    """Logits and per-mix inputs h, computed with Algorithm 1 instead of the direct form."""
    ops = depth_plan(model)
    eps = model.eps
    positions = np.arange(len(ids))
    e = model.w["model.embed_tokens.weight"][np.asarray(ids)]
    bank, p = [e], e
    summaries, passes, hs = {}, 0, []
    for k, op in enumerate(ops):
        kind = op[0]
        if kind == "mix":
            if k not in summaries:  # first mix of a block: Phase 1 for the whole block
                block = []
                for j in range(k, len(ops)):
                    if ops[j][0] in ("snapshot", "reset"):
                        break
                    if ops[j][0] == "mix":
                        block.append(j)
                m, s, o = phase1(bank, [folded_query(model, ops[j][1])[0] for j in block], eps)
                passes += 1
                for n, j in enumerate(block):
                    summaries[j] = (m[n], s[n], o[n])
            q, bias = folded_query(model, op[1])
            h = phase2(*summaries[k], p, q, bias, eps)
            hs.append(h)
        elif kind == "attn":
            p = p + model.attn_sublayer(op[1], h, positions, None)
        elif kind == "mlp":
            p = p + model.mlp_sublayer(op[1], h)
        elif kind == "snapshot":
            bank = bank + [p]
        elif kind == "reset":
            bank, p = bank + [p], np.zeros_like(p)
    final = h if ops[-1][0] == "mix" else p  # 2b ends with the final mix, 2a with x
    hidden = ref.rms_norm(final, model.w["model.norm.weight"], eps)
    return hidden @ model.lm_head.T, hs, passes


TWO_PHASE_CASES = [
    # (variant, extra make_checkpoint args, expected number of Phase-1 passes)
    ("attnres_block", {}, 3),                    # 6 layers, 3 blocks: banks [e], +b1, +b2
    ("attnres_block", {"layers": 7}, 3),         # P = ceil(7/3) = 3, ragged last block
    ("attnres_full", {}, 8),                     # bank grows after every sublayer: 2L
    ("attnres_block_reset", {}, 3),
    ("attnres_block_reset", {"layers": 5}, 3),   # P = 2: resets at layers 2 and 4
    ("attnres_nobias", {}, 3),
]


@pytest.mark.parametrize("variant,kw,passes", TWO_PHASE_CASES,
                         ids=[f"{v}-{'-'.join(f'{k}{x}' for k, x in kw.items()) or 'default'}"
                              for v, kw, _ in TWO_PHASE_CASES])
def test_two_phase_equals_direct(small_ckpt, variant, kw, passes):
    for seed in (11, 12):  # fresh random weights and tokens
        model = ref.load(small_ckpt(variant, seed=seed, **kw))
        ids = random_ids(seed, 9)
        trace = []
        direct = model.forward(ids, trace=trace)
        two_phase, hs, n_passes = two_phase_forward(model, ids)
        assert n_passes == passes
        assert len(hs) == len(trace)
        for t, h in zip(trace, hs):
            np.testing.assert_allclose(h, t["h"], rtol=0, atol=1e-10, err_msg=t["name"])
        np.testing.assert_allclose(two_phase, direct, rtol=0, atol=1e-10)
        # the depth weights must not be degenerate, or the check proves little
        row_max = np.concatenate([a.max(axis=1) for a in model.depth_weights(ids) if a.shape[1] > 2])
        assert np.median(row_max) < 0.95 and np.std(row_max) > 0.05


# ----------------------------------------------------------------------------
# (b) zero pseudo-queries -> uniform mixing, by hand
# ----------------------------------------------------------------------------


def expected_source_counts(model):
    """n_sources per mix, from the counting rules of docs/ATTNRES.md (partial included)."""
    c = model.config
    L = c["num_hidden_layers"]
    P = math.ceil(L / c["attnres_num_blocks"])
    if model.block_reset:
        counts = []
        for i in range(L):
            counts += [1 + (0 if i == 0 else (i - 1) // P) + 1, 1 + i // P + 1]
        return counts + [1 + (L - 1) // P + 1]
    if c["attnres_mode"] == "full":
        return [n for i in range(L) for n in (2 + 2 * i, 3 + 2 * i)]
    return [n for i in range(L) for n in (2 + i // P,) * 2]


@pytest.mark.parametrize("variant", ["attnres_block", "attnres_full", "attnres_block_reset"])
def test_zero_queries_mix_uniformly(small_ckpt, variant):
    path = small_ckpt(variant, seed=3)
    config = json.loads((path / "config.json").read_text())
    tensors = ref.read_checkpoint_tensors(path)
    for name in tensors:
        if "_res_proj." in name or name.endswith("_res_bias"):
            tensors[name] = np.zeros_like(tensors[name])
    model = ref.Model(config, tensors)
    ids = random_ids(3, 5)
    trace = []
    model.forward(ids, trace=trace)

    assert [t["alpha"].shape[1] for t in trace] == expected_source_counts(model)
    for t in trace:
        n = t["alpha"].shape[1]
        np.testing.assert_allclose(t["alpha"], 1.0 / n, rtol=0, atol=1e-15, err_msg=t["name"])
        np.testing.assert_allclose(t["h"], t["sources"].mean(axis=0), rtol=0, atol=1e-14)

    # By hand for layer 0: attention sees [e, e] -> h = e; the MLP sees the mean of
    # e and x1 = e + attn_0(e) in 2a ([e, x1, x1] in full), and [e, attn_0(e)+e] in 2b.
    e = model.w["model.embed_tokens.weight"][ids]
    np.testing.assert_allclose(trace[0]["h"], e, rtol=0, atol=1e-15)
    x1 = e + model.attn_sublayer(0, e, np.arange(len(ids)), None)
    want = (e + 2 * x1) / 3 if variant == "attnres_full" else (e + x1) / 2
    np.testing.assert_allclose(trace[1]["h"], want, rtol=0, atol=1e-14)


# ----------------------------------------------------------------------------
# (c) KV cache: prompt at once == token by token
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_kv_cache_matches_full_forward(small_ckpt, variant):
    model = ref.load(small_ckpt(variant, seed=5))
    ids = random_ids(5, 10)
    full = model.logits(ids)

    cache = ref.KVCache()
    rows = [model.forward(ids[:4], cache)]  # prefill 4
    for t in ids[4:]:
        rows.append(model.forward([t], cache))  # one decode step each
    assert cache.length == len(ids)
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=0, atol=1e-10)

    # causality: a prefix forward gives exactly the prefix rows of the longer forward
    np.testing.assert_allclose(model.logits(ids[:6]), full[:6], rtol=0, atol=1e-10)
    # and the greedy helper (which uses the cache) starts with the argmax of the last row
    assert model.greedy(ids, 1) == [int(np.argmax(full[-1]))]


def test_llama3_rope_scaling_regimes():
    """The test llama config hits all three llama3 regimes: kept, smoothed, divided."""
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_type": "llama3"}
    plain = ref.rope_inv_freq(16, 10000.0, None)
    scaled = ref.rope_inv_freq(16, 10000.0, scaling)
    wavelen = 2 * np.pi / plain
    high = wavelen < 64 / 4.0
    low = wavelen > 64 / 1.0
    mid = ~high & ~low
    assert high.any() and low.any() and mid.any()
    np.testing.assert_array_equal(scaled[high], plain[high])
    np.testing.assert_allclose(scaled[low], plain[low] / 8.0, rtol=1e-15)
    assert np.all((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 8.0))


# ----------------------------------------------------------------------------
# (d) dtypes, shards and the hand-written reader
# ----------------------------------------------------------------------------


def _header(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n])


@pytest.mark.parametrize("dtype,tag,np_dtype", [("bf16", "BF16", ml_dtypes.bfloat16),
                                                 ("f16", "F16", np.float16)])
def test_low_precision_reads_back_as_rounded_f32(small_ckpt, dtype, tag, np_dtype):
    f32 = ref.read_checkpoint_tensors(small_ckpt("attnres_block_reset", seed=7))
    low_path = small_ckpt("attnres_block_reset", seed=7, dtype=dtype)
    low = ref.read_checkpoint_tensors(low_path)
    assert set(low) == set(f32)
    assert all(info["dtype"] == tag for k, info in _header(low_path / "model.safetensors").items()
               if k != "__metadata__")
    for name, arr in f32.items():
        assert low[name].dtype == np_dtype and low[name].shape == arr.shape, name
        rounded = arr.astype(np_dtype)
        assert low[name].tobytes() == rounded.tobytes(), name
    # the model widens exactly the stored values
    model = ref.load(low_path)
    np.testing.assert_array_equal(model.w["model.norm.weight"],
                                  f32["model.norm.weight"].astype(np_dtype).astype(np.float64))
    assert json.loads((low_path / "config.json").read_text())["torch_dtype"] == \
        {"bf16": "bfloat16", "f16": "float16"}[dtype]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_reader_agrees_with_safetensors_package(small_ckpt, dtype):
    path = small_ckpt("qwen2", seed=8, dtype=dtype)
    mine = ref.read_checkpoint_tensors(path)
    theirs = load_file(str(path / "model.safetensors"))
    assert set(mine) == set(theirs)
    for name in theirs:
        assert mine[name].dtype == theirs[name].dtype
        np.testing.assert_array_equal(mine[name], theirs[name])


def test_sharded_equals_single_file(small_ckpt):
    single = ref.read_checkpoint_tensors(small_ckpt("llama", seed=9))
    path = small_ckpt("llama", seed=9, shards=3)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert shard_files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in single.values())
    assert not (path / "model.safetensors").exists()
    sharded = ref.read_checkpoint_tensors(path)
    assert set(sharded) == set(single) == set(index["weight_map"])
    for name in single:
        np.testing.assert_array_equal(sharded[name], single[name])
    assert "lm_head.weight" in single  # llama is untied by default


def test_generator_is_deterministic_and_shaped(small_ckpt, ckpt_root):
    a = small_ckpt("attnres_nobias", seed=4)
    b = make_checkpoint(ckpt_root / "self_determinism_copy", "attnres_nobias", seed=4,
                        vocab_size=SMALL_VOCAB)
    for f in ("model.safetensors", "config.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    t = ref.read_checkpoint_tensors(a)
    cfg = json.loads((a / "config.json").read_text())
    assert "attnres_gate_type" not in cfg and not any(k.endswith("_res_bias") for k in t)
    assert "lm_head.weight" not in t and cfg["tie_word_embeddings"] is True
    assert t["model.layers.0.attn_res_proj.weight"].shape == (1, 64)
    assert t["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    assert all(np.all(v != 0) for v in t.values())  # fresh random, never zeros

    reset = ref.read_checkpoint_tensors(small_ckpt("attnres_block_reset", seed=4))
    assert reset["model.final_res_bias"].shape == () and reset["model.layers.0.mlp_res_bias"].shape == ()


@pytest.mark.parametrize("variant", ATTNRES_VARIANTS)
def test_attnres_variant_detection(small_ckpt, variant):
    model = ref.load(small_ckpt(variant, seed=0))
    assert model.attnres
    assert model.block_reset == (variant == "attnres_block_reset")
    assert model.mode == ("full" if variant == "attnres_full" else "block")
    assert len(model.depth_names()) == len(model.depth_weights([1, 2, 3]))


# ----------------------------------------------------------------------------
# (e) the §2d modes: cache consistency, and the gates' two ends
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", MODE_VARIANTS)
def test_modes_kv_cache_matches_full_forward(small_ckpt, variant):
    model = ref.load(small_ckpt(variant, seed=5, gate="sigmoid_vector", null_source=True))
    ids = random_ids(6, 8)
    full = model.logits(ids)
    cache = ref.KVCache()
    rows = [model.forward(ids[:5], cache)] + [model.forward([t], cache) for t in ids[5:]]
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", ["attnres_block", "attnres_full", "attnres_delta",
                                     "attnres_delta_block", "attnres_delta_v"])
def test_alpha_zero_is_the_plain_model_and_alpha_one_is_the_ungated_mix(small_ckpt, variant):
    """learnable_alpha blends h = (1 - a) x + a h_mix: with a = 0 every sublayer reads x, which
    is the plain pre-norm model on the same backbone; with a = 1 it is the mode without a gate.
    Both ends are computed by other code paths of the reference (_plain, gate 'bias')."""
    d = small_ckpt(variant, seed=3, gate="learnable_alpha", null_source=True)
    ids = random_ids(7, 6)
    model = ref.load(d)
    gated = model.logits(ids)
    alphas = [k for k in model.w if k.endswith("_res_alpha")]
    assert alphas and all(abs(float(model.w[k])) > 0.05 for k in alphas)  # O(1), not the init
    for k in alphas:
        model.w[k] = np.float64(0.0)
    plain = ref.load(d)
    plain.attnres = False
    np.testing.assert_allclose(model.logits(ids), plain.logits(ids), rtol=0, atol=1e-10)
    for k in alphas:
        model.w[k] = np.float64(1.0)
    ungated = ref.load(d)
    ungated.gate_type = "bias"
    np.testing.assert_allclose(model.logits(ids), ungated.logits(ids), rtol=0, atol=1e-10)
    assert not np.allclose(gated, ungated.logits(ids), atol=1e-3)  # the gate matters
