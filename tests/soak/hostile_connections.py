#!/usr/bin/env python3
"""Thousands of idle and slowloris connections against `attnres serve`, while a probe times
/health and a client times normal requests: first without the hostile load (the baseline),
then with it. Prints one JSON report (recorded in docs/RELIABILITY.md).

    .venv/bin/python tests/soak/hostile_connections.py --idle 10000 --slowloris 1000 --seconds 60

Idle connections connect and send nothing; slowloris connections send half a request header
and then one header line every few seconds, never finishing it. Whenever the server closes one
(its idle timeout, or 408 at the header deadline), the script opens another, so the numbers
stay constant for the whole phase. Client sockets are spread over several loopback source
addresses so that the connections the server closes (TIME_WAIT) never exhaust the ports.
"""

import argparse
import json
import os
import resource
import selectors
import socket
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
from server_process import ServerProcess  # noqa: E402

from measure import percentile, rss_mib  # noqa: E402

SLOW_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
SOURCES = [f"127.0.0.{i}" for i in range(2, 18)]


def summary_ms(values):
    return {"n": len(values), "p50_ms": round(1000 * percentile(values, 50), 2),
            "p99_ms": round(1000 * percentile(values, 99), 2),
            "max_ms": round(1000 * max(values), 2)} if values else {"n": 0}


class Hostiles:
    """Keeps `idle` + `slowloris` connections open on one selector thread."""

    def __init__(self, port, idle, slowloris, trickle_seconds):
        self.port, self.idle, self.slowloris = port, idle, slowloris
        self.trickle_seconds = trickle_seconds
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.reconnects = 0
        self.connect_errors = 0
        self.responses = {}  # first status line -> count (408 for slowloris, 503 past the cap)
        self.next_source = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open(self, kind):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((SOURCES[self.next_source % len(SOURCES)], 0))
        self.next_source += 1
        try:
            sock.connect(("127.0.0.1", self.port))
        except BlockingIOError:
            pass
        except OSError:
            self.connect_errors += 1
            sock.close()
            return False
        state = {"kind": kind, "sent_head": False, "next_trickle": time.monotonic()}
        self.sel.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if kind == "slow" else 0),
                          state)
        return True

    def run(self):
        for i in range(self.idle + self.slowloris):
            while not self.open("idle" if i < self.idle else "slow"):
                time.sleep(0.01)
        while not self.stop.is_set():
            now = time.monotonic()
            for key, events in self.sel.select(timeout=0.2):
                sock, state = key.fileobj, key.data
                if events & selectors.EVENT_READ:
                    try:
                        data = sock.recv(4096)
                    except OSError:
                        data = b""
                    if data:
                        line = data.split(b"\r\n", 1)[0].decode(errors="replace")
                        self.responses[line] = self.responses.get(line, 0) + 1
                    self.sel.unregister(sock)
                    sock.close()
                    self.reconnects += 1
                    self.open(state["kind"])
                    continue
                if events & selectors.EVENT_WRITE and not state["sent_head"]:
                    try:
                        sock.send(SLOW_HEAD)
                    except OSError:
                        pass
                    state["sent_head"] = True
                    self.sel.modify(sock, selectors.EVENT_READ, state)
            # The trickle: one more header line per slow connection every few seconds.
            for key in list(self.sel.get_map().values()):
                state = key.data
                if state["kind"] == "slow" and state["sent_head"] and now >= state["next_trickle"]:
                    try:
                        key.fileobj.send(b"X-Trickle: 1\r\n")
                    except OSError:
                        pass
                    state["next_trickle"] = now + self.trickle_seconds
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def probe(url, seconds, period, out, errors):
    """/health on a fresh connection every `period` seconds (as a load balancer probes)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            with urllib.request.urlopen(url + "/health", timeout=10) as r:
                r.read()
                out.append(time.monotonic() - start)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            errors.append(repr(e))
        time.sleep(max(0.0, period - (time.monotonic() - start)))


def normal_requests(url, seconds, out, errors):
    body = json.dumps({"prompt": "The capital of France is", "max_tokens": 8,
                       "temperature": 0}).encode()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                json.loads(r.read())
            out.append(time.monotonic() - start)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))


def phase(server, seconds):
    health, normal, errors = [], [], []
    threads = [threading.Thread(target=probe, args=(server.http_url, seconds, 0.05, health, errors)),
               threading.Thread(target=normal_requests, args=(server.http_url, seconds, normal, errors))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"health": summary_ms(health), "completion_8_tokens": summary_ms(normal),
            "errors": errors[:5], "error_count": len(errors)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--slowloris", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60, help="length of each phase")
    ap.add_argument("--trickle-seconds", type=float, default=2.0)
    ap.add_argument("--binary", default=str(REPO / "build" / "server" / "cli" / "attnres"))
    ap.add_argument("server_args", nargs="*", help="extra `attnres serve` flags (after --)")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    need = args.idle + args.slowloris + 512
    if hard < need:
        sys.exit(f"the descriptor limit ({hard}) is below the {need} this run needs")

    with ServerProcess(args.binary, *args.server_args, env={"OMP_NUM_THREADS": "1"}) as server:
        report = {"idle": args.idle, "slowloris": args.slowloris, "seconds_per_phase": args.seconds,
                  "server_args": args.server_args}
        report["baseline"] = phase(server, args.seconds)
        rss_before = rss_mib(server.proc.pid)
        hostiles = Hostiles(server.http_port, args.idle, args.slowloris, args.trickle_seconds)
        hostiles.thread.start()
        # Wait until they are all connected (the server counts them).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if server.metrics().get("attnres:http_connections", 0) >= 0.95 * (args.idle + args.slowloris):
                break
            time.sleep(0.5)
        report["open_connections_at_start"] = server.metrics().get("attnres:http_connections")
        report["hostile"] = phase(server, args.seconds)
        report["open_connections_at_end"] = server.metrics().get("attnres:http_connections")
        report["server_rss_mib"] = {"before": rss_before, "with_hostiles": rss_mib(server.proc.pid)}
        hostiles.stop.set()
        hostiles.thread.join()
        report["hostile_reconnects"] = hostiles.reconnects
        report["hostile_connect_errors"] = hostiles.connect_errors
        report["hostile_responses"] = hostiles.responses
        metrics = server.metrics()
        report["rejected_by_status"] = {k.split('status="')[1].rstrip('"}'): v for k, v in metrics.items()
                                        if k.startswith("attnres:requests_rejected_total{")}
    report["server_exit_code"] = server.exit_code
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
