"""The field's benchmark tools against the real server: their exact requests, parsed their way.

Both tools ran unmodified against `attnres serve` on the development machine (their figures
are in docs/perf-log/serving.md), but neither can be installed in CI: GuideLLM 0.8.1 depends on
torch (the PyPI wheel pulls ~5 GB of CUDA libraries), and vLLM 0.33.0 needs `pip install
--no-deps vllm` plus about thirty hand-picked dependencies and a torch. So these tests replay
what they send, as read from their sources, and parse the streams the way they do:

- `vllm bench serve` (vllm 0.33.0: vllm/benchmarks/serve.py get_first_model_from_server and
  _align_prompts_to_server_tokenizer; vllm/benchmarks/lib/endpoint_request_func.py
  async_request_openai_completions, async_request_openai_chat_completions and
  StreamedResponseHandler): GET /v1/models for data[0].id and .root; /tokenize and /detokenize
  with add_special_tokens false; POST /v1/completions with repetition_penalty 1.0, logprobs
  null, stream_options.include_usage and ignore_eos, or /v1/chat/completions with a
  list-of-parts user message and max_completion_tokens; Authorization from OPENAI_API_KEY and
  x-request-id. The body is read as it arrives (aiohttp's iter_any), messages are split
  at blank lines, ":" comments skipped, "data: " removed, [DONE] ignored; a chunk with
  non-empty `choices` is a token chunk (the first gives TTFT), a chunk with `usage` gives
  completion_tokens and prompt_tokens.
- GuideLLM 0.8.1 (guidellm/backends/openai/http.py OpenAIHTTPBackend.validate,
  available_models, _resolve_streaming; request_handlers.py TextCompletionsRequestHandler and
  ChatCompletionsRequestHandler format / add_streaming_line / extract_line_data): GET /health,
  GET /v1/models, then the body it recorded in its own result file for this server, with
  stream_options {include_usage, continuous_usage_stats}, max_completion_tokens (completions:
  max_tokens) and ignore_eos; the response read line by line, "data:" lines parsed as JSON,
  an `error` field failing the request, text / delta.content counting as token iterations.

With ATTNRES_VLLM=/path/to/vllm or ATTNRES_GUIDELLM=/path/to/guidellm (executables of a venv
that has them) the real tools also run here, briefly.
"""

import http.client
import json
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from server_process import ServerProcess

API_KEY = "bench-compat-key"
GPT2_DIR = Path(__file__).resolve().parents[2] / "engine/model/assets/gpt2"
PROMPT = ("Depth attention mixes earlier representations of the same token with a softmax "
          "over learned queries, block by block.")
OUTPUT_LEN = 8


@pytest.fixture(scope="module")
def server(attnres_bin):
    if not attnres_bin.exists():
        pytest.fail(f"attnres binary not found at {attnres_bin}: build first (tests/run.sh)")
    with ServerProcess(attnres_bin, "--api-key", API_KEY, "--max-num-seqs", "8") as s:
        yield s


def connect(server):
    u = urlparse(server.http_url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=120)


def get_json(server, path, headers):
    conn = connect(server)
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, (json.loads(body) if body else None)


def post_json(server, path, body, headers):
    conn = connect(server)
    conn.request("POST", path, json.dumps(body), {**headers, "Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read())
    conn.close()
    return r.status, data


def vllm_headers(content_type=None, request_id="bench-0000abcd-0"):
    # endpoint_request_func._get_headers / _update_headers_common. vLLM takes the key from
    # OPENAI_API_KEY for generation requests only; /v1/models gets just the --header values,
    # so against a server with a key (ours or vLLM's: both protect /v1/*) it is run with
    # --header Authorization="Bearer KEY", which these replays send everywhere.
    headers = {"Authorization": f"Bearer {API_KEY}", "x-request-id": request_id}
    if content_type:
        headers["Content-Type"] = content_type
    return headers


class VllmStreamReader:
    """vLLM's StreamedResponseHandler behaviour: complete messages out of arbitrary pieces.

    Messages end at a blank line ("\\n\\n"); a remainder that already is "data: [DONE]" or
    "data: <complete JSON>" is taken as a message too.
    """

    def __init__(self):
        self.buffer = ""

    def add(self, piece: bytes) -> list[str]:
        self.buffer += piece.decode("utf-8")
        out = []
        while "\n\n" in self.buffer:
            message, self.buffer = self.buffer.split("\n\n", 1)
            if message.strip():
                out.append(message.strip())
        if self.buffer.startswith("data: "):
            rest = self.buffer[len("data: "):].strip()
            complete = rest == "[DONE]"
            if rest and not complete:
                try:
                    json.loads(rest)
                    complete = True
                except json.JSONDecodeError:
                    pass
            if complete:
                out.append(self.buffer.strip())
                self.buffer = ""
        return out


def vllm_request(server, path, payload, chat):
    """One request the way vLLM's request functions send and time it."""
    conn = connect(server)
    body = json.dumps(payload)
    headers = vllm_headers("application/json" if chat else None)
    headers.setdefault("Content-Type", "application/json")  # aiohttp's json= sets it
    start = time.perf_counter()
    conn.request("POST", path, body, headers)
    response = conn.getresponse()
    out = {"status": response.status, "ttft": None, "itl": [], "text": "", "output_tokens": 0,
           "prompt_len": None, "content_type": response.getheader("Content-Type")}
    if response.status != 200:
        out["error"] = response.read().decode()
        return out
    reader, last = VllmStreamReader(), start
    # Whatever the socket has, as aiohttp's iter_any. (vLLM strips every piece, which would
    # corrupt events split at arbitrary bytes, e.g. right after "data:"; real reads end where
    # the server's writes do, so it holds in practice.)
    while piece := response.read1(65536):
        piece = piece.strip()
        if not piece:
            continue
        for message in reader.add(piece):
            if message.startswith(":"):
                continue
            data = message.removeprefix("data: ")
            if data == "[DONE]":
                continue
            event = json.loads(data)
            now = time.perf_counter()
            if choices := event.get("choices"):
                text = choices[0]["delta"].get("content") if chat else choices[0].get("text")
                if out["ttft"] is None:
                    out["ttft"] = now - start
                else:
                    out["itl"].append(now - last)
                last = now
                out["text"] += text or ""
            elif usage := event.get("usage"):
                out["output_tokens"] = usage.get("completion_tokens")
                out["prompt_len"] = usage.get("prompt_tokens")
    conn.close()
    out["latency"] = last - start
    return out


def test_vllm_first_model_and_tokenizer_alignment(server):
    status, models = get_json(server, "/v1/models", vllm_headers())
    assert status == 200
    first = models["data"][0]
    model_name, model_id = first["id"], first["root"]  # get_first_model_from_server
    assert model_name == "attnres-demo" and model_id
    # _align_prompts_to_server_tokenizer posts model_id (the root). Our server serves the model
    # under its served name only, as vLLM does when --served-model-name differs from the path:
    # vLLM then prints a warning and keeps its own (identical) tokenization.
    status, _ = post_json(server, "/tokenize", {"model": model_id, "prompt": PROMPT,
                                                "add_special_tokens": False}, vllm_headers())
    assert status == 404
    # With the served name, the alignment round trip works: tokens, then the cut text.
    status, tok = post_json(server, "/tokenize", {"model": model_name, "prompt": PROMPT,
                                                  "add_special_tokens": False}, vllm_headers())
    assert status == 200 and tok["count"] == len(tok["tokens"]) > 10
    status, detok = post_json(server, "/detokenize", {"model": model_name,
                                                      "tokens": tok["tokens"][:10]},
                              vllm_headers())
    assert status == 200 and PROMPT.startswith(detok["prompt"])


def test_vllm_completions_request(server):
    payload = {"model": "attnres-demo", "prompt": PROMPT, "repetition_penalty": 1.0,
               "max_tokens": OUTPUT_LEN, "logprobs": None, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": True}
    out = vllm_request(server, "/v1/completions", payload, chat=False)
    assert out["status"] == 200, out.get("error")
    assert out["content_type"].startswith("text/event-stream")
    assert out["ttft"] is not None and out["ttft"] > 0  # vLLM's success condition
    assert out["output_tokens"] == OUTPUT_LEN
    _, tok = post_json(server, "/tokenize", {"model": "attnres-demo", "prompt": PROMPT},
                       vllm_headers())
    assert out["prompt_len"] == tok["count"]
    # One chunk per engine step: at most one per token (steps may be coalesced under load).
    assert 1 <= len(out["itl"]) + 1 <= OUTPUT_LEN
    assert out["text"]


def test_vllm_chat_request(server):
    payload = {"model": "attnres-demo",
               "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
               "max_completion_tokens": OUTPUT_LEN, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": True}
    out = vllm_request(server, "/v1/chat/completions", payload, chat=True)
    assert out["status"] == 200, out.get("error")
    assert out["ttft"] is not None and out["output_tokens"] == OUTPUT_LEN
    _, tok = post_json(server, "/tokenize", {"model": "attnres-demo",
                                             "messages": payload["messages"]}, vllm_headers())
    assert out["prompt_len"] == tok["count"]
    assert 1 <= len(out["itl"]) + 1 <= OUTPUT_LEN + 1  # + the role chunk
    assert out["text"]


def test_stream_has_no_empty_finish_chunk(server):
    """Every choice chunk carries the tokens of a step; the finish reason rides on the last."""
    for path, chat in (("/v1/completions", False), ("/v1/chat/completions", True)):
        payload = {"model": "attnres-demo", "max_tokens": OUTPUT_LEN, "stream": True,
                   "ignore_eos": True, "return_token_ids": True,
                   "stream_options": {"include_usage": True}}
        if chat:
            payload["messages"] = [{"role": "user", "content": PROMPT}]
        else:
            payload["prompt"] = PROMPT
        conn = connect(server)
        conn.request("POST", path, json.dumps(payload), vllm_headers("application/json"))
        events = [json.loads(line[len("data: "):]) for line in
                  conn.getresponse().read().decode().split("\n\n")
                  if line.startswith("data: {")]
        conn.close()
        chunks = [e["choices"][0] for e in events if e.get("choices")]
        if chat:
            assert chunks[0]["delta"] == {"role": "assistant", "content": ""}
            chunks = chunks[1:]
        assert all(c["token_ids"] for c in chunks), chunks
        assert sum(len(c["token_ids"]) for c in chunks) == OUTPUT_LEN
        assert [c["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
        assert events[-1]["usage"]["completion_tokens"] == OUTPUT_LEN


def guidellm_lines(response):
    """httpx's aiter_lines: split at \\n, \\r\\n or \\r; GuideLLM skips blank lines."""
    text = response.read().decode()
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("request_format", ["/v1/chat/completions", "/v1/completions"])
def test_guidellm_requests(server, request_format):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    status, _ = get_json(server, "/health", headers)  # OpenAIHTTPBackend.validate
    assert status == 200
    status, models = get_json(server, "/v1/models", headers)  # available_models
    model = [item["id"] for item in models["data"]][0]
    stream_options = {"include_usage": True, "continuous_usage_stats": True}
    if request_format == "/v1/chat/completions":
        body = {"model": model, "stream": True, "stream_options": stream_options,
                "max_completion_tokens": OUTPUT_LEN, "ignore_eos": True,
                "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]}
    else:
        body = {"model": model, "stream": True, "stream_options": stream_options,
                "max_tokens": OUTPUT_LEN, "ignore_eos": True, "prompt": PROMPT}
    conn = connect(server)
    conn.request("POST", request_format, json.dumps(body),
                 {**headers, "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200  # raise_for_status
    texts, usage, token_iterations, done = [], None, 0, False
    for line in guidellm_lines(response):
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            done = True
            break
        event = json.loads(data)
        assert not event.get("error"), event  # _check_streaming_error
        choices = event.get("choices") or []
        choice = choices[0] if choices else {}
        text = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
        if text:
            texts.append(text)
            token_iterations += 1
        if event.get("usage"):
            usage = event["usage"]
    conn.close()
    assert done
    assert token_iterations >= 1 and "".join(texts)  # _validate_text_response
    assert usage["completion_tokens"] == OUTPUT_LEN and usage["prompt_tokens"] > 0


def run_tool(args, timeout=600):
    env = {**os.environ, "OPENAI_API_KEY": API_KEY}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.skipif(not os.environ.get("ATTNRES_VLLM"),
                    reason="set ATTNRES_VLLM to a `vllm` executable to run vllm bench serve")
@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_real_vllm_bench_serve(server, tmp_path, backend):
    result = tmp_path / "vllm.json"
    endpoint = "/v1/chat/completions" if backend == "openai-chat" else "/v1/completions"
    proc = run_tool([os.environ["ATTNRES_VLLM"], "bench", "serve", "--backend", backend,
                     "--endpoint", endpoint, "--base-url", server.http_url,
                     "--tokenizer", str(GPT2_DIR), "--dataset-name", "random",
                     "--random-input-len", "32", "--random-output-len", str(OUTPUT_LEN),
                     "--header", f"Authorization=Bearer {API_KEY}",
                     "--num-prompts", "8", "--max-concurrency", "4", "--save-result",
                     "--save-detailed", "--result-filename", str(result)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(result.read_text())
    assert r["completed"] == 8 and r["failed"] == 0, r["errors"]
    assert r["output_lens"] == [OUTPUT_LEN] * 8
    if backend == "openai":
        assert r["input_lens"] == [32] * 8


@pytest.mark.skipif(not os.environ.get("ATTNRES_GUIDELLM"),
                    reason="set ATTNRES_GUIDELLM to a `guidellm` executable to run GuideLLM")
def test_real_guidellm(server, tmp_path):
    result = tmp_path / "guidellm.json"
    proc = run_tool([os.environ["ATTNRES_GUIDELLM"], "run", "--backend",
                     f"kind=openai_http,target={server.http_url},api_key={API_KEY}",
                     "--profile", "kind=concurrent,streams=4",
                     "--constraint", "kind=max_requests,count=8",
                     "--data", f"kind=synthetic_text,prompt_tokens=32,output_tokens={OUTPUT_LEN}",
                     "--tokenizer", f"kind=huggingface_auto,model={GPT2_DIR}",
                     "--output", f"kind=json,path={result}", "--disable-progress"],
                    timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    benchmark = json.loads(result.read_text())["benchmarks"][0]
    assert len(benchmark["requests"]["successful"]) == 8
    assert not benchmark["requests"].get("errored")
