#!/usr/bin/env python3
"""Plots `attnres bench serve` results (vLLM's result JSON) as PNG files.

    python3 clients/bench/plot_results.py RESULT.json [RESULT.json ...] [--out-dir DIR]
                                          [--x max_concurrency|request_rate|label]

Writes two figures into --out-dir (default: the current directory):

  latency_percentiles.png  one panel per latency metric (TTFT, TPOT, ITL, E2EL): for every
                           result, bars for the mean, the median and each percentile it
                           recorded (p99 by default), in ms.
  throughput.png           output-token and request throughput (left) and median TTFT, median
                           TPOT and p99 E2EL (right, log scale) against --x: the max
                           concurrency or the request rate of each run, one line per --series
                           (default: the backend; "label" separates runs of several servers
                           that were given their own labels), or one bar per result with
                           --x label.

--x defaults to max_concurrency when the results differ in it, else request_rate when they
differ in that, else label. Only the summary fields are read (mean_ttft_ms, p99_e2el_ms,
output_throughput, ...), so JSON saved without --save-detailed plots too, as do results of
vLLM's own `vllm bench serve --save-result`.
"""

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

METRICS = [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")]


def load(paths):
    results = []
    for path in paths:
        try:
            r = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"plot_results.py: cannot read {path}: {e}")
        if not isinstance(r, dict) or "completed" not in r:
            sys.exit(f"plot_results.py: {path} is not a bench serve result (no 'completed')")
        r["_series"] = r.get("label") or r.get("backend") or Path(path).stem
        r["_path"] = str(path)
        results.append(r)
    # Bars need one name per result: add the file name where series names repeat.
    counts = defaultdict(int)
    for r in results:
        counts[r["_series"]] += 1
    for r in results:
        r["_name"] = r["_series"]
        if counts[r["_series"]] > 1:
            r["_name"] += f" ({Path(r['_path']).stem})"
    return results


def numeric(value):
    """request_rate is "inf" for a burst; max_concurrency is null when unlimited."""
    if value is None:
        return None
    if value == "inf":
        return math.inf
    return float(value)


def pick_x(results, wanted):
    if wanted:
        return wanted
    for key in ("max_concurrency", "request_rate"):
        values = {numeric(r.get(key)) for r in results}
        if len(values) > 1 and None not in values and math.inf not in values:
            return key
    return "label"


def stat_names(results, metric):
    """mean, median, then the percentiles present in every result, in numeric order."""
    percentiles = None
    for r in results:
        found = {m.group(1) for k in r if (m := re.fullmatch(rf"p([\d.]+)_{metric}_ms", k))}
        percentiles = found if percentiles is None else percentiles & found
    ordered = sorted(percentiles or [], key=float)
    return ["mean", "median"] + [f"p{p}" for p in ordered]


def plot_latency_percentiles(results, out):
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (metric, title) in zip(axes.flat, METRICS):
        names = [n for n in stat_names(results, metric)
                 if all(f"{n}_{metric}_ms" in r for r in results)]
        if not names:
            ax.set_title(f"{title}: not recorded")
            ax.axis("off")
            continue
        width = 0.8 / len(results)
        for i, r in enumerate(results):
            xs = [j + (i - (len(results) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, [r[f"{n}_{metric}_ms"] for n in names], width, label=r["_name"])
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize="small")
    fig.suptitle("Latency (mean, median, percentiles) per result")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_throughput(results, x_key, series_key, out):
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    latency_series = [("median_ttft_ms", "median TTFT"), ("median_tpot_ms", "median TPOT"),
                      ("p99_e2el_ms", "p99 E2EL")]
    if x_key == "label":
        names = [r["_name"] for r in results]
        xs = range(len(results))
        left.bar([x - 0.2 for x in xs], [r["output_throughput"] for r in results], 0.4,
                 label="output tok/s")
        twin = left.twinx()
        twin.bar([x + 0.2 for x in xs], [r["request_throughput"] for r in results], 0.4,
                 color="tab:orange", label="req/s")
        twin.set_ylabel("requests/s")
        left.set_xticks(list(xs), names, rotation=20)
        width = 0.8 / len(latency_series)
        for i, (key, label) in enumerate(latency_series):
            values = [r.get(key, float("nan")) for r in results]
            right.bar([x + (i - 1) * width for x in xs], values, width, label=label)
        right.set_xticks(list(xs), names, rotation=20)
        left.legend(loc="upper left", fontsize="small")
        twin.legend(loc="upper right", fontsize="small")
    else:
        series = defaultdict(list)
        for r in results:
            name = r["_series"] if series_key == "label" else str(r.get(series_key) or "?")
            series[name].append(r)
        for name, runs in series.items():
            runs.sort(key=lambda r: numeric(r.get(x_key)))
            xs = [numeric(r.get(x_key)) for r in runs]
            left.plot(xs, [r["output_throughput"] for r in runs], "o-", label=f"{name} output tok/s")
            for key, label in latency_series:
                right.plot(xs, [r.get(key, float("nan")) for r in runs], "o-",
                           label=f"{name} {label}")
        left.set_xlabel(x_key)
        right.set_xlabel(x_key)
        right.set_yscale("log")
        left.legend(fontsize="small")
    left.set_ylabel("output tokens/s")
    left.set_title("Throughput")
    left.grid(alpha=0.3)
    right.set_ylabel("ms")
    right.set_title("Latency")
    right.grid(alpha=0.3)
    right.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Plot `attnres bench serve` (or `vllm bench serve`) result JSON files: "
                    "latency percentiles, and throughput and latency against concurrency.")
    parser.add_argument("results", nargs="+", help="result JSON files (--save-result)")
    parser.add_argument("--out-dir", default=".", help="where the PNG files go (default .)")
    parser.add_argument("--x", choices=["max_concurrency", "request_rate", "label"],
                        help="x axis of throughput.png (default: what differs between results)")
    parser.add_argument("--series", choices=["backend", "label", "model_id", "base_url"],
                        default="backend",
                        help="one line per value of this field in throughput.png (default backend)")
    args = parser.parse_args(argv)
    results = load(args.results)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    x_key = pick_x(results, args.x)
    if x_key != "label":
        missing = [r["_path"] for r in results if numeric(r.get(x_key)) in (None, math.inf)]
        if missing:
            sys.exit(f"plot_results.py: --x {x_key}: not set (or inf) in {', '.join(missing)}")
    plot_latency_percentiles(results, out_dir / "latency_percentiles.png")
    plot_throughput(results, x_key, args.series, out_dir / "throughput.png")
    print(f"wrote {out_dir / 'latency_percentiles.png'} and {out_dir / 'throughput.png'} "
          f"({len(results)} results, x = {x_key})")


if __name__ == "__main__":
    main()
