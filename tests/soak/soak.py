#!/usr/bin/env python3
"""Soak: many concurrent streaming clients against `attnres serve` on the CPU demo model for a
while, a share of them disconnecting at random points, HTTP and gRPC mixed, bad requests
interleaved. Reports server errors, /health latency, the KV cache left in use after the run and
the server's RSS over time, as one JSON document (recorded in docs/RELIABILITY.md).

    .venv/bin/python tests/soak/soak.py --clients 1000 --minutes 10
    .venv/bin/python tests/soak/soak.py --clients 200 --minutes 2 --sigterm-after 60

With --sigterm-after the server gets SIGTERM mid-run: every request it had accepted must
either finish or end with a clear error, new ones must be refused cleanly (503, UNAVAILABLE,
or connection refused once it exited), and no client may hang; the server must exit 0.

Outcome classes per request:
  ok            the stream ended normally ([DONE] / a GenerateComplete per choice)
  disconnected  this client hung up on purpose mid-stream (the 20%)
  rejected_4xx  a bad request the script sent on purpose, answered 400 / INVALID_ARGUMENT
  refused       503 / UNAVAILABLE / connection refused (only expected around SIGTERM)
  server_error  anything else: a 5xx, an in-band error event, a stream cut short, a bad
                request that was accepted, a timeout. The soak passes with 0 of these.
"""

import argparse
import asyncio
import json
import random
import signal
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
from server_process import ServerProcess  # noqa: E402

from measure import percentile, rss_mib  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "List three colors:", "In 1969, the first"]
BAD_BODIES = [b'{"prompt": "hi", "max_tokens": ', b'{"prompt": "hi", "temperature": "hot"}',
              b'{"prompt": "hi", "max_tokens": -3}', b'{"prompt": "hi", "logit_bias": {"999999999": 1}}',
              b'\xff\xfe not utf-8']
REQUEST_TIMEOUT_S = 300


class Stats:
    def __init__(self):
        self.outcomes = Counter()
        self.by_protocol = Counter()
        self.server_errors = []
        self.latency = {"http": [], "grpc": []}
        self.sigterm_sent = False

    def add(self, protocol, outcome, detail=None, seconds=None):
        self.outcomes[outcome] += 1
        self.by_protocol[f"{protocol}:{outcome}"] += 1
        if outcome == "server_error" and len(self.server_errors) < 20:
            self.server_errors.append(f"{protocol}: {detail}")
        if seconds is not None and outcome == "ok":
            self.latency[protocol].append(seconds)


async def read_http_response_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        if b": " in line:
            k, v = line.split(b": ", 1)
            headers[k.lower()] = v
    return status, headers


async def read_chunked(reader):
    """Yields the chunks of a chunked body."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def http_stream(port, stats, rng, disconnect, bad):
    start = time.monotonic()
    if bad:
        body = rng.choice(BAD_BODIES)
    else:
        body = json.dumps({"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(8, 64),
                           "stream": True, "temperature": 0.8, "ignore_eos": True}).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as e:
        stats.add("http", "refused", repr(e))
        return
    status = None
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        status, headers = await read_http_response_head(reader)
        if status == 503:
            await reader.read()
            stats.add("http", "refused")
            return
        if bad:
            await reader.read()
            stats.add("http", "rejected_4xx" if status == 400 else "server_error",
                      f"bad request answered {status}")
            return
        if status != 200:
            stats.add("http", "server_error", f"status {status}: {(await reader.read())[:200]!r}")
            return
        stop_after = rng.randint(1, 20) if disconnect else None
        events, buffer, done = 0, b"", False
        async for chunk in read_chunked(reader):
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                payload = event[len(b"data: "):]
                if payload == b"[DONE]":
                    done = True
                    continue
                if b'"error"' in payload[:20]:
                    stats.add("http", "server_error", f"in-band error: {payload[:200]!r}")
                    return
                events += 1
                if stop_after is not None and events >= stop_after:
                    writer.transport.abort()  # hang up mid-stream
                    stats.add("http", "disconnected")
                    return
        if stop_after is not None:
            stats.add("http", "ok" if done else "server_error", "stream cut short",
                      time.monotonic() - start)  # it finished before its disconnect point
            return
        stats.add("http", "ok" if done else "server_error", "stream ended without [DONE]",
                  time.monotonic() - start)
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        # Closed before any answer while the server shuts down: the request was never
        # accepted, so this is a refusal. After the answer began, it is a failure.
        if status is None and stats.sigterm_sent:
            stats.add("http", "refused", repr(e))
        else:
            stats.add("http", "server_error", f"connection lost: {e!r}")
    finally:
        writer.close()


async def grpc_stream(stub, pb, grpc, stats, rng, disconnect, bad):
    start = time.monotonic()
    params = pb.SamplingParams(temperature=0.8, max_tokens=rng.randint(8, 64), ignore_eos=True)
    if bad:
        params = pb.SamplingParams(temperature=-1.0, max_tokens=8)
    call = stub.Generate(pb.GenerateRequest(text=rng.choice(PROMPTS), sampling_params=params,
                                            stream=True))
    stop_after = rng.randint(1, 20) if disconnect else None
    chunks, complete = 0, False
    try:
        async for response in call:
            if response.HasField("complete"):
                complete = True
                continue
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                call.cancel()
                stats.add("grpc", "disconnected")
                return
        if bad:
            stats.add("grpc", "server_error", "a bad request was accepted")
            return
        stats.add("grpc", "ok" if complete else "server_error", "no GenerateComplete",
                  time.monotonic() - start)
    except grpc.aio.AioRpcError as e:
        code = e.code()
        if bad and code == grpc.StatusCode.INVALID_ARGUMENT:
            stats.add("grpc", "rejected_4xx")
        elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
            stats.add("grpc", "refused", e.details())
        elif code == grpc.StatusCode.CANCELLED and stop_after is not None:
            stats.add("grpc", "disconnected")
        else:
            stats.add("grpc", "server_error", f"{code}: {e.details()}")


async def client(i, args, port, stub, pb, grpc, stats, end_time, rng):
    while time.monotonic() < end_time:
        refused_before = stats.outcomes["refused"]
        use_grpc = rng.random() < args.grpc_share
        disconnect = rng.random() < args.disconnect_share
        bad = rng.random() < args.bad_share
        try:
            if use_grpc:
                await asyncio.wait_for(grpc_stream(stub, pb, grpc, stats, rng, disconnect, bad),
                                       REQUEST_TIMEOUT_S)
            else:
                await asyncio.wait_for(http_stream(port, stats, rng, disconnect, bad),
                                       REQUEST_TIMEOUT_S)
        except asyncio.TimeoutError:
            stats.add("grpc" if use_grpc else "http", "server_error", "hung past the timeout")
        if stats.outcomes["refused"] > refused_before:
            await asyncio.sleep(1)  # back off, as a client told 503 / UNAVAILABLE should


def watch(server, stop, health, health_errors, rss):
    next_rss = 0.0
    while not stop.is_set():
        start = time.monotonic()
        try:
            with urllib.request.urlopen(server.http_url + "/health", timeout=10) as r:
                r.read()
            health.append(time.monotonic() - start)
        except Exception as e:  # noqa: BLE001
            health_errors.append(repr(e))
        if start >= next_rss:
            rss.append((round(start, 1), rss_mib(server.proc.pid)))
            next_rss = start + 10
        time.sleep(0.1)


async def run(args, server):
    import grpc
    from grpc_stubs import pb, pb_grpc
    stats = Stats()
    rng = random.Random(args.seed)
    channel = grpc.aio.insecure_channel(server.grpc_target)
    stub = pb_grpc.GenerateStub(channel)
    end_time = time.monotonic() + args.minutes * 60
    loop = asyncio.get_running_loop()
    if args.sigterm_after:
        def sigterm():
            stats.sigterm_sent = True
            server.proc.send_signal(signal.SIGTERM)
        loop.call_later(args.sigterm_after, sigterm)
    tasks = [asyncio.create_task(client(i, args, server.http_port, stub, pb, grpc, stats, end_time,
                                        random.Random(rng.random())))
             for i in range(args.clients)]
    await asyncio.gather(*tasks)
    await channel.close()
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--disconnect-share", type=float, default=0.2)
    ap.add_argument("--grpc-share", type=float, default=0.3)
    ap.add_argument("--bad-share", type=float, default=0.05)
    ap.add_argument("--sigterm-after", type=float, default=0, help="seconds; 0: no SIGTERM")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--binary", default=str(REPO / "build" / "server" / "cli" / "attnres"))
    ap.add_argument("server_args", nargs="*", help="extra `attnres serve` flags (after --)")
    args = ap.parse_args()

    server_args = ["--max-num-seqs", "256", *args.server_args]
    server = ServerProcess(args.binary, *server_args, env={"OMP_NUM_THREADS": "2"})
    server.__enter__()
    health, health_errors, rss = [], [], []
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(server, stop, health, health_errors, rss), daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        stats = asyncio.run(run(args, server))
    finally:
        stop.set()
        watcher.join()
    report = {"clients": args.clients, "minutes": args.minutes, "seconds_run": round(time.monotonic() - started, 1),
              "disconnect_share": args.disconnect_share, "grpc_share": args.grpc_share,
              "bad_share": args.bad_share, "sigterm_after": args.sigterm_after,
              "outcomes": dict(stats.outcomes), "by_protocol": dict(stats.by_protocol),
              "server_errors": stats.server_errors,
              "request_seconds_p50_p99": {p: [percentile(v, 50), percentile(v, 99)]
                                          for p, v in stats.latency.items()},
              "health_ms": {"n": len(health),
                            "p50": round(1000 * percentile(health, 50), 2) if health else None,
                            "p99": round(1000 * percentile(health, 99), 2) if health else None,
                            "max": round(1000 * max(health), 2) if health else None},
              "health_errors": len(health_errors), "rss_mib_over_time": rss}
    if args.sigterm_after:
        try:
            report["server_exit_code"] = server.proc.wait(timeout=120)
        except Exception:  # noqa: BLE001
            server.proc.kill()
            report["server_exit_code"] = "did not exit within 120 s"
    else:
        time.sleep(2)  # the engine frees cancelled requests within a step
        metrics = server.metrics()
        report["after_run"] = {k: metrics.get(k) for k in (
            "attnres:kv_cache_usage_perc", "attnres:num_requests_running",
            "attnres:num_requests_waiting", "attnres:http_connections")}
        server.stop()
        report["server_exit_code"] = server.exit_code
    print(json.dumps(report, indent=2))
    ok = report["outcomes"].get("server_error", 0) == 0 and report["server_exit_code"] == 0
    if not args.sigterm_after:
        ok = ok and report["after_run"]["attnres:kv_cache_usage_perc"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
