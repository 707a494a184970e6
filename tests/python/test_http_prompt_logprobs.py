"""/v1/completions with echo + logprobs (vLLM's prompt_logprobs) against the NumPy reference:
every prompt position's logprob is log_softmax of the reference logits of the previous row
(position 0: null), with and without chunked prefill, streamed and not."""

import json
import shutil

import numpy as np
import pytest

import attnres_ref as ref
from http_helpers import parse_sse, post_json, request
from make_checkpoint import make_checkpoint
from server_process import ServerProcess

SERVER_ENV = {"OMP_NUM_THREADS": "1"}
PROMPT_IDS = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]  # 10 tokens
MAX_TOKENS = 4
TOP = 2


@pytest.fixture(scope="module")
def model_dir(ckpt_root):
    path = make_checkpoint(ckpt_root / "prompt_logprobs_block", "attnres_block", seed=3,
                           dtype="f32")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(model_dir):
    return ref.load(model_dir)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def expected(reference, generated):
    """Reference logprobs of prompt + generated tokens: [None, lp(t1), ..., lp(t_last)]."""
    ids = PROMPT_IDS + list(generated)
    lps = log_softmax(reference.logits(ids))
    return [None] + [float(lps[i - 1, ids[i]]) for i in range(1, len(ids))], lps


def check_logprobs(reference, logprobs, generated_ids):
    n_prompt, n_gen = len(PROMPT_IDS), len(generated_ids)
    want, lps = expected(reference, generated_ids)
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert len(logprobs[key]) == n_prompt + n_gen, key
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    for i in range(1, n_prompt + n_gen):
        got = logprobs["token_logprobs"][i]
        assert got == pytest.approx(want[i], abs=1e-4), f"position {i}"
        top = logprobs["top_logprobs"][i]
        # The top TOP alternatives plus the token itself (when not among them).
        assert TOP <= len(top) <= TOP + 1, f"position {i}"
        best = sorted(lps[i - 1], reverse=True)[:TOP]
        assert sorted(top.values(), reverse=True)[:TOP] == pytest.approx(best, abs=1e-4)
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    # Greedy: each generated token is the most likely one.
    for i in range(n_prompt, n_prompt + n_gen):
        assert want[i] == pytest.approx(float(lps[i - 1].max()), abs=1e-4)


def body(**extra):
    return {"prompt": PROMPT_IDS, "max_tokens": MAX_TOKENS, "temperature": 0,
            "echo": True, "logprobs": TOP, "ignore_eos": True, "return_token_ids": True, **extra}


def run_checks(server, reference):
    status, _, r = post_json(server.http_url, "/v1/completions", body())
    assert status == 200, r
    choice = r["choices"][0]
    generated = choice["token_ids"]
    assert len(generated) == MAX_TOKENS
    assert generated == reference.greedy(PROMPT_IDS, MAX_TOKENS)
    check_logprobs(reference, choice["logprobs"], generated)

    # Streamed: the prompt's part comes in the first chunk, with the echoed prompt text.
    status, _, raw = request(server.http_url, "POST", "/v1/completions", body(stream=True))
    assert status == 200
    events = [e for e in parse_sse(raw) if e != b"[DONE]"]
    chunks = [json.loads(e)["choices"][0] for e in events if json.loads(e)["choices"]]
    first = chunks[0]
    assert first["logprobs"]["token_logprobs"][0] is None
    assert len(first["logprobs"]["tokens"]) >= len(PROMPT_IDS)
    merged = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    text = ""
    for c in chunks:
        text += c["text"]
        if c.get("logprobs"):
            for k in merged:
                merged[k] += c["logprobs"][k]
    assert merged == choice["logprobs"]
    assert text == choice["text"]
    assert first["text"].startswith(r["choices"][0]["text"][:1])  # the echoed prompt comes first

    # Streamed n > 1: each choice's first chunk starts with the prompt's part.
    status, _, raw = request(server.http_url, "POST", "/v1/completions", body(stream=True, n=2))
    assert status == 200
    firsts = {}
    for e in parse_sse(raw):
        if e == b"[DONE]":
            continue
        for c in json.loads(e)["choices"]:
            if c.get("logprobs") and c["index"] not in firsts:
                firsts[c["index"]] = c["logprobs"]["token_logprobs"]
    assert sorted(firsts) == [0, 1]
    for lps in firsts.values():
        assert lps[:len(PROMPT_IDS)] == choice["logprobs"]["token_logprobs"][:len(PROMPT_IDS)]

    # n > 1: every choice's logprobs start with the same prompt part.
    status, _, r = post_json(server.http_url, "/v1/completions", body(n=2))
    assert status == 200, r
    for c in r["choices"]:
        assert c["logprobs"]["token_logprobs"][:len(PROMPT_IDS)] == \
            choice["logprobs"]["token_logprobs"][:len(PROMPT_IDS)]


def test_echo_logprobs_match_the_reference(attnres_bin, model_dir, reference):
    with ServerProcess(attnres_bin, "--model", model_dir, env=SERVER_ENV) as server:
        run_checks(server, reference)
        # Without echo nothing about the prompt is reported.
        status, _, r = post_json(server.http_url, "/v1/completions", body(echo=False))
        assert status == 200, r
        assert len(r["choices"][0]["logprobs"]["tokens"]) == MAX_TOKENS


def test_echo_logprobs_with_chunked_prefill(attnres_bin, model_dir, reference):
    # A 4-token step budget splits the 10-token prompt into 3 chunks.
    with ServerProcess(attnres_bin, "--model", model_dir, "--max-num-batched-tokens", "4",
                       env=SERVER_ENV) as server:
        run_checks(server, reference)
