"""Quantized weights: where they come from, checked against NumPy (tests/reference/
quantized_formats.py, written from the formats' specs, not from the engine's code).

(a) `attnres quantize --quantization int8|int4` writes every projection, the embedding (tied:
    once) as U8 rows that equal the NumPy quantizer's bit for bit, everything else byte for
    byte as the source stored it, and quantization_config {"quant_method": "attnres"}. The
    int4 recipe's formats (qf.tensor_format): the checkpoint here (hidden 128, ffn 256) has
    int4k and int6k (down_proj: rows of 256) and their B32 fallbacks int4 and int6 (rows of
    128); a wider one (hidden 256) has int6k embedding rows, rows of two super-blocks, and
    crafted rows that reach the quantizer's corners (equal values, zeros of both signs,
    blocks above 0 that store no min, scales that round to 0, f16's extremes, rounding ties).
(b) compressed-tensors W4A16 (pack-quantized, symmetric and asymmetric, groups of 32 / 64 /
    128) and W8A16 (int-quantized per channel, naive-quantized in groups) checkpoints, written
    here as llm-compressor lays them out, are converted exactly: the rows `attnres quantize`
    writes from them dequantize to the NumPy dequantization of the source, bit for bit.
(c) What is refused, with the messages users see.
(d) End to end (needs the CPU backend's kernels for quantized weights; skipped, with the
    backend's refusal as the reason, where the build has none):
    - logits of --quantization int8 / int4 (int4 on both checkpoints above: every int4
      format, the embedding and tied LM head as int6 and as int6k) against the float64
      reference forward run on the NumPy-dequantized weights, whose linears over quantized
      weights read their inputs quantized as the CPU kernels define it
      (tests/python/quantized_reference.py: int8 per block of 32, f32 arithmetic): relative
      error (max|engine - ref| / max|ref|) <= QUANT_LOGITS_TOL. The weights and the
      activations' rounding are then the same on both sides, except for the activations
      within 2e-4 of a step of a rounding boundary, which the engine's f32 activations may
      put on either side (one int8 step there moves the logits by 1e-3 to 3e-2; a bf16
      checkpoint puts first-layer activations exactly on ties): those are rounded as fits the
      engine's logits best, a handful of choices per model. What is left is f32 against
      float64 accumulation (2e-7 to 3e-7 here). Without modelling the activations' rounding
      the error is ~3% on this checkpoint, so the tolerance tells a kernel that computes what
      it documents from one that does not.
    - the checkpoint `attnres quantize` wrote gives the same logits as quantizing at load,
      bit for bit (the same rows), and a compressed-tensors W4A16 checkpoint matches the
      reference on its own dequantized weights.
    - int8 greedy tokens (GREEDY_TOKENS of them) equal bf16's on at least GREEDY_MIN_EQUAL of
      GREEDY_PROMPTS prompts. The float64 reference on the NumPy-dequantized int8 weights of
      this checkpoint gives 11 of 16 (16 of 16 first tokens), the engine 12: a random
      checkpoint's top two logits are close (median gap 2% of the largest logit, where int8
      moves logits by ~3%), so longer continuations part sooner than a trained model's would.
"""

import json
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import attnres_ref as ref
import quantized_formats as qf
from checkpoint_cache import checkpoint_fixture
from engine_cli import PREFILL, PROMPT_LEN, prompt_ids, relative_error, require_binary, run_cli
from make_checkpoint import make_checkpoint
from quantized_reference import fit_boundary_rounding, reference_on

QUANT_LOGITS_TOL = 1e-5
GREEDY_PROMPTS, GREEDY_TOKENS, GREEDY_MIN_EQUAL = 16, 4, 10
UNSUPPORTED = "is not supported by the"  # the backend's refusal (engine/model/transformer.cpp)
# Widths that are multiples of 128, so that groups of 32, 64 and 128 all divide every row;
# down_proj's rows (ffn) are one super-block of the K256 formats, the other rows are not.
SHAPE = {"hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "ffn": 256}
# Every row a multiple of 256 (down_proj's two super-blocks): int4 stores no B32 matrix. Three
# layers: layer 2 has the 6-bit v_proj / down_proj.
WIDE_SHAPE = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 512, "layers": 3}


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="quant", seed=5)


def quantize_cli(binary, model, out, *flags):
    return run_cli(binary, "quantize", "--model", model, "--output", out, *flags)


def cli_error(binary, *args):
    """stderr of a command that must fail."""
    require_binary(binary)
    proc = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0, f"expected a failure: {args}\n{proc.stdout[-2000:]}"
    return proc.stderr


def linear_names(tensors):
    return [n for n in tensors if n.endswith(".weight") and
            n[:-len(".weight")].endswith(qf.LINEAR_SUFFIXES)]


@pytest.mark.parametrize("fmt", qf.FORMATS)
def test_quantize_command_writes_the_numpy_rows(attnres_bin, checkpoint, tmp_path, fmt):
    src = checkpoint("attnres_block", dtype="bf16", **SHAPE)
    out = tmp_path / fmt
    quantize_cli(attnres_bin, src, out, "--quantization", fmt)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "attnres", "format": fmt}
    for f in ("tokenizer.json", "generation_config.json"):
        assert (out / f).read_bytes() == (src / f).read_bytes()
    source, _ = qf.read_safetensors_with_metadata(src / "model.safetensors")
    written, metadata = qf.read_safetensors_with_metadata(out / "model.safetensors")
    matrices = linear_names(source) + ["model.embed_tokens.weight"]  # tied: no lm_head
    assert set(written) == set(source)
    layers = config["num_hidden_layers"]
    formats = {qf.tensor_format(fmt, n, layers, source[n].shape[1]) for n in matrices}
    assert formats == ({"int4", "int4k", "int6", "int6k"} if fmt == "int4" else {"int8"})
    for name, t in source.items():
        w = written[name]
        if name in matrices:
            f = qf.tensor_format(fmt, name, layers, t.shape[1])
            assert json.loads(metadata[name]) == {"format": f, "shape": list(t.shape)}
            assert_rows_equal(w, qf.quantize(t.astype(np.float32), f), f, t.shape[1], name)
        else:
            assert w.dtype == t.dtype and w.tobytes() == t.tobytes(), name


def assert_rows_equal(got, expected, fmt, cols, name):
    """The engine's rows equal NumPy's; else the first differing row, with the scales both
    sides stored (K256: per super-block) for the report."""
    assert got.dtype == np.uint8 and got.shape == expected.shape, (name, got.shape, expected.shape)
    bad = np.nonzero((got != expected).any(axis=1))[0]
    if not len(bad):
        return
    r = bad[0]
    where = np.nonzero(got[r] != expected[r])[0]
    detail = ""
    if fmt == "int4k":
        (d, dmin, sc, mn), (d2, dmin2, sc2, mn2) = (qf.q4k_params(x[r:r + 1], cols)
                                                    for x in (got, expected))
        detail = (f"\n engine d {d} dmin {dmin}\n  sc {sc.tolist()}\n  mn {mn.tolist()}"
                  f"\n numpy  d {d2} dmin {dmin2}\n  sc {sc2.tolist()}\n  mn {mn2.tolist()}")
    elif fmt == "int6k":
        (d, sc), (d2, sc2) = (qf.q6k_scales(x[r:r + 1], cols) for x in (got, expected))
        detail = (f"\n engine d {d} sc {sc.tolist()}\n numpy  d {d2} sc {sc2.tolist()}")
    raise AssertionError(f"{name} ({fmt}): {len(bad)} rows differ from NumPy's; row {r}, "
                         f"bytes {where[:16].tolist()}{detail}")


def edge_case_rows(rows, cols, seed):
    """[rows, cols] float32 for a K256 matrix: crafted rows first (each super-block a case the
    quantizer treats apart), then random ones whose scale and offset change per block."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols // 32, 32)) * np.exp(
        rng.uniform(-4, 4, (rows, cols // 32, 1))) + rng.uniform(-2, 1, (rows, cols // 32, 1))
    w = (0.01 * w).reshape(rows, cols)
    normal = lambda n: 0.02 * rng.standard_normal(n)  # noqa: E731
    grid = np.arange(32) % 16 * 0.0625  # d 0.0625, m 0: no error, no other candidate wins
    ties = np.concatenate([[0.0, 15.0], np.arange(15) + 0.5, np.arange(15)])  # d 1, m 0: ties
    cases = [
        np.zeros(cols),                                            # all zero
        np.full(cols, -0.0),                                       # negative zeros
        np.full(cols, 0.37),                                       # one value throughout
        np.concatenate([normal(96), np.full(32, -0.8125), normal(cols - 128)]),  # a flat block
        rng.uniform(0.01, 1.0, cols),                              # all > 0: every min clamps
        np.concatenate([rng.uniform(0.0, 1.0, 32), normal(cols - 32)]),  # one block >= 0
        np.concatenate([rng.uniform(0.0, 1.0, 256), rng.uniform(-1.0, -0.1, cols - 256)]),
        rng.uniform(-1.0, -0.01, cols),                            # all < 0
        normal(cols) * 10.0 ** -np.repeat(np.arange(cols // 32) % 8, 32),  # sc rounding to 0
        normal(cols) * 10.0 ** -np.repeat(np.arange(cols // 16) % 16 / 2, 16),  # 16-wide ones
        np.concatenate([rng.uniform(-60000, 60000, 32), normal(cols - 32)]),  # near f16 max
        np.concatenate([rng.uniform(-60000, -30000, 32), rng.uniform(10, 60000, 32),
                        normal(cols - 64)]),                       # large mins, large scales
        rng.uniform(-1e-6, 1e-6, cols),                            # f16 subnormal scales
        np.concatenate([rng.uniform(-1e-7, 1e-7, 128), normal(cols - 128)]),  # scales -> 0
        np.concatenate([np.full(31, 0.01), [5.0], normal(cols - 32)]),  # one outlier
        np.concatenate([rng.permutation(ties), normal(cols - 32)]),  # exact rounding ties
        np.concatenate([-rng.permutation(ties), normal(cols - 32)]),
        np.concatenate([np.tile([-1.0, 1.0], 16), normal(cols - 32)]),  # two values
        # Mins of 0 and above only: a block on an exact grid from 0 (its min +0.0) and
        # blocks above 0 (M_j +0.0 for both), either first.
        np.concatenate([grid, rng.uniform(0.1, 1.0, cols - 32)]),
        np.concatenate([rng.uniform(0.1, 1.0, 32), grid, rng.uniform(0.1, 1.0, cols - 64)]),
    ]
    for i, case in enumerate(cases):
        w[i] = case
    return w.astype(np.float32)


def test_quantize_command_writes_the_numpy_rows_of_edge_cases(attnres_bin, checkpoint, tmp_path):
    """The int4 recipe on a checkpoint whose rows are all multiples of 256 (WIDE_SHAPE), its
    K256 matrices given the rows of edge_case_rows: the engine writes NumPy's rows."""
    src = checkpoint("qwen3", dtype="f32", **WIDE_SHAPE)
    tensors, _ = qf.read_safetensors_with_metadata(src / "model.safetensors")
    crafted = {"model.layers.0.mlp.down_proj.weight": "int4k",
               "model.layers.0.self_attn.q_proj.weight": "int4k",
               "model.layers.2.mlp.down_proj.weight": "int6k",
               "model.layers.2.self_attn.v_proj.weight": "int6k"}
    for seed, name in enumerate(crafted):
        tensors[name] = edge_case_rows(*tensors[name].shape, seed=seed)
    # Sub-blocks near f16's largest symmetric scale (2e6 / 31 ~ 64500): int6k alone.
    tensors["model.layers.2.mlp.down_proj.weight"][31, :16] = np.linspace(-2e6, 1.9e6, 16)
    emb = "model.embed_tokens.weight"
    tensors[emb][:64] = edge_case_rows(64, tensors[emb].shape[1], seed=9)
    edge = tmp_path / "edge"
    edge.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (edge / f.name).write_bytes(f.read_bytes())
    save_file(tensors, str(edge / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "int4"
    quantize_cli(attnres_bin, edge, out, "--quantization", "int4")
    written, metadata = qf.read_safetensors_with_metadata(out / "model.safetensors")
    layers = WIDE_SHAPE["layers"]
    matrices = linear_names(tensors) + [emb]
    assert {qf.tensor_format("int4", n, layers, tensors[n].shape[1]) for n in matrices} == {
        "int4k", "int6k"}
    for name, fmt in crafted.items():
        assert qf.tensor_format("int4", name, layers, tensors[name].shape[1]) == fmt
    for name in matrices:
        f = qf.tensor_format("int4", name, layers, tensors[name].shape[1])
        assert json.loads(metadata[name]) == {"format": f, "shape": list(tensors[name].shape)}
        rows = 256 if name == emb else len(tensors[name])  # the embedding's first rows
        assert_rows_equal(written[name][:rows], qf.quantize(tensors[name][:rows], f), f,
                          tensors[name].shape[1], name)


def test_quantize_command_writes_a_builtin_model(attnres_bin, tmp_path):
    out = tmp_path / "demo"
    quantize_cli(attnres_bin, "builtin:demo", out, "--quantization", "int4")
    info = run_cli(attnres_bin, "inspect", "--model", out)
    assert "weight matrices int4, separate LM head" in info
    written, metadata = qf.read_safetensors_with_metadata(out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    formats = set()
    for name, meta in metadata.items():
        if name in written and written[name].dtype == np.uint8:
            meta = json.loads(meta)
            formats.add(meta["format"])
            assert meta["format"] == qf.tensor_format(
                "int4", name, config["num_hidden_layers"], meta["shape"][1]), name
    assert formats == {"int4k", "int6k"}  # the demo's rows are multiples of 256
    assert json.loads(metadata["lm_head.weight"])["format"] == "int6k"
    assert written["model.norm.weight"].dtype == ml_dtypes.bfloat16
    assert "model.layers.0.attn_res_bias" in written  # the depth mix's recency bias, as F32


CT_CASES = (  # (bits, group, symmetric, format)
    (4, 128, True, None),
    (4, 32, True, None),
    (4, 64, False, None),
    (8, None, True, "int-quantized"),
    (8, 64, True, "naive-quantized"),
)


def ct_id(case):
    bits, group, sym, fmt = case
    return f"w{bits}-{'g' + str(group) if group else 'channel'}-{'sym' if sym else 'asym'}" + (
        f"-{fmt}" if fmt else "")


def write_ct(checkpoint, tmp_path, bits, group, symmetric, fmt):
    src = checkpoint("attnres_block", dtype="bf16", **SHAPE)
    ct = tmp_path / "ct"
    # Asymmetric int4: scale x (8 + zero point) must be an f16 value for an exact min; scales
    # in f16 with few mantissa bits keep every product exact (what the format allows, not what
    # every writer does: the loader refuses the inexact ones, test_refusals).
    scale_dtype = ml_dtypes.bfloat16 if symmetric else np.float16
    reference = qf.write_compressed_tensors(src, ct, bits, group, symmetric, fmt,
                                            scale_dtype=scale_dtype)
    if not symmetric:  # round the scales to 7 significant bits, rewrite
        tensors, _ = qf.read_safetensors_with_metadata(ct / "model.safetensors")
        reference = {}
        for name in list(tensors):
            if name.endswith(".weight_scale"):
                s = tensors[name].astype(np.float64)
                e = np.floor(np.log2(np.where(s > 0, s, 1)))
                tensors[name] = (np.round(s / 2.0 ** (e - 6)) * 2.0 ** (e - 6)).astype(np.float16)
        save_file(tensors, str(ct / "model.safetensors"), metadata={"format": "pt"})
        for name in tensors:
            if name.endswith(".weight_packed"):
                p = name[:-len(".weight_packed")]
                reference[p + ".weight"] = ct_reference(tensors, p, group)
    return src, ct, reference


def unpack_int4(packed, axis, n):
    """The inverse of the spec's packing (independent of quantized_formats._pack_int4)."""
    p = packed.view(np.uint32)
    if axis == 0:
        return unpack_int4(p.T.copy().view(np.int32), 1, n).T
    vals = np.stack([(p >> np.uint32(4 * i)) & 0xF for i in range(8)], axis=2)
    return vals.reshape(p.shape[0], -1)[:, :n].astype(np.int16) - 8


def ct_reference(tensors, prefix, group):
    """NumPy dequantization of a pack-quantized Linear straight from its stored tensors."""
    n, k = tensors[prefix + ".weight_shape"]
    q = unpack_int4(tensors[prefix + ".weight_packed"], 1, k)
    scale = tensors[prefix + ".weight_scale"].astype(np.float64)
    zp = tensors.get(prefix + ".weight_zero_point")
    z = np.zeros_like(scale) if zp is None else unpack_int4(zp, 0, n).astype(np.float64)
    g = group or k
    return ((q.reshape(n, k // g, g) - z[:, :, None]) * scale[:, :, None]).reshape(n, k)


@pytest.mark.parametrize("case", CT_CASES, ids=ct_id)
def test_compressed_tensors_convert_exactly(attnres_bin, checkpoint, tmp_path, case):
    bits, group, symmetric, fmt = case
    src, ct, reference = write_ct(checkpoint, tmp_path, bits, group, symmetric, fmt)
    out = tmp_path / "ours"
    quantize_cli(attnres_bin, ct, out)  # the checkpoint's own format, converted at load
    ours = "int4" if bits == 4 else "int8"
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == ours
    written = qf.dequantized_checkpoint(out)
    assert len(reference) == 7 * 6  # every Linear of the 6 layers
    for name, expected in reference.items():
        np.testing.assert_array_equal(written[name].astype(np.float64), expected, err_msg=name)
    # The embedding (tied LM head) is no Linear: float as stored.
    source, _ = qf.read_safetensors_with_metadata(src / "model.safetensors")
    emb = "model.embed_tokens.weight"
    assert written[emb].tobytes() == source[emb].tobytes()


def test_refusals(attnres_bin, checkpoint, tmp_path):
    src = checkpoint("attnres_block", dtype="bf16", **SHAPE)
    # int8 as llm-compressor's symmetric observer writes it: q = -128 occurs.
    ct = tmp_path / "w8"
    qf.write_compressed_tensors(src, ct, 8, None, True, int8_range=(-128, 127))
    assert "holds -128, outside our int8 range [-127, 127]" in cli_error(
        attnres_bin, "generate", "--model", ct, "--prompt", "hi", "--max-tokens", "1")
    # Asymmetric int4 with bf16 scales: some min is not an f16 value.
    ct4 = tmp_path / "w4a"
    qf.write_compressed_tensors(src, ct4, 4, 32, False)
    assert "is not exactly an f16 value" in cli_error(attnres_bin, "quantize", "--model", ct4,
                                                      "--output", tmp_path / "x")
    # Another format than the checkpoint's (`quantize`: these refusals come before any
    # backend is asked).
    q8 = tmp_path / "q8"
    quantize_cli(attnres_bin, src, q8, "--quantization", "int8")
    assert "the checkpoint is already quantized to int8 (attnres)" in cli_error(
        attnres_bin, "quantize", "--model", q8, "--quantization", "int4", "--output", tmp_path / "z")
    # Widths not in blocks of 32.
    odd = checkpoint("qwen3", dtype="bf16", hidden=48, heads=2, kv_heads=1, head_dim=32, ffn=96)
    assert "--quantization int8: hidden_size 48 is not a multiple of 32" in cli_error(
        attnres_bin, "quantize", "--model", odd, "--quantization", "int8", "--output", tmp_path / "w")
    assert "with tensor parallelism is not supported" in cli_error(
        attnres_bin, "generate", "--model", src, "--quantization", "int8",
        "--tensor-parallel-size", "2", "--prompt", "hi")
    assert "--quantization 'int2': expected int8 or int4" in cli_error(
        attnres_bin, "quantize", "--model", src, "--quantization", "int2", "--output", tmp_path / "y")
    # Corrupt scales in a written checkpoint: a NaN scale in a row of q_proj.
    raw = bytearray((q8 / "model.safetensors").read_bytes())
    n = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + n])["model.layers.2.self_attn.q_proj.weight"]
    at = 8 + n + info["data_offsets"][0] + SHAPE["hidden"] + 2  # row 0, block 1's scale
    raw[at:at + 2] = np.array([np.nan], dtype=np.float16).tobytes()
    (q8 / "model.safetensors").write_bytes(bytes(raw))
    assert "model.layers.2.self_attn.q_proj.weight: row 0 block 1 has scale nan" in cli_error(
        attnres_bin, "generate", "--model", q8, "--prompt", "hi")
    # An int4k super-block scale: row 1's d (its params follow its 4-bit codes).
    q4 = tmp_path / "q4"
    quantize_cli(attnres_bin, src, q4, "--quantization", "int4")
    raw = bytearray((q4 / "model.safetensors").read_bytes())
    n = int.from_bytes(raw[:8], "little")
    info = json.loads(raw[8:8 + n])["model.layers.0.mlp.down_proj.weight"]
    ffn = SHAPE["ffn"]
    at = 8 + n + info["data_offsets"][0] + qf.row_bytes("int4k", ffn) + ffn // 2
    raw[at:at + 2] = np.array([np.inf], dtype=np.float16).tobytes()
    (q4 / "model.safetensors").write_bytes(bytes(raw))
    assert ("model.layers.0.mlp.down_proj.weight: row 1 super-block 0 has scale inf"
            in cli_error(attnres_bin, "generate", "--model", q4, "--prompt", "hi"))


# --- end to end (needs the CPU kernels for quantized weights) -----------------------------


def logits_or_skip(binary, model, ids, out, *flags):
    """`attnres logits`, or a skip when the backend refuses quantized weights."""
    require_binary(binary)
    cmd = [str(binary), "logits", "--model", str(model), "--token-ids", ",".join(map(str, ids)),
           "--prefill", str(PREFILL), "--out", str(out), *map(str, flags)]
    # f32 KV cache and depth bank: the reference's precision everywhere but the quantized
    # linears (callers add --linear-input-dtype float32).
    cmd += ["--kv-cache-dtype", "float32", "--depth-bank-dtype", "float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and UNSUPPORTED in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out)


def assert_matches_the_reference(engine, make_reference, ids, what):
    """The engine's logits against QuantizedReference, the activations on a rounding
    boundary rounded as fit_boundary_rounding finds (quantized_reference.py)."""
    expected, rounding = fit_boundary_rounding(make_reference, ids, engine)
    err = relative_error(engine, expected)
    assert err <= QUANT_LOGITS_TOL, (
        f"{what}: relative error {err:.2e} ({len(rounding)} boundary activations fitted)")


@pytest.mark.parametrize("fmt,shape", [("int8", SHAPE), ("int4", SHAPE), ("int4", WIDE_SHAPE)],
                         ids=["int8", "int4", "int4-wide"])
def test_quantized_logits_match_the_reference_on_dequantized_weights(attnres_bin, checkpoint,
                                                                    tmp_path, fmt, shape):
    src = checkpoint("attnres_block", dtype="bf16", **shape)
    ids = prompt_ids(3, PROMPT_LEN)
    at_load = logits_or_skip(attnres_bin, src, ids, tmp_path / "a.npy", "--quantization", fmt,
                             "--linear-input-dtype", "float32")
    out = tmp_path / "ckpt"
    quantize_cli(attnres_bin, src, out, "--quantization", fmt)
    from_ckpt = logits_or_skip(attnres_bin, out, ids, tmp_path / "b.npy",
                               "--linear-input-dtype", "float32")
    np.testing.assert_array_equal(from_ckpt, at_load)
    tensors = qf.dequantized_checkpoint(out)
    quantized = linear_names(tensors) + ["model.embed_tokens.weight"]
    assert_matches_the_reference(
        at_load, lambda rounding: reference_on(out, tensors, quantized, rounding), ids, fmt)


def test_compressed_tensors_logits_match_the_reference(attnres_bin, checkpoint, tmp_path):
    src, ct, reference = write_ct(checkpoint, tmp_path, 4, 128, True, None)
    ids = prompt_ids(4, PROMPT_LEN)
    got = logits_or_skip(attnres_bin, ct, ids, tmp_path / "ct.npy", "--linear-input-dtype",
                         "float32")
    tensors, _ = qf.read_safetensors_with_metadata(src / "model.safetensors")
    tensors.update(reference)
    assert_matches_the_reference(
        got, lambda rounding: reference_on(src, tensors, reference, rounding), ids, "W4A16")


def test_int8_logits_match_through_exact_rounding_ties(attnres_bin, tmp_path):
    """One qwen3 layer in bf16 with an int8 embedding: its first layer's inputs sit exactly on
    rounding ties at several positions, which the engine's f32 RMSNorm leaves on either side.
    Half-even rounding everywhere put the reference 1.7e-2 away from the engine; with those
    ties fitted the two agree to 2e-7."""
    src = make_checkpoint(tmp_path / "qwen3", "qwen3", seed=5, dtype="bf16", layers=1, **SHAPE)
    ids = prompt_ids(3, PROMPT_LEN)
    got = logits_or_skip(attnres_bin, src, ids, tmp_path / "q.npy", "--quantization", "int8",
                         "--linear-input-dtype", "float32")
    tensors = ref.read_checkpoint_tensors(src)
    quantized = linear_names(tensors) + ["model.embed_tokens.weight"]
    for name in quantized:
        w = np.asarray(tensors[name], dtype=np.float32)
        tensors[name] = qf.dequantize(qf.quantize(w, "int8"), "int8", w.shape[1])
    half_even = reference_on(src, tensors, quantized)
    half_even.logits(ids)
    ties = [k for k in half_even.boundary if "self_attn" in k[0]]
    assert ties, "the checkpoint no longer puts first-layer activations on rounding ties"
    assert_matches_the_reference(
        got, lambda rounding: reference_on(src, tensors, quantized, rounding), ids, "int8")


def greedy_tokens(binary, model, ids, *flags):
    out = run_cli(binary, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ids)),
                  "--max-tokens", GREEDY_TOKENS, "--temperature", "0", "--ignore-eos", "--json",
                  *flags)
    return json.loads(out.strip().splitlines()[-1])["token_ids"]


def test_int8_greedy_tokens_equal_bf16s_on_most_prompts(attnres_bin, checkpoint, tmp_path):
    src = checkpoint("attnres_block", dtype="bf16", **SHAPE)
    logits_or_skip(attnres_bin, src, prompt_ids(0, PROMPT_LEN), tmp_path / "probe.npy",
                   "--quantization", "int8")
    equal = 0
    for seed in range(GREEDY_PROMPTS):
        ids = prompt_ids(100 + seed, 10)
        equal += greedy_tokens(attnres_bin, src, ids) == greedy_tokens(
            attnres_bin, src, ids, "--quantization", "int8")
    assert equal >= GREEDY_MIN_EQUAL, f"{equal} of {GREEDY_PROMPTS} prompts equal"
