"""Automatic prefix caching end to end (docs/PREFIX_CACHING.md), against the real `attnres
serve` binary: the same workload, cache on (the default) and off, must give the same tokens
and logprobs, greedy and seeded, across prefill chunk sizes, under preemption and with tensor
parallelism; the hit counters and usage.prompt_tokens_details.cached_tokens move as they
should; the switch works from the flag and the environment; and after 1,000 mixed requests
with disconnects no KV block is left in use.

A block size of 4 makes short prompts span several full blocks.
"""

import http.client
import json
import random
import threading

import pytest
from openai import OpenAI

from checkpoint_cache import checkpoint_fixture
from server_process import ServerProcess

SYSTEM = ("You are a careful assistant who answers in one short sentence about attention "
          "residuals, depth mixing and the KV cache. ")
QUESTIONS = ["What is a block?", "Why mix depth?", "Where is the bank?", "Is it exact?"]


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="apc", seed=3)


@pytest.fixture(scope="module")
def model_dir(checkpoint):
    return checkpoint("attnres_block")


def serve(attnres_bin, model_dir, *extra, env=None):
    return ServerProcess(attnres_bin, "--model", str(model_dir), "--block-size", "4",
                         "--served-model-name", "m", *extra, env=env)


def client_of(server):
    return OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


def workload(client, sampled=False):
    """Two rounds of shared-prefix prompts (the second round can hit what the first computed),
    plus a 2-turn chat. Returns every choice's tokens and logprobs."""
    out = []
    for _ in range(2):
        for q in QUESTIONS:
            extra = {"return_token_ids": True, "ignore_eos": True}
            r = client.completions.create(
                model="m", prompt=SYSTEM + q, max_tokens=8, logprobs=3, extra_body=extra,
                temperature=1.0 if sampled else 0.0, seed=11 if sampled else None,
                n=2 if sampled else 1)
            for c in r.choices:
                out.append((c.model_extra["token_ids"], c.logprobs.token_logprobs,
                            [sorted(t.items()) for t in c.logprobs.top_logprobs]))
    messages = [{"role": "user", "content": SYSTEM + QUESTIONS[0]}]
    for _ in range(2):
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=6,
                                           temperature=0, logprobs=True, top_logprobs=2)
        choice = r.choices[0]
        out.append((choice.message.content,
                    [t.logprob for t in choice.logprobs.content]))
        messages += [{"role": "assistant", "content": choice.message.content},
                     {"role": "user", "content": QUESTIONS[1]}]
    return out


def burst(client, concurrent: bool):
    """Six long greedy requests sharing the system prompt; run at once they overflow a small
    cache and preempt each other."""
    prompts = [SYSTEM + f"Question {i}: " + QUESTIONS[i % 4] * 2 for i in range(6)]
    results = [None] * len(prompts)

    def one(i):
        r = client.completions.create(model="m", prompt=prompts[i], max_tokens=40, temperature=0,
                                      logprobs=1, extra_body={"ignore_eos": True,
                                                              "return_token_ids": True})
        results[i] = (r.choices[0].model_extra["token_ids"], r.choices[0].logprobs.token_logprobs)

    if concurrent:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(prompts)):
            one(i)
    return results


def assert_same(got, want):
    """Tokens (or text) identical; logprobs equal to 1e-5 (the cache reuses the same K/V)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[0] == w[0]
        assert g[1] == pytest.approx(w[1], abs=1e-5)
        if len(g) > 2:
            for top_g, top_w in zip(g[2], w[2]):
                assert [t for t, _ in top_g] == [t for t, _ in top_w]
                assert [v for _, v in top_g] == pytest.approx([v for _, v in top_w], abs=1e-5)


@pytest.fixture(scope="module")
def reference_runs(attnres_bin, model_dir):
    """The workloads with the cache off: the answers the cache must not change."""
    with serve(attnres_bin, model_dir, "--no-enable-prefix-caching") as server:
        client = client_of(server)
        runs = {"greedy": workload(client), "sampled": workload(client, sampled=True),
                "burst": burst(client, concurrent=False)}
        m = server.metrics()
        assert m["attnres:prefix_cache_queries_total"] == 0
        assert m["attnres:prefix_cache_hits_total"] == 0
    return runs


@pytest.mark.parametrize("extra", [
    [],                                        # defaults
    ["--max-num-batched-tokens", "8"],         # prefill in chunks of 8 tokens
    ["--kv-cache-memory", "600KiB", "--max-num-seqs", "8"],  # preemption (checked below)
    ["--tensor-parallel-size", "2"],
], ids=["default", "chunked", "preemption", "tp2"])
def test_outputs_and_logprobs_equal_with_the_cache_off(attnres_bin, model_dir, reference_runs,
                                                       extra):
    with serve(attnres_bin, model_dir, *extra) as server:
        client = client_of(server)
        if "600KiB" in extra:
            # Six requests of ~110 tokens at once in a 200-token cache: preemption.
            assert_same(burst(client, concurrent=True), reference_runs["burst"])
            assert server.metrics()["attnres:num_preemptions_total"] > 0
        greedy = workload(client)
        sampled = workload(client, sampled=True)
        m = server.metrics()
    for got, want in ((greedy, reference_runs["greedy"]), (sampled, reference_runs["sampled"])):
        assert_same(got, want)
    assert m["attnres:prefix_cache_hits_total"] > 0
    assert m["attnres:prefix_cache_queries_total"] >= m["attnres:prefix_cache_hits_total"]


def test_counters_and_cached_tokens_move_as_expected(attnres_bin, model_dir):
    with serve(attnres_bin, model_dir) as server:
        client = client_of(server)
        first = client.completions.create(model="m", prompt=SYSTEM + "One.", max_tokens=2)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        m1 = server.metrics()
        assert m1["attnres:prefix_cache_queries_total"] == first.usage.prompt_tokens
        assert m1["attnres:prefix_cache_hits_total"] == 0
        second = client.completions.create(model="m", prompt=SYSTEM + "Two.", max_tokens=2)
        cached = second.usage.prompt_tokens_details.cached_tokens
        # Every full block of the shared system prompt (block size 4), never the last token.
        assert cached > 0 and cached % 4 == 0 and cached < second.usage.prompt_tokens
        m2 = server.metrics()
        assert m2["attnres:prefix_cache_hits_total"] == cached
        assert (m2["attnres:prefix_cache_queries_total"]
                == first.usage.prompt_tokens + second.usage.prompt_tokens)
        # The same prompt again: everything but the last block's worth is a hit.
        again = client.completions.create(model="m", prompt=SYSTEM + "Two.", max_tokens=2)
        assert again.usage.prompt_tokens_details.cached_tokens >= cached
        chat = client.chat.completions.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": SYSTEM + "Hi"}])
        assert chat.usage.prompt_tokens_details.cached_tokens >= 0


@pytest.mark.parametrize("how", ["flag", "env"])
def test_it_can_be_switched_off(attnres_bin, model_dir, how):
    args, env = (["--no-enable-prefix-caching"], None) if how == "flag" else \
        ([], {"ATTNRES_ENABLE_PREFIX_CACHING": "0"})
    with serve(attnres_bin, model_dir, *args, env=env) as server:
        client = client_of(server)
        for _ in range(2):
            r = client.completions.create(model="m", prompt=SYSTEM, max_tokens=2)
            assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert server.metrics()["attnres:prefix_cache_hits_total"] == 0
        assert "prefix caching off" in server.log()


def test_no_block_leaks_after_many_mixed_requests_with_disconnects(attnres_bin, model_dir):
    rng = random.Random(4)
    with serve(attnres_bin, model_dir, "--max-num-seqs", "16") as server:
        host, port = "127.0.0.1", server.http_port
        errors = []

        def one(i):
            prompt = SYSTEM[: rng.randrange(20, len(SYSTEM))] + QUESTIONS[i % 4]
            body = {"model": "m", "prompt": prompt, "max_tokens": rng.randrange(1, 6),
                    "temperature": 0.7, "stream": i % 3 != 0}
            conn = http.client.HTTPConnection(host, port, timeout=60)
            try:
                conn.request("POST", "/v1/completions", json.dumps(body),
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                if resp.status != 200:
                    errors.append((i, resp.status))
                elif i % 5 == 0:
                    resp.read(1)  # a client that goes away mid-answer
                else:
                    resp.read()
            except OSError as e:
                errors.append((i, repr(e)))
            finally:
                conn.close()

        def worker(ids):
            for i in ids:
                one(i)

        threads = [threading.Thread(target=worker, args=(range(k, 1000, 16),)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        # Disconnected requests are cancelled within a step; wait for the engine to settle.
        import time
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = server.metrics()
            if m["attnres:num_requests_running"] == 0 and m["attnres:kv_cache_usage_perc"] == 0:
                break
            time.sleep(0.1)
        assert m["attnres:num_requests_running"] == 0
        assert m["attnres:num_requests_waiting"] == 0
        assert m["attnres:kv_cache_usage_perc"] == 0
        assert m["attnres:prefix_cache_hits_total"] > 0
