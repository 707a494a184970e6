#!/usr/bin/env python3
"""The prefix-cache hit rate of one served run, from two Prometheus scrapes of the server's
/metrics taken before and after it (compare.sh).

Ours: attnres:prefix_cache_hits_total / attnres:prefix_cache_queries_total (prompt tokens the
prefix cache held / prompt tokens looked up). llama-server (with --metrics):
llamacpp:prompt_tokens_cached_total / (that + llamacpp:prompt_tokens_total), the prompt tokens
its slots reused / all prompt tokens (prompt_tokens_total counts only those it computed).

    prefix_hits.py BEFORE AFTER     # prints the hit rate in percent, or "-" without lookups
"""
from __future__ import annotations

import sys


def read_metrics(text: str) -> dict[str, float]:
    """{name: value} of a Prometheus text exposition, each name's samples summed over their
    labels (ours carry model_name="...", llama-server's none)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line.split()[0] else (line.split()[0], "", "")
        value = (rest.rsplit("}", 1)[1] if rest else line[len(name):]).split()
        if value:
            try:
                out[name] = out.get(name, 0.0) + float(value[0])
            except ValueError:
                pass
    return out


def hit_percent(before: str, after: str) -> float | None:
    """Percent of the run's looked-up prompt tokens the cache held; None without lookups."""
    b, a = read_metrics(before), read_metrics(after)

    def delta(name):
        return a.get(name, 0.0) - b.get(name, 0.0)

    if "attnres:prefix_cache_queries_total" in a:
        hits, looked_up = delta("attnres:prefix_cache_hits_total"), delta("attnres:prefix_cache_queries_total")
    elif "llamacpp:prompt_tokens_total" in a:
        hits = delta("llamacpp:prompt_tokens_cached_total")
        looked_up = hits + delta("llamacpp:prompt_tokens_total")
    else:
        raise SystemExit("no prefix-cache counters in /metrics (llama-server needs --metrics)")
    return 100.0 * hits / looked_up if looked_up > 0 else None


if __name__ == "__main__":
    with open(sys.argv[1]) as f1, open(sys.argv[2]) as f2:
        rate = hit_percent(f1.read(), f2.read())
    print("-" if rate is None else f"{rate:.1f}")
