"""Depth-attention introspection at the edges: bad requests (wrong types, a plain model that
has no depth attention) are 400s naming the field; `attnres inspect --out` writes a PNG that a
strict decoder accepts (every chunk's CRC-32, the zlib stream's Adler-32, the header) and
whose cells are coloured by weight; clients/python/depth_heatmap.py draws a valid PNG from a
real server, from the same weights the server returns."""

import json
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from depth_helpers import json_matrix
from http_helpers import assert_error_envelope, post_json
from make_checkpoint import make_checkpoint
from server_process import ServerProcess

SERVER_ENV = {"OMP_NUM_THREADS": "1"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def models(ckpt_root):
    dirs = {v: make_checkpoint(ckpt_root / f"depth_clients_{v}", v, seed=4)
            for v in ("attnres_block_reset", "qwen3")}
    yield dirs
    for path in dirs.values():
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def attnres_server(attnres_bin, models):
    with ServerProcess(attnres_bin, "--model", models["attnres_block_reset"],
                       env=SERVER_ENV) as server:
        yield server


def unfilter_rows(raw: bytes, width: int, height: int, bpp: int = 3) -> bytes:
    """Undoes PNG's per-row filters (0 none, 1 Sub, 2 Up, 3 Average, 4 Paeth; PNG spec 9)."""
    stride = bpp * width
    assert len(raw) == height * (1 + stride)
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        start = y * (1 + stride)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        assert kind <= 4, f"row {y}: unknown filter type {kind}"
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + a) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + b) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                predictor = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                row[i] = (row[i] + predictor) & 0xFF
        out += row
        prev = row
    return bytes(out)


def read_png(data: bytes) -> np.ndarray:
    """Decodes an 8-bit RGB PNG strictly, without PIL: signature, chunk CRCs, IHDR, zlib
    (Adler-32), every row filter."""
    assert data[:8] == PNG_SIGNATURE, data[:8]
    pos, chunks = 8, []
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        crc = int.from_bytes(data[pos + 8 + length:pos + 12 + length], "big")
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind}"
        chunks.append((kind, body))
        pos += 12 + length
    assert pos == len(data)
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, colour, method, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, method, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    # libpng filters adaptively: the heatmap's rows use several filter types.
    kinds = {raw[y * (1 + 3 * width)] for y in range(height)}
    assert kinds - {0}, f"only filter types {kinds}: the unfiltering is not exercised"
    pixels = unfilter_rows(raw, width, height)
    return np.frombuffer(pixels, dtype=np.uint8).reshape(height, width, 3)


# ---------------------------------------------------------------- bad requests


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field,value", [("return_depth_attention", "yes"),
                                         ("return_depth_attention", 1),
                                         ("depth_attention_per_token", [True])])
def test_wrong_types_are_400_naming_the_field(attnres_server, route, field, value):
    body = {"max_tokens": 1, field: value}
    if route == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    status, _, r = post_json(attnres_server.http_url, route, body)
    assert status == 400, r
    assert field in assert_error_envelope(r, param=field)


def test_a_plain_model_has_no_depth_attention(attnres_bin, models):
    with ServerProcess(attnres_bin, "--model", models["qwen3"], env=SERVER_ENV) as server:
        for field in ("return_depth_attention", "depth_attention_per_token"):
            for route, body in (("/v1/completions", {"prompt": "hi"}),
                                ("/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}]})):
                status, _, r = post_json(server.http_url, route,
                                         {**body, "max_tokens": 1, field: True})
                assert status == 400, r
                message = assert_error_envelope(r, param=field)
                assert "no depth attention" in message, message
        # Asking for nothing is fine.
        status, _, r = post_json(server.http_url, "/v1/completions",
                                 {"prompt": "hi", "max_tokens": 1,
                                  "return_depth_attention": False})
        assert status == 200, r
        assert "depth_attention" not in r["choices"][0]


def test_inspect_refuses_a_plain_model_and_options_without_a_prompt(attnres_bin, models):
    proc = subprocess.run([str(attnres_bin), "inspect", "--model", str(models["qwen3"]),
                           "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "no depth attention" in proc.stderr
    proc = subprocess.run([str(attnres_bin), "inspect", "--model",
                           str(models["attnres_block_reset"]), "--out", "x.png"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--prompt" in proc.stderr


# ---------------------------------------------------------------- attnres inspect --out


def test_inspect_heatmap_png_decodes_and_is_coloured_by_weight(attnres_bin, models, tmp_path):
    png, js = tmp_path / "depth.png", tmp_path / "depth.json"
    proc = subprocess.run([str(attnres_bin), "inspect", "--model",
                           str(models["attnres_block_reset"]), "--threads", "1",
                           "--prompt", "Residual streams mix depth", "--out", str(png),
                           "--json", str(js)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    image = read_png(png.read_bytes())
    with Image.open(png) as im:  # an independent decoder agrees
        assert im.size == (image.shape[1], image.shape[0]) and im.mode == "RGB"
        assert np.array_equal(np.asarray(im), image)
    assert tuple(image[0, 0]) == tuple(image[-1, -1]) == (255, 255, 255)  # white background
    weights = json_matrix(json.loads(js.read_text())["prompt_mean"])
    rows, cols = weights.shape
    # Square cells of `cell` pixels after a margin of cell // 2 (depth_heatmap.cpp).
    cell = next(c for c in range(12, 49) if rows * c + 2 * (c // 2) == image.shape[0])
    margin = cell // 2
    centre = lambda r, c: image[margin + r * cell + cell // 2, margin + c * cell + cell // 2]
    luminance = lambda rgb: 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]
    cells = []
    for r in range(rows):
        for c in range(cols):
            rgb = centre(r, c).astype(float)
            if np.isnan(weights[r, c]):
                assert tuple(rgb) == (225, 225, 225), (r, c, rgb)  # unused: light grey
            else:
                cells.append((weights[r, c], luminance(rgb)))
    cells.sort()
    # Brighter means more weight: luminance never drops as the weight grows (beyond the
    # 8-bit rounding of two nearly equal weights).
    for (w0, l0), (w1, l1) in zip(cells, cells[1:]):
        assert l1 >= l0 - 1.5, f"weight {w1:.4f} is darker ({l1:.1f}) than {w0:.4f} ({l0:.1f})"
    assert cells[-1][1] - cells[0][1] > 50, "the colours hardly vary"


# ---------------------------------------------------------------- clients/python/depth_heatmap.py


def test_heatmap_script_draws_a_png_from_a_real_server(attnres_server, repo_root, tmp_path):
    png, js = tmp_path / "heatmap.png", tmp_path / "heatmap.json"
    prompt = "Attention residuals let each layer choose"
    proc = subprocess.run([sys.executable, str(repo_root / "clients/python/depth_heatmap.py"),
                           "--url", attnres_server.http_url, "--prompt", prompt,
                           "--out", str(png), "--json", str(js)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "sublayers" in proc.stdout
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(png) as im:
        im.load()  # decodes the whole image (matplotlib compresses: Pillow checks it)
        assert im.size[0] > 200 and im.size[1] > 200
    # It drew what the server returns for the prompt.
    status, _, r = post_json(attnres_server.http_url, "/v1/completions",
                             {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                              "return_depth_attention": True})
    assert status == 200, r
    assert json.loads(js.read_text()) == r["choices"][0]["depth_attention"]
