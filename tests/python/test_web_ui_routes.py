"""The web playground's routes without a browser: the page and its files (compiled into the
binary) with a Content-Security-Policy that allows this origin only, GET /ui/model-info (the
model's card) against the model's config, the API key rules, and --no-ui. The page itself is
tested in browsers by test_web_ui.py (Chromium) and test_web_ui_firefox.py (firefox-esr)."""

import json

import pytest

from checkpoint_cache import checkpoint_fixture
from http_helpers import post_json, request
from server_process import ServerProcess

KEY = "routes-test-key"


@pytest.fixture(scope="module")
def server(attnres_bin):
    with ServerProcess(attnres_bin) as s:
        yield s


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="webui_routes", seed=4)


def test_page_and_files_forbid_other_origins(server, repo_root):
    status, headers, body = request(server.http_url, "GET", "/")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    # The bytes served are the repository's file (embedded at build time).
    assert body == (repo_root / "server/http/ui/index.html").read_bytes()
    csp = headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'",
                      "connect-src 'self'", "img-src 'self' data:"):
        assert directive in csp, csp
    assert headers["x-content-type-options"] == "nosniff"
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css")):
        status, headers, body = request(server.http_url, "GET", "/ui/" + name)
        assert status == 200 and headers["content-type"] == kind + "; charset=utf-8", name
        assert body == (repo_root / "server/http/ui" / name).read_bytes()
        assert b"http://" not in body and b"https://" not in body  # nothing named elsewhere
    assert request(server.http_url, "HEAD", "/")[0] == 200
    assert request(server.http_url, "GET", "/ui/nothing.js")[0] == 404
    assert request(server.http_url, "POST", "/")[0] == 405


def test_model_info_is_the_demo_models_card(server):
    status, _, raw = request(server.http_url, "GET", "/ui/model-info")
    assert status == 200
    info = json.loads(raw)
    # engine/model/loaded_model.cpp's demo: qwen3_attnres, 8 layers, d 256, 8 / 4 heads of 32,
    # block AttnRes in 4 blocks, bf16 random weights, GPT-2's vocabulary.
    assert info["id"] == "attnres-demo" and info["source"] == "built-in:demo"
    assert (info["model_type"], info["num_layers"], info["hidden_size"], info["num_heads"],
            info["num_kv_heads"], info["head_dim"], info["intermediate_size"],
            info["vocab_size"]) == ("qwen3_attnres", 8, 256, 8, 4, 32, 768, 50257)
    assert (info["attnres_mode"], info["attnres_num_blocks"], info["attnres_gate"]) == \
        ("block", 4, "bias")
    assert info["depth_attention"] is True and info["dtype"] == "BF16"
    assert info["device"].startswith("cpu") and info["chat_template"] is True
    models = json.loads(request(server.http_url, "GET", "/v1/models")[2])["data"][0]
    assert info["max_model_len"] == models["max_model_len"]


def test_model_info_of_a_plain_model_says_no_depth_attention(attnres_bin, checkpoint):
    with ServerProcess(attnres_bin, "--model", checkpoint("qwen3")) as s:
        info = json.loads(request(s.http_url, "GET", "/ui/model-info")[2])
        assert info["attnres_mode"] == "none" and info["depth_attention"] is False
        assert "attnres_num_blocks" not in info and info["dtype"] == "F32"
        # What the flag predicts: the API refuses depth attention on this model.
        status, _, body = post_json(s.http_url, "/v1/completions",
                                    {"prompt": "x", "max_tokens": 1, "return_depth_attention": True})
        assert status == 400 and body["error"]["param"] == "return_depth_attention"


def test_with_an_api_key_the_page_loads_and_the_card_needs_the_key(attnres_bin):
    with ServerProcess(attnres_bin, "--api-key", KEY) as s:
        for path in ("/", "/ui/app.js", "/ui/app.css"):
            assert request(s.http_url, "GET", path)[0] == 200, path
        status, _, body = request(s.http_url, "GET", "/ui/model-info")
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        auth = {"Authorization": "Bearer " + KEY}
        assert request(s.http_url, "GET", "/ui/model-info", headers=auth)[0] == 200


def test_no_ui_turns_the_page_off(attnres_bin):
    with ServerProcess(attnres_bin, "--no-ui") as s:
        for path in ("/", "/ui/app.js", "/ui/model-info"):
            status, _, body = request(s.http_url, "GET", path)
            assert status == 404, path
            assert json.loads(body)["error"]["code"] == "not_found"
        assert request(s.http_url, "GET", "/v1/models")[0] == 200
        assert "web playground" not in s.log()
