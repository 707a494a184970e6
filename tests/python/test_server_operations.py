"""How the real server behaves under load and churn (issue: serve it).

- batch invariance: a temperature-0 request gives the same text alone and among 32 concurrent
  streaming requests;
- a client that disconnects mid-stream is cancelled and its KV blocks come back (/metrics);
- the waiting-queue limit answers 503 with Retry-After;
- a KV cache too small for all requests preempts (by recompute) and every request still
  completes with exactly its solo output;
- SIGTERM lets a running request finish and the server exits 0.

Every wait is bounded; no fixed sleeps stand in for synchronisation.
"""

import http.client
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from server_process import ServerProcess

MODEL = "attnres-demo"


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


def complete(server, prompt, max_tokens, stream=False) -> str:
    c = client(server)
    if not stream:
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                 extra_body={"ignore_eos": True})
        return r.choices[0].text
    text = ""
    for chunk in c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                      temperature=0, stream=True,
                                      extra_body={"ignore_eos": True}):
        if chunk.choices:
            text += chunk.choices[0].text
    return text


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


PROMPTS = [f"Request number {i} asks about layer {i * 7 % 13} and depth" for i in range(32)]


def test_batch_invariance_alone_vs_32_concurrent_streams(attnres_bin):
    with ServerProcess(attnres_bin, "--max-num-seqs", "64") as server:
        alone = {i: complete(server, PROMPTS[i], 24) for i in (0, 17, 31)}
        with ThreadPoolExecutor(max_workers=32) as pool:
            together = list(pool.map(lambda p: complete(server, p, 24, stream=True), PROMPTS))
        for i, text in alone.items():
            assert together[i] == text, f"prompt {i} changed when batched with 31 others"


def start_stream(server, max_tokens) -> http.client.HTTPConnection:
    """A raw streaming request whose first event has arrived; the caller decides when to hang up."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    body = json.dumps({"model": MODEL, "prompt": "a long story", "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True})
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    return conn


def test_disconnect_cancels_and_frees_kv_blocks(attnres_bin):
    with ServerProcess(attnres_bin) as server:
        aborted_before = server.metrics().get(
            f'attnres:request_success_total{{model_name="{MODEL}",finished_reason="abort"}}', 0)
        conn = start_stream(server, max_tokens=4000)
        wait_for(lambda: server.metrics()["attnres:kv_cache_usage_perc"] > 0, what="KV in use")
        conn.sock.shutdown(2)
        conn.close()
        wait_for(lambda: server.metrics()["attnres:kv_cache_usage_perc"] == 0
                 and server.metrics()["attnres:num_requests_running"] == 0,
                 what="the disconnected request's KV blocks to return")
        aborted = server.metrics()[
            f'attnres:request_success_total{{model_name="{MODEL}",finished_reason="abort"}}']
        assert aborted == aborted_before + 1
        assert complete(server, "still serving", 4)  # and the server goes on


def test_queue_limit_returns_503_with_retry_after(attnres_bin):
    with ServerProcess(attnres_bin, "--max-num-seqs", "1", "--max-queued-requests", "1") as server:
        running = start_stream(server, max_tokens=4000)
        wait_for(lambda: server.metrics()["attnres:num_requests_running"] == 1, what="running")
        queued = threading.Thread(target=lambda: complete(server, "queued", 2), daemon=True)
        queued.start()
        wait_for(lambda: server.metrics()["attnres:num_requests_waiting"] == 1, what="queued")
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"model": MODEL, "prompt": "one too many", "max_tokens": 2}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = json.loads(response.read())
        assert response.status == 503
        assert response.getheader("Retry-After") is not None
        assert "error" in body and body["error"]["message"]
        running.close()  # the running stream is cancelled; the queued request then completes
        queued.join(timeout=60)
        assert not queued.is_alive()


def test_kv_exhaustion_preempts_and_every_request_completes_exactly(attnres_bin):
    # Demo model, bf16 cache: 64 KiB per 16-token block, so 2 MiB = 32 blocks = 512 tokens;
    # eight requests of ~110 tokens each need ~56 blocks at once.
    args = ["--kv-cache-memory", "2MiB", "--kv-cache-dtype", "bfloat16", "--max-model-len", "256",
            "--max-num-seqs", "16"]
    prompts = [f"Preemption check {i}: " + "tokens " * 10 for i in range(8)]
    with ServerProcess(attnres_bin, *args) as server:
        alone = [complete(server, p, 96) for p in prompts]
        with ThreadPoolExecutor(max_workers=8) as pool:
            together = list(pool.map(lambda p: complete(server, p, 96, stream=True), prompts))
        assert server.metrics()["attnres:num_preemptions_total"] > 0, "the cache was never exhausted"
        assert together == alone
        # Stats are published at the end of the engine step that pushed the last output.
        wait_for(lambda: server.metrics()["attnres:kv_cache_usage_perc"] == 0, timeout=10,
                 what="every KV block to be free again")


def test_sigterm_lets_running_requests_finish_then_exits_zero(attnres_bin):
    server = ServerProcess(attnres_bin, "--grace-period", "60")
    with server:
        result = {}

        def stream():
            try:
                result["text"] = complete(server, "finish me", 48, stream=True)
            except Exception as e:  # reported below
                result["error"] = repr(e)

        t = threading.Thread(target=stream)
        t.start()
        wait_for(lambda: server.metrics()["attnres:num_requests_running"] == 1, what="running")
        code = server.stop(signal.SIGTERM)
        t.join(timeout=60)
        assert code == 0
        assert "error" not in result, result.get("error")
        assert result["text"] == complete_solo_reference(attnres_bin, "finish me", 48)


def complete_solo_reference(attnres_bin, prompt, max_tokens) -> str:
    with ServerProcess(attnres_bin) as server:
        return complete(server, prompt, max_tokens)
