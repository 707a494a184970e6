"""Small raw-HTTP helpers for the HTTP front-end tests (http.client: exact bytes, no retries)."""

import http.client
import json
from urllib.parse import urlparse

TIMEOUT = 60.0


def connect(url: str) -> http.client.HTTPConnection:
    u = urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=TIMEOUT)


def request(url: str, method: str, path: str, body: bytes | str | dict | None = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:
    """One request on a fresh connection: (status, lower-cased headers, raw body)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    conn = connect(url)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def post_json(url: str, path: str, body, headers: dict | None = None) -> tuple[int, dict, dict]:
    status, hdrs, data = request(url, "POST", path, body, headers)
    return status, hdrs, json.loads(data) if data else {}


def assert_error_envelope(body: dict, *, param: str | None = None, code: str | None = None) -> str:
    """The OpenAI error shape; returns the message."""
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err["message"]


def parse_sse(raw: bytes) -> list[bytes]:
    """Splits an SSE body into the payloads of its events, checking the exact framing:
    every event is b"data: <payload>\\n\\n" and nothing else is in the stream."""
    events = []
    rest = raw
    while rest:
        assert rest.startswith(b"data: "), rest[:80]
        end = rest.index(b"\n\n")
        payload = rest[len(b"data: "):end]
        assert b"\n" not in payload, payload
        events.append(payload)
        rest = rest[end + 2:]
    return events


def served_model_name(url: str) -> str:
    """The id /v1/models lists first (the served model)."""
    status, _, body = request(url, "GET", "/v1/models")
    assert status == 200
    return json.loads(body)["data"][0]["id"]


def openai_client(url: str):
    """The official client against the server at `url` (no retries: a failure shows at once)."""
    import openai
    return openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)
