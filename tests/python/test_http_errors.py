"""Bad input to the HTTP API: each case gets its documented status and the OpenAI error
envelope {"error": {"message", "type", "param", "code"}}, and the server keeps serving normal
requests afterwards (checked after every test)."""

import json
import socket

from http_helpers import connect

import pytest

from http_helpers import assert_error_envelope, post_json, request
from server_process import ServerProcess

# One OpenMP thread for the engine: these tests exercise the HTTP front end, and on a shared
# 2-core machine OpenMP's spinning workers make step times swing 10x (timeouts, slow runs).
SERVER_ENV = {"OMP_NUM_THREADS": "1"}

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def server(attnres_bin):
    with ServerProcess(attnres_bin, "--max-model-len", str(MAX_MODEL_LEN), env=SERVER_ENV) as s:
        yield s


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    status, _, body = post_json(server.http_url, "/v1/completions",
                                {"prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] in ("length", "stop")
    assert server.health() == 200


def expect(server, path, body, status, *, param=None, code=None, method="POST"):
    got, headers, raw = request(server.http_url, method, path, body)
    assert got == status, raw
    assert headers["content-type"].startswith("application/json")
    return assert_error_envelope(json.loads(raw), param=param, code=code)


CHAT = [{"role": "user", "content": "hi"}]


def test_malformed_json(server):
    expect(server, "/v1/completions", b'{"prompt": "hi", "max_tokens": ', 400)
    expect(server, "/v1/chat/completions", b"not json at all", 400)
    expect(server, "/v1/completions", b"", 400)
    expect(server, "/v1/completions", b'["a", "list"]', 400)
    # A number past a double's range (found by tests/fuzz: it used to escape the JSON check).
    expect(server, "/v1/completions", b'{"prompt": "hi", "max_tokens": 1e999999}', 400)
    expect(server, "/tokenize", b'{"prompt": "hi", "x": -1E400}', 400)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "n": 1.5}, "n"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "hi", "stop": 5}, "stop"),
    ("/v1/completions", {"prompt": {"text": "hi"}}, "prompt"),
    ("/v1/completions", {"prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/chat/completions", {"messages": "hello"}, "messages"),
    ("/v1/chat/completions", {"messages": {"role": "user", "content": "hi"}}, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": "5"},
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": 3}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages"),
])
def test_wrong_types(server, path, body, param):
    message = expect(server, path, body, 400, param=param)
    assert param in message


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 100000}, "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 50}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 1000}}, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "seed": 2 ** 64}, "seed"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 30, "logprobs": True},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": 1000}, "temperature"),
])
def test_out_of_range(server, path, body, param):
    message = expect(server, path, body, 400, param=param)
    assert param in message


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": [50257], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": [-1], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], [3, 10 ** 9]], "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [50257]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/detokenize", {"tokens": [1, 2, 50257]}, "tokens"),
    ("/detokenize", {"tokens": [-3]}, "tokens"),
])
def test_token_ids_outside_vocabulary(server, path, body, param):
    message = expect(server, path, body, 400, param=param)
    assert "50257" in message or "vocab" in message


def test_invalid_utf8_body(server):
    expect(server, "/v1/completions", b'{"prompt": "\xff\xfe abc", "max_tokens": 2}', 400)
    expect(server, "/v1/chat/completions",
           b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', 400)
    expect(server, "/tokenize", b'{"prompt": "\xed\xa0\x80"}', 400)


@pytest.mark.parametrize("messages", [[], [{"content": "hi"}], [{"role": 3, "content": "x"}],
                                      ["just a string"]])
def test_bad_messages(server, messages):
    expect(server, "/v1/chat/completions", {"messages": messages}, 400, param="messages")


def test_template_error_is_400(server):
    # The demo template renders any role; a part list without text is a shape error.
    expect(server, "/v1/chat/completions",
           {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400)


def test_over_long_prompt_completions(server):
    prompt = [10] * 200
    message = expect(server, "/v1/completions", {"prompt": prompt, "max_tokens": 100}, 400,
                     param="prompt")
    assert str(MAX_MODEL_LEN) in message and "300" in message and "200" in message
    message = expect(server, "/v1/completions", {"prompt": [10] * 300, "max_tokens": 1}, 400)
    assert str(MAX_MODEL_LEN) in message and "300" in message


def test_over_long_prompt_chat(server):
    long = [{"role": "user", "content": "hello " * 400}]
    message = expect(server, "/v1/chat/completions", {"messages": long}, 400, param="messages")
    assert str(MAX_MODEL_LEN) in message
    status, _, tok = post_json(server.http_url, "/tokenize", {"messages": long})
    assert str(tok["count"]) in message
    short = [{"role": "user", "content": "hello " * 100}]
    message = expect(server, "/v1/chat/completions", {"messages": short, "max_tokens": 200}, 400,
                     param="messages")
    status, _, tok = post_json(server.http_url, "/tokenize", {"messages": short})
    assert str(MAX_MODEL_LEN) in message and str(tok["count"]) in message
    assert str(tok["count"] + 200) in message
    # Without max_tokens, chat gets the room the prompt leaves.
    status, _, body = post_json(server.http_url, "/v1/chat/completions",
                                {"messages": short, "temperature": 0, "ignore_eos": True})
    assert status == 200 and body["usage"]["total_tokens"] == MAX_MODEL_LEN


def test_half_sent_request(server):
    port = int(server.http_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"hel")
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(30)
        data = b""
        while chunk := sock.recv(65536):  # the server answers (400) or just closes
            data += chunk
    assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:100]


def test_body_too_large(server):
    port = int(server.http_url.rsplit(":", 1)[1])
    size = 40 << 20
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(size).encode() + b"\r\n\r\n")
        try:
            sock.sendall(b" " * size)
        except OSError:
            pass  # the server may answer and close before reading everything
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    assert data.startswith(b"HTTP/1.1 413") or data.startswith(b"HTTP/1.1 400"), data[:100]


def test_unknown_route_and_method(server):
    expect(server, "/v1/nothing", {"a": 1}, 404, code="not_found")
    expect(server, "/v2/completions", None, 404, method="GET")
    expect(server, "/v1/completions", None, 405, method="GET")
    expect(server, "/v1/models", {}, 405)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": CHAT}),
    ("/tokenize", {"model": "gpt-4", "prompt": "hi"}),
])
def test_unknown_model(server, path, body):
    message = expect(server, path, body, 404, param="model", code="model_not_found")
    assert "gpt-4" in message


def test_unknown_fields_are_ignored(server):
    status, _, body = post_json(server.http_url, "/v1/completions",
                                {"prompt": "hi", "max_tokens": 2, "best_of_unknown": {"x": 1},
                                 "model": None})
    assert status == 200, body


def test_echo_with_logprobs_is_accepted(server):
    # Prompt logprobs (tests/python/test_http_prompt_logprobs.py checks their values).
    status, _, body = post_json(server.http_url, "/v1/completions",
                                {"prompt": "hi", "echo": True, "logprobs": 1, "max_tokens": 2})
    assert status == 200, body
    assert body["choices"][0]["logprobs"]["token_logprobs"][0] is None


@pytest.fixture(scope="module")
def tiny_queue(attnres_bin):
    with ServerProcess(attnres_bin, "--max-num-seqs", "1", "--max-queued-requests", "1",
                       env=SERVER_ENV) as s:
        yield s


def test_queue_full_is_503_with_retry_after(tiny_queue):
    long = {"prompt": "Hello", "max_tokens": 20000, "ignore_eos": True, "stream": True}
    held = []
    try:
        for _ in range(2):  # one running, one queued
            conn = connect(tiny_queue.http_url)
            conn.request("POST", "/v1/completions", body=json.dumps(long),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200
            held.append(conn)
            if len(held) == 1:
                resp.fp.readline()  # the first is running once it produced output
        status, headers, raw = request(tiny_queue.http_url, "POST", "/v1/completions",
                                       {"prompt": "Hello", "max_tokens": 2})
        assert status == 503 and headers.get("retry-after") == "1"
        assert_error_envelope(json.loads(raw))
    finally:
        for conn in held:
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
    # Once the held requests are cancelled (client gone), the server serves again.
    import time
    deadline = time.monotonic() + 20
    while True:
        status, _, _ = request(tiny_queue.http_url, "POST", "/v1/completions",
                               {"prompt": "Hello", "max_tokens": 2})
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline
        time.sleep(0.05)
