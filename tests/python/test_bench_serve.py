"""End-to-end tests of `attnres bench serve` against the real `attnres serve` (demo model).

For each backend (openai, openai-chat, grpc) the benchmark runs with small settings, and its
result JSON is checked against the run's requirements and recomputed independently here:
every request completed, the server counted every prompt as exactly --random-input-len tokens
and generated exactly --random-output-len, and every summary figure (throughput; mean, median,
std and percentiles of TTFT, TPOT, ITL and E2EL; peak tokens/s and concurrency) equals NumPy's
computation from the per-request arrays with vLLM's definitions (vllm/benchmarks/serve.py,
calculate_metrics). Failures (server down, unknown model, requests that time out) must give a
clear error and, for request failures, a result with every error kept. The plotting script
must turn the results into valid PNGs. The prefix-caching workloads (--random-prefix-len,
--multi-turn) must move the server's prefix-cache counters by exactly what the responses' usage
reported, and print that hit rate.
"""

import json
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN, MAX_CONCURRENCY = 12, 32, 8, 4
BACKENDS = ["openai", "openai-chat", "grpc"]


@pytest.fixture(scope="module")
def server(attnres_bin):
    if not attnres_bin.exists():
        pytest.fail(f"attnres binary not found at {attnres_bin}: build first (tests/run.sh)")
    with ServerProcess(attnres_bin, "--max-num-seqs", "8") as s:
        yield s


def bench(attnres_bin, *args, timeout=300):
    return subprocess.run([str(attnres_bin), "bench", "serve", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def url_for(server, backend):
    return server.grpc_target if backend == "grpc" else server.http_url


@pytest.fixture(scope="module")
def results(server, attnres_bin, tmp_path_factory):
    """backend -> (result JSON, stdout), from one small run per backend."""
    out = {}
    folder = tmp_path_factory.mktemp("bench_results")
    for backend in BACKENDS:
        path = folder / f"{backend}.json"
        proc = bench(attnres_bin, "--backend", backend, "--url", url_for(server, backend),
                     "--num-prompts", NUM_PROMPTS, "--random-input-len", INPUT_LEN,
                     "--random-output-len", OUTPUT_LEN, "--max-concurrency", MAX_CONCURRENCY,
                     "--request-rate", 40, "--burstiness", 0.5, "--seed", 3, "--num-warmups", 2,
                     "--temperature", 0, "--metric-percentiles", "50,90,99",
                     "--percentile-metrics", "ttft,tpot,itl,e2el,client_queue_time",
                     "--save-detailed", "--result-file", path, "--label", f"test-{backend}")
        assert proc.returncode == 0, f"{backend}: {proc.stdout}\n{proc.stderr}"
        out[backend] = (json.loads(path.read_text()), proc.stdout, path)
    return out


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def check_summary(result, key, seconds):
    """vLLM: np.mean / np.median / np.std / np.percentile of `values or 0`, in ms."""
    values = np.asarray(seconds if len(seconds) else [0.0]) * 1000
    assert close(result[f"mean_{key}_ms"], np.mean(values)), key
    assert close(result[f"median_{key}_ms"], np.median(values)), key
    assert close(result[f"std_{key}_ms"], np.std(values)), key
    for p in (50, 90, 99):
        assert close(result[f"p{p}_{key}_ms"], np.percentile(values, p)), (key, p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_request_has_the_exact_lengths(results, backend):
    r, _, _ = results[backend]
    assert r["completed"] == NUM_PROMPTS and r["failed"] == 0, r["errors"]
    assert r["errors"] == [""] * NUM_PROMPTS
    # usage.prompt_tokens / completion_tokens as the server reported them (gRPC: Usage).
    assert r["input_lens"] == [INPUT_LEN] * NUM_PROMPTS
    assert r["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    assert r["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN
    assert r["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert all(text for text in r["generated_texts"])
    assert r["backend"] == backend and r["label"] == f"test-{backend}"
    assert r["model_id"] == "attnres-demo"
    assert r["num_prompts"] == NUM_PROMPTS and r["max_concurrency"] == MAX_CONCURRENCY
    assert r["request_rate"] == 40 and r["burstiness"] == 0.5


@pytest.mark.parametrize("backend", BACKENDS)
def test_summary_metrics_recomputed_independently(results, backend):
    r, _, _ = results[backend]
    ttfts, latencies = np.array(r["ttfts"]), np.array(r["latencies"])
    itls = r["itls"]
    outputs = np.array(r["output_lens"])
    # Each request's chunks: the first at TTFT, the gaps after it sum to E2EL - TTFT.
    for ttft, latency, gaps in zip(ttfts, latencies, itls):
        assert 0 < ttft <= latency
        assert all(g >= 0 for g in gaps)
        assert math.isclose(ttft + sum(gaps), latency, rel_tol=1e-9, abs_tol=1e-9)
        assert 1 <= len(gaps) + 1 <= OUTPUT_LEN + 1  # chat adds its role chunk
    duration = r["duration"]
    assert close(r["request_throughput"], NUM_PROMPTS / duration)
    assert close(r["output_throughput"], outputs.sum() / duration)
    assert close(r["total_token_throughput"], (NUM_PROMPTS * INPUT_LEN + outputs.sum()) / duration)
    check_summary(r, "ttft", ttfts)
    check_summary(r, "tpot", (latencies - ttfts) / (outputs - 1))
    check_summary(r, "itl", [g for gaps in itls for g in gaps])
    check_summary(r, "e2el", latencies)
    check_summary(r, "client_queue_time", r["queue_times"])

    # Peak concurrency: a sweep over [start, start + E2EL), departures first at equal times.
    starts = np.array(r["start_times"])
    events = sorted([(s, 1) for s in starts] + [(s + e, -1) for s, e in zip(starts, latencies)])
    level, peak = 0, 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    assert r["max_concurrent_requests"] == peak
    assert peak <= MAX_CONCURRENCY  # the client never exceeded --max-concurrency
    # Peak output tokens/s: chunk times in one-second buckets from the first start.
    first = starts.min()
    buckets = np.zeros(int(np.ceil((starts + latencies).max() - first)) + 1)
    for s, t, gaps in zip(starts, ttfts, itls):
        for time in s + t + np.concatenate([[0.0], np.cumsum(gaps)]):
            buckets[int(time - first)] += 1
    assert r["max_output_tokens_per_s"] == buckets.max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_printed_table_is_vllms(results, backend):
    r, stdout, _ = results[backend]
    assert "============ Serving Benchmark Result ============" in stdout
    rows = dict(re.findall(r"^(\S[^:\n]*:) +(\S+) *$", stdout, re.MULTILINE))
    assert rows["Successful requests:"] == str(NUM_PROMPTS)
    assert rows["Failed requests:"] == "0"
    assert rows["Maximum request concurrency:"] == str(MAX_CONCURRENCY)
    assert rows["Request rate configured (RPS):"] == "40.00"
    assert rows["Total input tokens:"] == str(NUM_PROMPTS * INPUT_LEN)
    assert rows["Mean TTFT (ms):"] == f"{r['mean_ttft_ms']:.2f}"
    assert rows["P99 E2EL (ms):"] == f"{r['p99_e2el_ms']:.2f}"
    assert rows["P90 ITL (ms):"] == f"{r['p90_itl_ms']:.2f}"
    assert "-----Time per Output Token (excl. 1st token)------" in stdout
    assert "---------------Client-side Queueing---------------" in stdout


def test_result_without_save_detailed_is_vllms_short_form(server, attnres_bin, tmp_path):
    path = tmp_path / "short.json"
    proc = bench(attnres_bin, "--url", server.http_url, "--num-prompts", 3, "--input-len", 16,
                 "--output-len", 4, "--result-file", path)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(path.read_text())
    assert r["completed"] == 3 and r["request_rate"] == "inf" and r["max_concurrency"] is None
    assert "ttfts" not in r and "itls" not in r and "errors" in r and "latencies" in r
    assert "Request rate configured" not in proc.stdout  # a burst


def test_server_down_is_a_clear_error(attnres_bin):
    port = free_port()
    proc = bench(attnres_bin, "--url", f"http://127.0.0.1:{port}", "--num-prompts", 2)
    assert proc.returncode == 1
    assert "could not connect" in proc.stderr and "is the server running" in proc.stderr
    proc = bench(attnres_bin, "--backend", "grpc", "--url", f"127.0.0.1:{port}", "--num-prompts", 2)
    assert proc.returncode == 1
    assert "is the gRPC server running" in proc.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_model_is_a_clear_error(server, attnres_bin, backend):
    proc = bench(attnres_bin, "--backend", backend, "--url", url_for(server, backend),
                 "--model", "no-such-model", "--num-prompts", 2)
    assert proc.returncode == 1
    assert "--model no-such-model" in proc.stderr
    assert "it serves: attnres-demo" in proc.stderr


def test_bad_flags_are_clear_errors(server, attnres_bin):
    for args, needle in [(["--request-rate", "0"], "--request-rate"),
                         (["--max-concurrency", "0"], "--max-concurrency"),
                         (["--percentile-metrics", "ttft,latency"], "unknown metric 'latency'"),
                         (["--metric-percentiles", "150"], "--metric-percentiles"),
                         (["--backend", "tgi"], "--backend tgi"),
                         (["--dataset-name", "sharegpt"], "only random"),
                         (["--input-len", "4", "--random-input-len", "5"], "give one")]:
        proc = bench(attnres_bin, "--url", server.http_url, "--num-prompts", 2, *args)
        assert proc.returncode == 1, args
        assert needle in proc.stderr, (args, proc.stderr)


def test_absurd_numbers_fail_before_any_request(attnres_bin):
    """Checked when the flags are read: the (dead) server is never contacted."""
    dead = "http://127.0.0.1:9"
    for args, needle in [(["--request-rate", "-2"], "--request-rate must be > 0"),
                         (["--request-rate", "nan"], "--request-rate must be > 0"),
                         (["--burstiness", "0"], "--burstiness must be > 0"),
                         (["--num-warmups", "-1"], "--num-warmups must be >= 0"),
                         (["--seed", "-5"], "--seed must be >= 0"),
                         (["--random-input-len", "0"], "--random-input-len must be >= 1"),
                         (["--random-output-len", "0"], "--random-output-len must be >= 1"),
                         (["--num-prompts", "0"], "--num-prompts must be >= 1"),
                         (["--random-prefix-len", "-1"], "--random-prefix-len must be >= 0"),
                         (["--multi-turn", "0"], "--multi-turn must be >= 1")]:
        proc = bench(attnres_bin, "--url", dead, *args)
        assert proc.returncode == 1, args
        assert needle in proc.stderr, (args, proc.stderr)
        assert "could not connect" not in proc.stderr


def test_chat_input_shorter_than_the_template_is_a_clear_error(server, attnres_bin):
    proc = bench(attnres_bin, "--backend", "openai-chat", "--url", server.http_url,
                 "--num-prompts", 2, "--input-len", 2)
    assert proc.returncode == 1
    assert "--random-input-len 2 is too short" in proc.stderr


@pytest.mark.parametrize("backend", ["openai", "grpc"])
def test_failed_requests_are_counted_and_kept(server, attnres_bin, tmp_path, backend):
    """Requests that time out fail one by one; the run still ends with a result."""
    path = tmp_path / "failed.json"
    proc = bench(attnres_bin, "--backend", backend, "--url", url_for(server, backend),
                 "--num-prompts", 3, "--input-len", 16, "--output-len", 8,
                 "--request-timeout", 0.001, "--result-file", path)
    assert proc.returncode == 1  # nothing completed
    assert "every request failed" in proc.stderr
    r = json.loads(path.read_text())
    assert r["completed"] == 0 and r["failed"] == 3
    assert all(e.startswith("timeout") for e in r["errors"]), r["errors"]
    assert "Failed requests during benchmark run detected" in proc.stdout
    assert server.health() == 200  # the server is unharmed by the aborted streams


@pytest.fixture(scope="module")
def cache_server(attnres_bin):
    """A server of its own, so that no other test's requests (e.g. the aborted ones above,
    which the server may still be finishing) move its prefix-cache counters."""
    with ServerProcess(attnres_bin, "--max-num-seqs", "8") as s:
        yield s


def cache_counters(server):
    m = server.metrics()
    return m["attnres:prefix_cache_queries_total"], m["attnres:prefix_cache_hits_total"]


def check_hit_rate_matches_metrics(server, r, stdout, before):
    """usage's cached tokens are the server's hits; its prompt tokens are the queries (no
    warm-ups, no preemption at these sizes)."""
    queries, hits = (int(after - b) for after, b in zip(cache_counters(server), before))
    assert r["failed"] == 0, r["errors"]
    assert r["total_cached_tokens"] == hits > 0
    assert r["total_input_tokens"] == queries
    assert close(r["prefix_cache_hit_rate"], hits / queries)
    rows = dict(re.findall(r"^(\S[^:\n]*:) +(\S+) *$", stdout, re.MULTILINE))
    assert rows["Prefix cache hit rate (%):"] == f"{100 * hits / queries:.2f}"
    assert rows["Total cached prompt tokens:"] == str(hits)


def test_shared_prefix_hits_the_prefix_cache(cache_server, attnres_bin, tmp_path):
    server = cache_server
    path = tmp_path / "prefix.json"
    before = cache_counters(server)
    proc = bench(attnres_bin, "--url", server.http_url, "--num-prompts", 6,
                 "--random-prefix-len", 64, "--random-input-len", 16, "--output-len", 2,
                 "--max-concurrency", 2, "--seed", 5, "--save-detailed", "--result-file", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(path.read_text())
    assert r["input_lens"] == [80] * 6 and r["random_prefix_len"] == 64
    # Requests sent after the first pair find the prefix's full blocks (BOS + 63 tokens).
    assert min(r["cached_tokens"][2:]) >= 48, r["cached_tokens"]
    check_hit_rate_matches_metrics(server, r, proc.stdout, before)


def test_multi_turn_prompts_extend_and_hit(cache_server, attnres_bin, tmp_path):
    server = cache_server
    path = tmp_path / "multi_turn.json"
    before = cache_counters(server)
    proc = bench(attnres_bin, "--backend", "openai-chat", "--url", server.http_url,
                 "--num-prompts", 2, "--multi-turn", 3, "--random-input-len", 24,
                 "--output-len", 4, "--max-concurrency", 2, "--save-detailed",
                 "--result-file", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(path.read_text())
    assert r["completed"] == 6 and r["multi_turn"] == 3
    lens, cached = r["input_lens"], r["cached_tokens"]
    for c in range(2):  # turn k's prompt is turn k-1's plus its answer and a new message
        turns = lens[3 * c:3 * c + 3]
        assert turns[0] == 24 and turns[0] < turns[1] < turns[2], lens
        assert all(cached[3 * c + k] > 0 for k in (1, 2)), cached
    assert len(r["ttft_per_turn_ms"]) == 3
    assert "================= TTFT per Turn ==================" in proc.stdout
    assert "Mean TTFT turn 3 (ms):" in proc.stdout
    check_hit_rate_matches_metrics(server, r, proc.stdout, before)


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_script_makes_pngs(results, tmp_path):
    paths = [str(results[b][2]) for b in BACKENDS]
    proc = subprocess.run([sys.executable, str(REPO / "clients/bench/plot_results.py"), *paths,
                           "--out-dir", str(tmp_path), "--x", "label"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(tmp_path.glob("*.png"))
    assert {p.name for p in pngs} >= {"latency_percentiles.png", "throughput.png"}, proc.stdout
    for png in pngs:
        width, height = png_size(png)
        assert width >= 400 and height >= 300, png
    help_text = subprocess.run([sys.executable, str(REPO / "clients/bench/plot_results.py"),
                                "--help"], capture_output=True, text=True, timeout=60)
    assert help_text.returncode == 0 and "result" in help_text.stdout.lower()
