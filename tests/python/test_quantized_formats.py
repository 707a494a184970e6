"""Checks of the NumPy quantized formats (tests/reference/quantized_formats.py) themselves, no
engine needed: that the K256 rows hold what the layout in engine/core/quant_format.h says
(decoded here byte by byte, apart from the reference's own decoder), that every weight reads
back as the nearest level its stored scales allow, that the refinement passes only lower a
block's error, the error's lane order for 16-weight sub-blocks, and the int4 recipe's choice
of formats.
"""

import numpy as np
import pytest

import quantized_formats as qf


def spread_matrix(rows, cols, seed):
    """Gaussian weights whose scale and offset change per block of 32 (factors 1/30 to 30), so
    the K256 scales take many values: sc and mn above 15 (their high bits) and small ones."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.uniform(-3.4, 3.4, (rows, cols // 32, 1)))
    offset = rng.uniform(-1.0, 0.5, (rows, cols // 32, 1)) * scale
    w = rng.standard_normal((rows, cols // 32, 32)) * scale + offset
    return (0.02 * w).reshape(rows, cols).astype(np.float32)


def f16_at(raw, at):
    return np.float32(np.frombuffer(bytes(raw[at:at + 2]), dtype="<f2")[0])


def decode_int4k(row, cols):
    """One int4k row decoded by the layout's words: (w float32 [cols], D, M float32 per block
    of 32, sc, mn int per block)."""
    row = [int(b) for b in row]
    q = np.zeros(cols, dtype=np.float32)
    for b in range(cols // 32):
        for t in range(16):
            q[32 * b + t] = row[16 * b + t] & 0xF
            q[32 * b + t + 16] = row[16 * b + t] >> 4
    D, M, sc, mn = [], [], [], []
    for s in range(cols // 256):
        p = row[cols // 2 + 16 * s:cols // 2 + 16 * s + 16]
        d, dmin = f16_at(p, 0), f16_at(p, 2)
        for j in range(8):
            sc_j = p[4 + j] & 63
            mn_j = ((p[12 + j % 4] >> (4 * (j // 4))) & 0xF) | ((p[4 + j] >> 6) << 4)
            sc.append(sc_j)
            mn.append(mn_j)
            D.append(np.float32(d * np.float32(sc_j)))
            M.append(np.float32(dmin * np.float32(mn_j)))
    D, M = np.array(D, dtype=np.float32), np.array(M, dtype=np.float32)
    w = q.reshape(-1, 32) * D[:, None] - M[:, None]
    return w.reshape(cols), D, M, np.array(sc), np.array(mn)


def decode_int6k(row, cols):
    """One int6k row decoded by the layout's words: (w float32 [cols], D per 16 weights)."""
    row = [int(b) for b in row]
    q = np.zeros(cols, dtype=np.float32)
    for b in range(cols // 32):
        for k in range(32):
            low = row[16 * b + k % 16] >> (4 * (k // 16)) & 0xF
            high = row[cols // 2 + 8 * b + k % 8] >> (2 * (k // 8)) & 3
            q[32 * b + k] = low | high << 4
    at = cols // 2 + cols // 4
    D = np.array([f16_at(row, at + cols // 16 + 2 * (i // 16)) * np.float32(row[at + i])
                  for i in range(cols // 16)], dtype=np.float32)
    w = (q.reshape(-1, 16) - 32) * D[:, None]
    return w.reshape(cols), D


@pytest.mark.parametrize("fmt", ["int4k", "int6k"])
def test_k256_rows_decode_as_the_layout_documents(fmt):
    cols = 512
    w = spread_matrix(6, cols, seed=1)
    rows = qf.quantize(w, fmt)
    assert rows.shape == (6, qf.row_bytes(fmt, cols))
    got = qf.dequantize(rows, fmt, cols)
    for r in range(len(w)):
        if fmt == "int4k":
            expected, _, _, sc, mn = decode_int4k(rows[r], cols)
            assert sc.max() > 15 and mn.max() > 15 and mn.min() < 16, "high bits unexercised"
        else:
            expected, _ = decode_int6k(rows[r], cols)
        np.testing.assert_array_equal(got[r], expected, err_msg=f"row {r}")


def test_k256_bits_per_weight():
    assert qf.row_bytes("int4k", 4096) * 8 / 4096 == 4.5
    assert qf.row_bytes("int6k", 4096) * 8 / 4096 == 6.5625
    with pytest.raises(ValueError, match="super-blocks of 256"):
        qf.quantize(np.ones((2, 128), np.float32), "int4k")
    with pytest.raises(ValueError, match="not finite"):
        qf.quantize(np.full((1, 256), np.inf, np.float32), "int6k")


@pytest.mark.parametrize("fmt", ["int4k", "int6k"])
def test_k256_weights_read_back_as_the_nearest_level(fmt):
    """q is the nearest integer against the stored scales: every weight reads back within
    half a step of itself, or as the end level nearest it when its value lies beyond."""
    cols = 512
    w = spread_matrix(6, cols, seed=2)
    rows = qf.quantize(w, fmt)
    for r in range(len(w)):
        if fmt == "int4k":
            back, D, M, _, _ = decode_int4k(rows[r], cols)
            levels = np.arange(16)[None, :] * D[:, None].astype(np.float64) - M[:, None]
            per_level_block = 32
        else:
            back, D = decode_int6k(rows[r], cols)
            levels = np.arange(-31, 32)[None, :] * D[:, None].astype(np.float64)
            per_level_block = 16
        x = w[r].astype(np.float64).reshape(-1, per_level_block)
        nearest = np.abs(x[:, :, None] - levels[:, None, :]).min(axis=2)
        err = np.abs(x - back.astype(np.float64).reshape(x.shape))
        # f32 rounding of (x + M) / D and of D q - M: a few ulps of the weights' magnitude.
        slack = 4 * np.finfo(np.float32).eps * (np.abs(x) + np.abs(levels).max(axis=1)[:, None])
        assert np.all(err <= nearest + slack), f"row {r}"


def block_errors(x, n, qmax, D, M=None):
    blocks = x.reshape(-1, n)
    if M is None:
        w = qf._block_weights(blocks, qmax, D)[1]
    else:
        w = qf._block_weights(blocks, qmax, D, -M)[1]
    return qf._block_error(blocks, w)


def test_int4k_refinement_only_lowers_each_blocks_error():
    """The stored (sc, mn) of each block has an error no larger than the first rounding of
    the block's int4 choice against the super-block scales, and below it on some blocks."""
    cols = 512
    w = spread_matrix(8, cols, seed=3)
    rows = qf.quantize(w, "int4k")
    blocks32 = w.reshape(-1, 32)
    d_j, m_j = qf.choose_scales(blocks32, 15, symmetric=False)
    # A block whose min is above 0 starts from [0, max x] and no min.
    d_j = np.where(m_j > 0, qf._f16(blocks32.max(axis=1) / np.float32(15)), d_j)
    m_j = np.minimum(m_j, 0)
    improved = 0
    for r in range(len(w)):
        _, D, M, _, _ = decode_int4k(rows[r], cols)
        p = rows[r, cols // 2:].reshape(-1, 16)
        d = np.repeat(p[:, 0:2].copy().view("<f2").astype(np.float32)[:, 0], 8)
        dmin = np.repeat(p[:, 2:4].copy().view("<f2").astype(np.float32)[:, 0], 8)
        blocks = slice(r * cols // 32, (r + 1) * cols // 32)
        mins = -m_j[blocks]
        sc0 = np.clip(np.rint(d_j[blocks] / d), 0, 63).astype(np.float32)
        mn0 = np.where(dmin > 0, np.clip(np.rint(mins / np.where(dmin > 0, dmin, 1)), 0, 63), 0)
        first = block_errors(w[r], 32, 15, d * sc0, dmin * mn0.astype(np.float32))
        final = block_errors(w[r], 32, 15, D, M)
        assert np.all(final <= first), f"row {r}"
        improved += np.sum(final < first)
    assert improved > 0


def test_int6k_refinement_only_lowers_each_sub_blocks_error():
    cols = 512
    w = spread_matrix(8, cols, seed=4)
    rows = qf.quantize(w, "int6k")
    s, _ = qf.choose_scales(w.reshape(-1, 16), 31, symmetric=True)
    improved = 0
    for r in range(len(w)):
        _, D = decode_int6k(rows[r], cols)
        d, _ = qf.q6k_scales(rows[r:r + 1], cols)
        d = np.repeat(d[0], 16)
        subs = slice(r * cols // 16, (r + 1) * cols // 16)
        sc0 = np.clip(np.rint(s[subs] / d), 0, 255).astype(np.float32)
        first = block_errors(w[r], 16, 31, d * sc0)
        final = block_errors(w[r], 16, 31, D)
        assert np.all(final <= first), f"row {r}"
        improved += np.sum(final < first)
    assert improved > 0


def test_k256_error_is_near_the_b32_formats():
    """Gaussian weights: int4k within 5% of int4's RMS error (6-bit block scales, mins >= 0),
    int6k below int6's (scales per 16 weights)."""
    w = (0.02 * np.random.default_rng(5).standard_normal((32, 1024))).astype(np.float32)

    def rms(fmt):
        return np.sqrt(np.mean((qf.dequantize(qf.quantize(w, fmt), fmt, 1024) - w) ** 2))

    assert rms("int4k") <= 1.05 * rms("int4")
    assert rms("int6k") < rms("int6")


def test_lane_sum_of_16_adds_two_terms_per_lane():
    """Lane l adds terms l and l + 8, then the lanes add in order (quant_search.h's error):
    magnitudes 1e-8 to 1e8 make any other order give another double."""
    rng = np.random.default_rng(6)
    t = rng.standard_normal((200, 16)) * 10.0 ** rng.integers(-8, 9, (200, 16))
    expected = []
    for row in t.tolist():
        lanes = [0.0 + row[l] + row[l + 8] for l in range(8)]
        total = lanes[0]
        for lane in lanes[1:]:
            total += lane
        expected.append(total)
    np.testing.assert_array_equal(qf._lane_sum(t), np.array(expected))
    assert np.any(qf._lane_sum(t) != t.sum(axis=1))  # the order matters for these


def test_int4_recipe_formats():
    n = 8  # more-bits layers: i < 1, i >= 7, (i - 1) % 3 == 2: 0, 3, 6, 7
    more_bits = [i for i in range(n) if qf.more_bits_layer(i, n)]
    assert more_bits == [0, 3, 6, 7]
    for i in range(n):
        for proj in ("self_attn.v_proj", "mlp.down_proj", "self_attn.q_proj", "mlp.up_proj"):
            name = f"model.layers.{i}.{proj}.weight"
            six = i in more_bits and proj in ("self_attn.v_proj", "mlp.down_proj")
            assert qf.tensor_format("int4", name, n, 512) == ("int6k" if six else "int4k")
            assert qf.tensor_format("int4", name, n, 384) == ("int6" if six else "int4")
            assert qf.tensor_format("int8", name, n, 512) == "int8"
    for name in qf.HEAD_NAMES:
        assert qf.tensor_format("int4", name, n, 1024) == "int6k"
        assert qf.tensor_format("int4", name, n, 96) == "int6"
        assert qf.tensor_format("int8", name, n, 1024) == "int8"


def test_int4k_block_above_zero_keeps_its_offset():
    """A block whose weights are all well above 0 (int4's min > 0, which int4k's min >= 0
    cannot subtract) reads back within a step of max x / 15, not flattened to its minimum."""
    rng = np.random.default_rng(7)
    w = (0.02 * rng.standard_normal((4, 256))).astype(np.float32)
    w[:, 64:96] = rng.uniform(0.05, 0.1, (4, 32))
    err = np.abs(qf.dequantize(qf.quantize(w, "int4k"), "int4k", 256) - w)[:, 64:96]
    assert err.max() <= 0.1 / 15
