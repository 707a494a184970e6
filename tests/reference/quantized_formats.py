"""NumPy definitions of the quantized weight formats the engine reads, written from their specs
independently of the engine's code, for the quantization tests.

Ours (engine/core/quant_format.h; `attnres quantize` checkpoints store each quantized matrix as
a U8 [rows, row_bytes] tensor, its {"format", "shape"} in the file's __metadata__):
    int8 (Q8_B32): row = int8 q[cols] | f16 d[cols/32];            w = d[k/32] q[k]
    int4 (Q4_B32): row = u8 packed[cols/2] | f16 d[cols/32] | f16 m[cols/32];
                   block b = bytes [16b, 16b+16): byte 16b+j holds q[32b+j] (low nibble) and
                   q[32b+j+16] (high nibble);                        w = d[k/32] q[k] + m[k/32]
    int6 (Q6_B32): row = u8 low[cols/2] | u8 high[cols/4] | f16 d[cols/32];
                   low: q's low 4 bits in int4's order; high: block b = bytes [8b, 8b+8), byte
                   8b+j holds q[32b+j+8i] >> 4 in bits 2i, 2i+1;      w = d[k/32] (q[k] - 32)
    int4k (Q4_K256, 4.5 bits): row = u8 packed[cols/2] (int4's) | u8 params[cols/16];
                   super-block s (256 weights, blocks j = 0..7) has params bytes [16s, 16s+16):
                   f16 d, f16 dmin, byte 4+j = sc_j (bits 0..5) | bits 4..5 of mn_j (bits 6..7),
                   byte 12+i = bits 0..3 of mn_i (low nibble) and of mn_{i+4} (high);
                   w = f32(D q - M), D = d sc_j, M = dmin mn_j (both exact in f32)
    int6k (Q6_K256, 6.5625 bits): row = u8 low[cols/2] | u8 high[cols/4] (int6's) |
                   u8 sc[cols/16] | f16 d[cols/256];          w = f32(d[k/256] sc[k/16]) (q - 32)
    (int4k / int6k need cols a multiple of 256.)
    quantized from float32 (the bf16 weights widened) with f32 arithmetic and round to
    nearest even: per block, the f16 scale (int4: and min) with the smallest squared error
    among a fixed list of candidates (engine/core/quant_search.h; choose_scales below), then
    int8 q = clamp(rint(x / d), -127, 127), int6 q = 32 + clamp(rint(x / d), -31, 31),
    int4 q = clamp(rint((x - m) / d), 0, 15); d == 0 gives q = 0 (int6: 32).
    int4k: per super-block, int4's (d_j, m_j) of its 8 blocks, M_j = -m_j where m_j < 0,
    else +0, and d_j = f16(max x / 15) where m_j > 0 (the format's min is >= 0);
    d = f16(max d_j / 63), dmin = f16(max M_j / 63),
    sc_j = clamp(rint(d_j / d), 0, 63), mn_j = clamp(rint(M_j / dmin), 0, 63) (0 where d /
    dmin is 0); int6k: per super-block, the symmetric scale s_i of each 16-weight sub-block
    (qmax 31), d = f16(max s_i / 255), sc_i = clamp(rint(s_i / d), 0, 255). Then two
    refinement passes over the blocks in order (_refine: each integer field tries its current
    value -1, +1, -2, +2, each from the value as the earlier tries left it, kept when the
    block's error is strictly smaller), and q against D (and M) as int4 / int6 round it.
    The recipes (--quantization, quantization_config.format): int8 stores every matrix as
    int8; int4 the embedding, the LM head and llama.cpp Q4_K_M's more-bits layers' v_proj /
    down_proj as int6k, every other projection as int4k, and a matrix whose rows are not a
    multiple of 256 long as int6 / int4 instead (tensor_format).

compressed-tensors (the library's compressors, 0.10 series: pack_quantized.py
pack_to_int32 / naive_quantized.py), weight-only, for a Linear PREFIX:
    W4A16 "pack-quantized": PREFIX.weight_packed int32 [N, K/8], value k of a row in bits
        4 (k % 8) of word k // 8, stored as q + 8 (q in [-8, 7]); PREFIX.weight_scale
        [N, K/group] (or [N, 1] per channel); PREFIX.weight_shape int64 [2];
        asymmetric: PREFIX.weight_zero_point int32 [ceil(N/8), K/group], packed the same way
        along the rows.
    W8A16 "int-quantized" / "naive-quantized": PREFIX.weight int8 [N, K], PREFIX.weight_scale.
    w = scale (q - zero_point).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

BLOCK = 32
SUPER_BLOCK = 256  # int4k / int6k: a row's length is a multiple of this
FORMATS = ("int8", "int4")  # the recipes
# A recipe's formats for a projection and for the embedding / LM head / more-bits layers;
# a row whose length is not a multiple of SUPER_BLOCK takes B32_FALLBACK of that format.
PROJECTION_FORMAT = {"int8": "int8", "int4": "int4k"}
HEAD_FORMAT = {"int8": "int8", "int4": "int6k"}
B32_FALLBACK = {"int4k": "int4", "int6k": "int6"}
HEAD_NAMES = ("model.embed_tokens.weight", "lm_head.weight")
LINEAR_SUFFIXES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": ml_dtypes.bfloat16, "I64": "<i8",
           "I32": "<i4", "I8": "i1", "U8": "u1"}


def read_safetensors_with_metadata(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        dt = np.dtype(_DTYPES[info["dtype"]])
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        assert end - begin == count * dt.itemsize, name
        out[name] = np.frombuffer(raw, dtype=dt, count=count, offset=8 + n + begin).reshape(shape).copy()
    return out, metadata


def more_bits_layer(i: int, n: int) -> bool:
    """llama.cpp Q4_K_M's layers with v_proj / down_proj at 6 bits (its use_more_bits)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_format(recipe: str, name: str, num_layers: int, cols: int) -> str:
    """The format the recipe stores the matrix `name` (rows `cols` long) in, in a model of
    num_layers layers: int4 puts the projections in int4k and the embedding, the LM head and
    the more-bits layers' v_proj / down_proj in int6k; rows not a multiple of SUPER_BLOCK long
    take int4 / int6 instead."""
    parts = name.split(".")
    sensitive = name in HEAD_NAMES or (
        parts[:2] == ["model", "layers"] and ".".join(parts[3:]) in
        ("self_attn.v_proj.weight", "mlp.down_proj.weight")
        and more_bits_layer(int(parts[2]), num_layers))
    fmt = (HEAD_FORMAT if sensitive else PROJECTION_FORMAT)[recipe]
    return B32_FALLBACK.get(fmt, fmt) if cols % SUPER_BLOCK else fmt


def row_bytes(fmt: str, cols: int) -> int:
    return {"int8": cols + 2 * (cols // BLOCK), "int6": cols // 2 + cols // 4 + 2 * (cols // BLOCK),
            "int4": cols // 2 + 4 * (cols // BLOCK), "int4k": cols // 2 + cols // 16,
            "int6k": cols // 2 + cols // 4 + cols // 16 + 2 * (cols // SUPER_BLOCK)}[fmt]


def _f16(v) -> np.ndarray:
    """v (float32, or float64 first rounded to float32) rounded to f16, as float32 (inf
    beyond f16's range: the callers skip or refuse those)."""
    with np.errstate(over="ignore"):
        return np.asarray(v).astype(np.float32).astype(np.float16).astype(np.float32)


def _lane_sum(t: np.ndarray) -> np.ndarray:
    """float64 [..., n] summed as the engine sums a block: lane l in [0, 8) adds elements l,
    l + 8, l + 16, ... in turn, then the lanes are added in order."""
    lanes = t[..., 0:8].copy()
    for j in range(8, t.shape[-1], 8):
        lanes = lanes + t[..., j:j + 8]
    total = lanes[..., 0]
    for lane in range(1, 8):
        total = total + lanes[..., lane]
    return total


def _block_weights(x, qmax, d, m=None):
    """(q, the f32 weights read back) of blocks x [B, n] with scales d [B] (and mins m [B]);
    q = 0 where d == 0."""
    dd = d[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        if m is None:
            r = np.rint(x / dd)
            lo = np.float32(-qmax)
        else:
            r = np.rint((x - m[:, None]) / dd)
            lo = np.float32(0)
        q = np.where(dd == 0, np.float32(0), np.clip(r, lo, np.float32(qmax))).astype(np.float32)
    w = q * dd
    if m is not None:
        w = w + m[:, None]
    return q, w


def _block_error(x, w) -> np.ndarray:
    e = x.astype(np.float64) - w.astype(np.float64)
    return _lane_sum(e * e)


def choose_scales(x: np.ndarray, qmax: int, symmetric: bool):
    """The engine's choice of f16 scales d [B] (and, asymmetric, mins m [B]) for blocks
    x float32 [B, n], from the rule in engine/core/quant_search.h: the first candidate is the
    absmax / min-max choice; a later one replaces the best so far only when its squared error
    is strictly smaller."""
    x = np.asarray(x, dtype=np.float32)

    def overflow_check(v):
        if not np.all(np.isfinite(v)):
            raise ValueError("a block's scale overflows f16")

    if symmetric:
        amax = np.abs(x).max(axis=1)
        best_d = _f16(amax / np.float32(qmax))
        overflow_check(best_d)
        best_e = _block_error(x, _block_weights(x, qmax, best_d)[1])
        for i in range(-10, 11):
            if i == 0:
                continue
            d = _f16(amax / np.float32(qmax + i / 5))
            ok = np.isfinite(d)
            d = np.where(ok, d, np.float32(0))
            e = _block_error(x, _block_weights(x, qmax, d)[1])
            better = ok & (e < best_e)
            best_d, best_e = np.where(better, d, best_d), np.where(better, e, best_e)
        return best_d, None

    m0 = _f16(x.min(axis=1))
    overflow_check(m0)
    r = np.maximum(x.max(axis=1) - m0, np.float32(0))
    d0 = _f16(r / np.float32(qmax))
    overflow_check(d0)
    q0, w0 = _block_weights(x, qmax, d0, m0)
    best_d, best_m, best_e = d0, m0, _block_error(x, w0)
    x64 = x.astype(np.float64)
    n = np.float64(x.shape[1])
    sum_x = _lane_sum(x64)

    def consider(ok, d, m):
        nonlocal best_d, best_m, best_e
        d, m = np.where(ok, d, np.float32(0)), np.where(ok, m, np.float32(0))
        q, w = _block_weights(x, qmax, d, m)
        e = _block_error(x, w)
        better = ok & (e < best_e)
        best_d, best_m = np.where(better, d, best_d), np.where(better, m, best_m)
        best_e = np.where(better, e, best_e)
        return q

    for i in range(-3, 4):
        if i == 0:
            ok, q = np.ones(len(x), dtype=bool), q0
        else:
            d = _f16(r / np.float32(qmax + (2 * i) / 5))
            ok = np.isfinite(d)
            q = consider(ok, d, m0)
        # The least-squares (d, m) for these q.
        q64 = q.astype(np.float64)
        sq, sqq = q64.sum(axis=1), (q64 * q64).sum(axis=1)  # integers: exact in any order
        det = n * sqq - sq * sq
        sxq = _lane_sum(x64 * q64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            dl = (n * sxq - sq * sum_x) / det
            ml = (sqq * sum_x - sq * sxq) / det
            ok = ok & (det > 0) & (np.abs(dl) < 1e30) & (np.abs(ml) < 1e30)
            dl, ml = _f16(np.where(ok, dl, 0)), _f16(np.where(ok, ml, 0))
        consider(ok & (dl > 0) & np.isfinite(dl) & np.isfinite(ml), dl, ml)
    return best_d, best_m


def _nearest_level(s, d, top):
    """The integer multiples sc [S, n] of super-block scales d [S] nearest the block scales
    s [S, n]: clamp(rint(s / d), 0, top) in f32, 0 where d == 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.clip(np.rint(s / d[:, None]), np.float32(0), np.float32(top))
    return np.where(d[:, None] == 0, 0, r).astype(np.int32)


def _refine(levels, top, error):
    """The refinement passes over one super-block's integer scales, across every super-block
    at once: two passes over the blocks in order; for each field of a block (a list of int
    arrays [S, blocks], all sharing the block index), each delta in (-1, +1, -2, +2) tries
    the field's current value + delta (skipped outside [0, top]); it is kept when the block's
    error (error(j, values of each field at block j)) is strictly smaller than the best so
    far. Updates `levels` in place."""
    blocks = levels[0].shape[1]
    best = np.stack([error(j, *(f[:, j] for f in levels)) for j in range(blocks)], axis=1)
    for _ in range(2):
        for j in range(blocks):
            for k, field in enumerate(levels):
                for delta in (-1, 1, -2, 2):
                    cand = field[:, j] + delta
                    ok = (cand >= 0) & (cand <= top)
                    cand = np.clip(cand, 0, top)
                    trial = [cand if i == k else f[:, j] for i, f in enumerate(levels)]
                    e = error(j, *trial)
                    better = ok & (e < best[:, j])
                    field[:, j] = np.where(better, cand, field[:, j])
                    best[:, j] = np.where(better, e, best[:, j])


def _q4k_choose(x):
    """Super-blocks x float32 [S, 256] -> (d, dmin float32 [S], sc, mn int [S, 8]): the
    block choices of int4 turned into 6-bit multiples of two f16 scales, then refined."""
    blocks = x.reshape(len(x), 8, BLOCK)
    dj, mj = choose_scales(blocks.reshape(-1, BLOCK), 15, symmetric=False)
    dj, mj = dj.reshape(-1, 8), mj.reshape(-1, 8)
    # The format subtracts a min >= 0: a block whose chosen min is above 0 takes the scale
    # of [0, max x] and no min.
    above = mj > 0
    dj = np.where(above, _f16(blocks.max(axis=2) / np.float32(15)), dj)
    mins = np.where(mj < 0, -mj, np.float32(0))  # M_j = -m_j below 0, else +0
    d = _f16(dj.max(axis=1) / np.float32(63))
    dmin = _f16(mins.max(axis=1) / np.float32(63))
    sc, mn = _nearest_level(dj, d, 63), _nearest_level(mins, dmin, 63)

    def error(j, sc_j, mn_j):
        xb = blocks[:, j]
        big_d, big_m = d * sc_j.astype(np.float32), dmin * mn_j.astype(np.float32)
        return _block_error(xb, _block_weights(xb, 15, big_d, -big_m)[1])

    _refine([sc, mn], 63, error)
    return d, dmin, sc, mn


def _q6k_choose(x):
    """Super-blocks x float32 [S, 256] -> (d float32 [S], sc int [S, 16]): the symmetric
    choices of the 16-weight sub-blocks turned into 8-bit multiples of one f16 scale, then
    refined."""
    subs = x.reshape(len(x), 16, 16)
    s, _ = choose_scales(subs.reshape(-1, 16), 31, symmetric=True)
    s = s.reshape(-1, 16)
    d = _f16(s.max(axis=1) / np.float32(255))
    sc = _nearest_level(s, d, 255)

    def error(i, sc_i):
        xb = subs[:, i]
        return _block_error(xb, _block_weights(xb, 31, d * sc_i.astype(np.float32))[1])

    _refine([sc], 255, error)
    return d, sc


def _pack_nibbles(q, rows, cols):
    """q uint8 [rows, cols] in [0, 15] -> [rows, cols / 2]: block b's byte 16 b + j holds
    q[32 b + j] (low nibble) and q[32 b + j + 16] (high)."""
    q = q.reshape(rows, cols // BLOCK, BLOCK)
    return (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(rows, cols // 2)


def _unpack_nibbles(packed, rows, cols):
    packed = packed.reshape(rows, cols // BLOCK, 16)
    return np.concatenate([packed & 0xF, packed >> 4], axis=2).reshape(rows, cols)


def _pack_int6(q, rows, cols):
    """q uint8 [rows, cols] in [0, 63] -> (low [rows, cols / 2], high [rows, cols / 4])."""
    low = _pack_nibbles(q & 0xF, rows, cols)
    top = (q >> 4).reshape(rows, cols // BLOCK, 4, 8)  # [.., i, j]: weight 8i + j of a block
    high = (top[:, :, 0] | top[:, :, 1] << 2 | top[:, :, 2] << 4 | top[:, :, 3] << 6)
    return low, high.reshape(rows, cols // 4)


def _unpack_int6(rows_u8, rows, cols):
    """The q [rows, cols] (uint8) of an int6 / int6k row's low and high arrays."""
    low = _unpack_nibbles(rows_u8[:, :cols // 2], rows, cols)
    high = rows_u8[:, cols // 2:cols // 2 + cols // 4].reshape(rows, cols // BLOCK, 1, 8)
    top = (high >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    return low | (top.reshape(rows, cols) << 4)


def _f16_bytes(v, rows):
    return v.astype(np.float16).reshape(rows, -1).view(np.uint8)


def quantize(w: np.ndarray, fmt: str) -> np.ndarray:
    """[rows, cols] float -> uint8 [rows, row_bytes], as the engine's quantizer defines it."""
    x = np.asarray(w, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("a weight is not finite")
    rows, cols = x.shape
    flat = x.reshape(-1, BLOCK)
    if fmt == "int8":
        d, _ = choose_scales(flat, 127, symmetric=True)
        q, _ = _block_weights(flat, 127, d)
        q = q.astype(np.int8).reshape(rows, cols)
        return np.concatenate([q.view(np.uint8), _f16_bytes(d, rows)], axis=1)
    if fmt == "int6":
        d, _ = choose_scales(flat, 31, symmetric=True)
        q, _ = _block_weights(flat, 31, d)
        low, high = _pack_int6((q + 32).astype(np.uint8).reshape(rows, cols), rows, cols)
        return np.concatenate([low, high, _f16_bytes(d, rows)], axis=1)
    if fmt == "int4":
        d, m = choose_scales(flat, 15, symmetric=False)
        q, _ = _block_weights(flat, 15, d, m)
        packed = _pack_nibbles(q.astype(np.uint8).reshape(rows, cols), rows, cols)
        return np.concatenate([packed, _f16_bytes(d, rows), _f16_bytes(m, rows)], axis=1)
    if fmt in ("int4k", "int6k") and cols % SUPER_BLOCK:
        raise ValueError(f"{fmt}: rows of {cols} weights are not in super-blocks of {SUPER_BLOCK}")
    supers = x.reshape(-1, SUPER_BLOCK)
    if fmt == "int4k":
        d, dmin, sc, mn = _q4k_choose(supers)
        scale = (d[:, None] * sc.astype(np.float32)).reshape(-1)
        mins = (dmin[:, None] * mn.astype(np.float32)).reshape(-1)
        q, _ = _block_weights(flat, 15, scale, -mins)
        packed = _pack_nibbles(q.astype(np.uint8).reshape(rows, cols), rows, cols)
        sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
        params = np.concatenate([
            _f16_bytes(d, len(d)), _f16_bytes(dmin, len(d)),
            sc | ((mn >> 4) << 6),                       # bytes 4..11: sc_j, mn_j's bits 4..5
            (mn[:, :4] & 0xF) | ((mn[:, 4:] & 0xF) << 4),  # bytes 12..15: mn_i, mn_{i+4}'s low
        ], axis=1)
        return np.concatenate([packed, params.reshape(rows, cols // 16)], axis=1)
    if fmt == "int6k":
        d, sc = _q6k_choose(supers)
        scale = (d[:, None] * sc.astype(np.float32)).reshape(-1)
        q, _ = _block_weights(x.reshape(-1, 16), 31, scale)
        low, high = _pack_int6((q + 32).astype(np.uint8).reshape(rows, cols), rows, cols)
        return np.concatenate([low, high, sc.astype(np.uint8).reshape(rows, cols // 16),
                               _f16_bytes(d, rows)], axis=1)
    raise ValueError(f"unknown format {fmt!r}")


def q4k_params(rows_u8, cols):
    """An int4k row's super-block params: (d, dmin float32 [rows, S], sc, mn uint8
    [rows, S, 8]), decoded as the layout documents them."""
    rows = rows_u8.shape[0]
    p = rows_u8[:, cols // 2:].reshape(rows, cols // SUPER_BLOCK, 16)
    d = p[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = p[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc = p[:, :, 4:12] & 63
    mn = np.concatenate([p[:, :, 12:16] & 0xF, p[:, :, 12:16] >> 4], axis=2) | (
        (p[:, :, 4:12] >> 6) << 4)
    return d, dmin, sc, mn


def q6k_scales(rows_u8, cols):
    """An int6k row's scales: (d float32 [rows, S], sc uint8 [rows, cols / 16])."""
    at = cols // 2 + cols // 4
    sc = rows_u8[:, at:at + cols // 16]
    d = rows_u8[:, at + cols // 16:].copy().view(np.float16).astype(np.float32)
    return d, sc


def dequantize(rows_u8: np.ndarray, fmt: str, cols: int) -> np.ndarray:
    """uint8 [rows, row_bytes] -> float32 [rows, cols], exactly."""
    rows = rows_u8.shape[0]
    nb = cols // BLOCK
    if fmt == "int8":
        q = rows_u8[:, :cols].view(np.int8).astype(np.float32).reshape(rows, nb, BLOCK)
        d = rows_u8[:, cols:cols + 2 * nb].copy().view(np.float16).astype(np.float32)
        return (q * d[:, :, None]).reshape(rows, cols)
    if fmt == "int6":
        q = _unpack_int6(rows_u8, rows, cols).astype(np.float32).reshape(rows, nb, BLOCK) - 32
        d = rows_u8[:, 3 * cols // 4:].copy().view(np.float16).astype(np.float32)
        return (q * d[:, :, None]).reshape(rows, cols)
    if fmt == "int4":
        q = _unpack_nibbles(rows_u8[:, :cols // 2], rows, cols).astype(np.float32)
        q = q.reshape(rows, nb, BLOCK)
        d = rows_u8[:, cols // 2:cols // 2 + 2 * nb].copy().view(np.float16).astype(np.float32)
        m = rows_u8[:, cols // 2 + 2 * nb:].copy().view(np.float16).astype(np.float32)
        return (q * d[:, :, None] + m[:, :, None]).reshape(rows, cols)
    if fmt == "int4k":
        q = _unpack_nibbles(rows_u8[:, :cols // 2], rows, cols).astype(np.float32)
        d, dmin, sc, mn = q4k_params(rows_u8, cols)
        scale = d[:, :, None] * sc.astype(np.float32)  # [rows, S, 8], exact
        mins = dmin[:, :, None] * mn.astype(np.float32)
        w = q.reshape(rows, -1, 8, BLOCK) * scale[..., None] - mins[..., None]
        return w.reshape(rows, cols)
    if fmt == "int6k":
        q = _unpack_int6(rows_u8, rows, cols).astype(np.float32) - 32
        d, sc = q6k_scales(rows_u8, cols)
        scale = np.repeat(d, 16, axis=1) * sc.astype(np.float32)  # [rows, cols / 16], exact
        return (q.reshape(rows, -1, 16) * scale[:, :, None]).reshape(rows, cols)
    raise ValueError(f"unknown format {fmt!r}")


def dequantized_checkpoint(model_dir) -> dict[str, np.ndarray]:
    """An `attnres quantize` checkpoint's tensors with every quantized matrix dequantized
    (float32), the rest as stored."""
    tensors, metadata = read_safetensors_with_metadata(Path(model_dir) / "model.safetensors")
    out = {}
    for name, t in tensors.items():
        if t.dtype == np.uint8:
            meta = json.loads(metadata[name])
            out[name] = dequantize(t, meta["format"], meta["shape"][1])
        else:
            out[name] = t
    return out


# --- compressed-tensors ------------------------------------------------------------------


def _pack_int4(u: np.ndarray, axis: int) -> np.ndarray:
    """uint values in [0, 15] packed eight per int32 along `axis` (0 or 1), value i of each
    group of eight in bits 4 i."""
    u = u.astype(np.uint32)
    if axis == 0:
        return _pack_int4(u.T, 1).T.copy()
    rows, cols = u.shape
    pad = (-cols) % 8
    u = np.pad(u, ((0, 0), (0, pad)))
    packed = np.zeros((rows, u.shape[1] // 8), dtype=np.uint32)
    for i in range(8):
        packed |= u[:, i::8] << np.uint32(4 * i)
    return packed.view(np.int32)


def ct_quantize(w: np.ndarray, bits: int, group: int | None, symmetric: bool,
                scale_dtype=ml_dtypes.bfloat16, int8_range=(-127, 127)):
    """A min-max quantization of w [N, K] in the compressed-tensors convention: returns
    (q int8 [N, K], scale [N, groups] in scale_dtype, zero point int8 [N, groups])."""
    w = np.asarray(w, dtype=np.float64)
    n, k = w.shape
    g = group or k
    blocks = w.reshape(n, k // g, g)
    qmin, qmax = (-8, 7) if bits == 4 else int8_range
    if symmetric:
        scale = np.abs(blocks).max(axis=2) / ((qmax - qmin) / 2)
        zero = np.zeros_like(scale)
    else:
        lo, hi = np.minimum(blocks.min(axis=2), 0), np.maximum(blocks.max(axis=2), 0)
        scale = (hi - lo) / (qmax - qmin)
        zero = np.clip(np.rint(qmin - lo / scale), qmin, qmax)
    scale = scale.astype(scale_dtype)
    s = scale.astype(np.float64)[:, :, None]
    q = np.clip(np.rint(blocks / s + zero[:, :, None]), qmin, qmax).astype(np.int8).reshape(n, k)
    return q, scale, zero.astype(np.int8)


def ct_dequantize(q, scale, zero, group) -> np.ndarray:
    n, k = q.shape
    g = group or k
    qb = q.astype(np.float64).reshape(n, k // g, g)
    return ((qb - zero.astype(np.float64)[:, :, None]) * scale.astype(np.float64)[:, :, None]
            ).reshape(n, k)


def write_compressed_tensors(src_dir, out_dir, bits: int, group: int | None, symmetric: bool,
                             fmt: str | None = None, int8_range=(-127, 127),
                             scale_dtype=ml_dtypes.bfloat16) -> dict[str, np.ndarray]:
    """Rewrites a float checkpoint (one model.safetensors) as llm-compressor would save it
    with a weight-only scheme on every Linear of the decoder layers (lm_head ignored).
    Returns {PREFIX.weight: the dequantized float64 matrix} for the quantized Linears."""
    import shutil
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in src_dir.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, out_dir / f.name)
    tensors, _ = read_safetensors_with_metadata(src_dir / "model.safetensors")
    fmt = fmt or ("pack-quantized" if bits == 4 else "int-quantized")
    out, reference = {}, {}
    for name, t in tensors.items():
        prefix = name[:-len(".weight")] if name.endswith(".weight") else None
        if prefix is None or not prefix.endswith(LINEAR_SUFFIXES):
            out[name] = t
            continue
        q, scale, zero = ct_quantize(t.astype(np.float32), bits, group, symmetric, scale_dtype,
                                     int8_range)
        reference[name] = ct_dequantize(q, scale, zero, group)
        out[prefix + ".weight_scale"] = scale
        if bits == 4:
            out[prefix + ".weight_packed"] = _pack_int4((q.astype(np.int16) + 8).astype(np.uint8), 1)
            out[prefix + ".weight_shape"] = np.array(t.shape, dtype=np.int64)
            if not symmetric:
                out[prefix + ".weight_zero_point"] = _pack_int4(
                    (zero.astype(np.int16) + 8).astype(np.uint8), 0)
        else:
            out[prefix + ".weight"] = q
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src_dir / "config.json").read_text())
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric,
               "strategy": "group" if group else "channel", "group_size": group,
               "actorder": None, "dynamic": False, "observer": "minmax"}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {},
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                      "input_activations": None, "output_activations": None,
                                      "format": fmt}}}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return reference
