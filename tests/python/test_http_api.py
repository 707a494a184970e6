"""End-to-end tests of the OpenAI-compatible HTTP API (shared/design/API.md) against the real
`attnres serve` binary with the built-in demo model, through the official `openai` client and
raw http.client where the exact bytes matter."""

import json
import socket
import time
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from http_helpers import assert_error_envelope, connect, parse_sse, post_json, request
from server_process import ServerProcess

# One OpenMP thread for the engine: these tests exercise the HTTP front end, and on a shared
# 2-core machine OpenMP's spinning workers make step times swing 10x (timeouts, slow runs).
SERVER_ENV = {"OMP_NUM_THREADS": "1"}

PROMPT = "The quick brown fox jumps over the lazy dog"
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something about foxes."}]


@pytest.fixture(scope="module")
def server(attnres_bin):
    with ServerProcess(attnres_bin, "--max-num-seqs", "32", env=SERVER_ENV) as s:
        yield s


@pytest.fixture(scope="module")
def hf_tokenizer(repo_root) -> Tokenizer:
    return Tokenizer.from_file(str(Path(repo_root) / "engine/model/assets/gpt2/tokenizer.json"))


# ---------------------------------------------------------------- /v1/models, /health, /metrics

def test_models_lists_the_served_model(server, client, model_name):
    status, headers, body = request(server.http_url, "GET", "/v1/models")
    assert status == 200 and headers["content-type"].startswith("application/json")
    listing = json.loads(body)
    assert listing["object"] == "list" and len(listing["data"]) == 1
    m = listing["data"][0]
    assert {"id", "object", "created", "owned_by", "root", "max_model_len"} <= set(m)
    assert m["object"] == "model" and m["owned_by"] == "attnres"
    assert m["root"] == "built-in:demo"
    assert isinstance(m["created"], int) and m["max_model_len"] > 0
    assert [x.id for x in client.models.list().data] == [model_name]


def test_health_and_metrics(server, client, model_name):
    assert server.health() == 200
    before = server.metrics()
    client.completions.create(model=model_name, prompt=PROMPT, max_tokens=3,
                              extra_body={"ignore_eos": True})
    status, headers, body = request(server.http_url, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"attnres:" in body
    after = server.metrics()
    assert after["attnres:generation_tokens_total"] >= before.get(
        "attnres:generation_tokens_total", 0) + 3
    # The front end recorded the request's latencies (and its 2 inter-token gaps).
    for name, delta in (("attnres:e2e_request_latency_seconds_count", 1),
                        ("attnres:time_to_first_token_seconds_count", 1),
                        ("attnres:inter_token_latency_seconds_count", 2)):
        assert after[name] == before.get(name, 0) + delta, name
    # Requests refused before the engine are counted by status.
    request(server.http_url, "POST", "/v1/completions", {"prompt": "hi", "n": 0})
    rejected = {k: v for k, v in server.metrics().items()
                if k.startswith("attnres:requests_rejected_total{") and '"400"' in k}
    assert rejected and max(rejected.values()) >= 1


# ---------------------------------------------------------------- completions

def test_completion_basic(client, model_name):
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=7, temperature=0)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == model_name
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and isinstance(c.text, str) and c.finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == 9
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 7


def test_completion_default_max_tokens_is_16(client, model_name):
    r = client.completions.create(model=model_name, prompt=PROMPT, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_completion_prompt_forms(client, model_name, hf_tokenizer):
    ids = hf_tokenizer.encode(PROMPT).ids
    by_text = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5,
                                        temperature=0)
    by_ids = client.completions.create(model=model_name, prompt=ids, max_tokens=5, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text
    # A list of prompts: one choice set per prompt, indices continuing across prompts.
    many = client.completions.create(model=model_name, prompt=[PROMPT, "Hello"], n=2,
                                     max_tokens=4, temperature=0)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == by_text.choices[0].text[
        :len(many.choices[0].text)]
    hello = len(hf_tokenizer.encode("Hello").ids)
    assert many.usage.prompt_tokens == len(ids) + hello
    lists = client.completions.create(model=model_name, prompt=[ids, ids], max_tokens=5,
                                      temperature=0)
    assert [c.text for c in lists.choices] == [by_text.choices[0].text] * 2


def test_completion_stream_equals_non_stream(client, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=24, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks
              if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens
    assert all(c.id == chunks[0].id and c.id.startswith("cmpl-") for c in chunks)
    assert all(c.object == "text_completion" for c in chunks)  # as OpenAI and vLLM stream


def test_completion_n_and_seed(client, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=12, temperature=1.0)
    a = client.completions.create(**kwargs, seed=1234, n=3)
    b = client.completions.create(**kwargs, seed=1234, n=3)
    c = client.completions.create(**kwargs, seed=98765, n=3)
    assert [x.index for x in a.choices] == [0, 1, 2]
    assert [x.text for x in a.choices] == [x.text for x in b.choices]
    assert [x.text for x in a.choices] != [x.text for x in c.choices]
    # choice i samples with seed + i: the three choices differ
    assert len({x.text for x in a.choices}) == 3
    assert 3 <= a.usage.completion_tokens <= 36
    if all(x.finish_reason == "length" for x in a.choices):
        assert a.usage.completion_tokens == 36


def test_completion_stop_string(client, model_name):
    base = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20,
                                     temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert len(text) > 8
    stop = text[len(text) // 2:len(text) // 2 + 3]
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20, temperature=0,
                                  stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].text == text[:text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop
    streamed = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=20,
                                         temperature=0, stop=stop, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text


def test_completion_logprobs(client, model_name):
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6, temperature=0,
                                  logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(
        lp.text_offset) == n == 6
    for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert 1 <= len(top) <= 4
        # Greedy: the chosen token is the most likely one.
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    if "\ufffd" not in "".join(lp.tokens):
        assert "".join(lp.tokens) == r.choices[0].text
    # Streamed logprobs carry the same tokens.
    chunks = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6,
                                            temperature=0, logprobs=3, stream=True,
                                            extra_body={"ignore_eos": True}))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.tokens]
    assert streamed == lp.tokens


def test_completion_echo(client, model_name):
    plain = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5,
                                      temperature=0)
    echoed = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5,
                                       temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    streamed = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5,
                                         temperature=0, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == echoed.choices[0].text


def test_completion_return_token_ids(client, model_name, hf_tokenizer):
    r = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=5, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    c = r.choices[0]
    assert len(c.model_extra["token_ids"]) == r.usage.completion_tokens == 5
    assert c.model_extra["prompt_token_ids"] == hf_tokenizer.encode(PROMPT).ids
    assert hf_tokenizer.decode(c.model_extra["token_ids"]) == c.text
    chunks = list(client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True}))
    streamed = [t for ch in chunks if ch.choices
                for t in (ch.choices[0].model_extra.get("token_ids") or [])]
    assert streamed == c.model_extra["token_ids"]
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == c.model_extra["prompt_token_ids"]


# ---------------------------------------------------------------- chat

def test_chat_basic(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=8,
                                       temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_content_parts_equal_string(client, model_name):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say something"},
                                          {"type": "text", "text": "about foxes."}]}]
    joined = [{"role": "user", "content": "Say something\nabout foxes."}]
    a = client.chat.completions.create(model=model_name, messages=parts, max_tokens=6,
                                       temperature=0)
    b = client.chat.completions.create(model=model_name, messages=joined, max_tokens=6,
                                       temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_chat_max_completion_tokens_and_default(client, model_name, server):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_completion_tokens=3,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


def test_chat_stream_equals_non_stream(client, model_name):
    kwargs = dict(model=model_name, messages=CHAT, max_tokens=20, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    with_finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(with_finish) == 1 and with_finish[0] is chunks[-2]
    assert with_finish[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_chat_n_and_seed(client, model_name):
    kwargs = dict(model=model_name, messages=CHAT, max_tokens=10, temperature=1.0, n=2)
    a = client.chat.completions.create(**kwargs, seed=7)
    b = client.chat.completions.create(**kwargs, seed=7)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    streamed = list(client.chat.completions.create(**kwargs, seed=7, stream=True))
    texts = ["", ""]
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in a.choices]


def test_chat_logprobs(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    for entry in content:
        assert entry.logprob <= 0 and isinstance(entry.token, str)
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
    plain = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=5,
                                           temperature=0)
    assert plain.choices[0].logprobs is None


def test_chat_return_token_ids(client, model_name, server):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=4,
                                       temperature=0,
                                       extra_body={"return_token_ids": True, "ignore_eos": True})
    assert len(r.choices[0].model_extra["token_ids"]) == 4
    chunks = list(client.chat.completions.create(
        model=model_name, messages=CHAT, max_tokens=4, temperature=0, stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True}))
    streamed = [t for ch in chunks if ch.choices
                for t in (ch.choices[0].model_extra.get("token_ids") or [])]
    assert streamed == r.choices[0].model_extra["token_ids"]
    prompt_ids = r.model_extra["prompt_token_ids"]
    assert len(prompt_ids) == r.usage.prompt_tokens
    # The rendered prompt tokenized by /tokenize with messages gives the same ids.
    status, _, tok = post_json(server.http_url, "/tokenize", {"messages": CHAT})
    assert status == 200 and tok["tokens"] == prompt_ids


def test_chat_template_kwargs_and_tools_accepted(client, model_name):
    r = client.chat.completions.create(
        model=model_name, messages=CHAT, max_tokens=2,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.role == "assistant"


# ---------------------------------------------------------------- /tokenize, /detokenize

@pytest.mark.parametrize("text", [PROMPT, "héllo wörld 👋 <|endoftext|> tabs\tand\nnewlines",
                                  " "])
def test_tokenize_detokenize_round_trip(server, hf_tokenizer, text):
    status, _, tok = post_json(server.http_url, "/tokenize", {"prompt": text})
    assert status == 200
    expected = hf_tokenizer.encode(text).ids
    assert tok["tokens"] == expected and tok["count"] == len(expected)
    assert tok["max_model_len"] > 0
    status, _, detok = post_json(server.http_url, "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and detok["prompt"] == hf_tokenizer.decode(expected,
                                                                    skip_special_tokens=False)
    assert detok["prompt"] == text


# ---------------------------------------------------------------- raw SSE framing

def _raw_stream(server, path, body) -> tuple[int, dict, bytes]:
    return request(server.http_url, "POST", path, dict(body, stream=True))


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                         "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0,
                              "stream_options": {"include_usage": True}}),
])
def test_sse_framing_exact(server, path, body):
    status, headers, raw = _raw_stream(server, path, body)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert raw.endswith(b"data: [DONE]\n\n")
    events = parse_sse(raw)
    assert events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert all({"id", "object", "created", "model", "choices"} <= set(c) for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all("usage" not in c for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1


def test_client_disconnect_cancels_the_request(server):
    """A client that leaves mid-stream: the request is aborted (KV freed), not run to the end."""
    def aborted() -> float:
        return sum(v for k, v in server.metrics().items()
                   if k.startswith("attnres:request_success_total{") and 'reason="abort"' in k)

    before = aborted()
    conn = connect(server.http_url)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": PROMPT, "max_tokens": 5000, "ignore_eos": True, "stream": True}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.fp.readline()
    assert first.startswith(b"data: ") or first.strip().isalnum()  # chunk size or data line
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.monotonic() + 20
    while aborted() <= before:
        assert time.monotonic() < deadline, "the request was not aborted after the disconnect"
        time.sleep(0.05)
    # The server keeps serving.
    status, _, body = post_json(server.http_url, "/v1/completions",
                                {"prompt": "x", "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_many_concurrent_streams(server):
    """Streams each hold a server thread: many at once must all complete, with the same text."""
    from concurrent.futures import ThreadPoolExecutor

    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}

    def one(_):
        status, _, raw = _raw_stream(server, "/v1/completions", body)
        assert status == 200
        events = parse_sse(raw)
        assert events[-1] == b"[DONE]"
        return "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])

    with ThreadPoolExecutor(max_workers=256) as pool:
        texts = list(pool.map(one, range(256)))
    status, _, whole = post_json(server.http_url, "/v1/completions", body)
    assert texts == [whole["choices"][0]["text"]] * 256


# ---------------------------------------------------------------- auth

@pytest.fixture(scope="module")
def secured(attnres_bin):
    with ServerProcess(attnres_bin, "--api-key", "s3cret", "--api-key", "other-key",
                       env=SERVER_ENV) as s:
        yield s


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "s3cret"},
                                     {"Authorization": "Bearer s3cre"}])
@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                         ("POST", "/v1/chat/completions"), ("POST", "/tokenize")])
def test_auth_rejects_missing_or_wrong_key(secured, headers, method, path):
    status, hdrs, body = request(secured.http_url, method, path,
                                 {"prompt": "hi", "max_tokens": 1} if method == "POST" else None,
                                 headers)
    assert status == 401
    assert_error_envelope(json.loads(body), code="invalid_api_key")


def test_auth_open_routes_and_valid_keys(secured):
    assert secured.health() == 200
    status, _, _ = request(secured.http_url, "GET", "/metrics")
    assert status == 200
    status, _, _ = request(secured.http_url, "GET", "/v1/models",
                           headers={"Authorization": "bearer s3cret"})
    assert status == 200  # the scheme is case-insensitive
    status, _, _ = request(secured.http_url, "GET", "/v1/models",
                           headers={"Authorization": "Bearer S3CRET"})
    assert status == 401  # the key is not
    for key in ("s3cret", "other-key"):
        c = openai.OpenAI(base_url=secured.http_url + "/v1", api_key=key, max_retries=0,
                          timeout=60)
        model = c.models.list().data[0].id
        assert c.completions.create(model=model, prompt="hi", max_tokens=2).usage.total_tokens > 0
    bad = openai.OpenAI(base_url=secured.http_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_port_in_use_fails_naming_host_and_port(attnres_bin):
    import subprocess
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([str(attnres_bin), "serve", "--port", str(port), "--grpc-port", "0",
                               "--kv-cache-memory", "64MiB"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"127.0.0.1:{port}" in proc.stderr + proc.stdout
