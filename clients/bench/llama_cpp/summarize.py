#!/usr/bin/env python3
"""Summary tables of clients/bench/llama_cpp/compare.sh from its rows.tsv.

rows.tsv has one measured figure a line: FIGURE<TAB>SIDE<TAB>REP<TAB>VALUE, SIDE one of
ours (plain model), llama.cpp (the same weights as GGUF), attnres (our AttnRes twin of the
plain model). Each cell is the median over the repetitions; figures keep the order in which
they were first measured. Engine figures with an AttnRes value show again in the second table.

    summarize.py OUT_DIR/rows.tsv
"""
from __future__ import annotations

import statistics
import sys


def read_rows(lines):
    """{figure: {side: [values]}}, figures in first-seen order."""
    table: dict[str, dict[str, list[float]]] = {}
    for line in lines:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        figure, side, _rep, value = line.split("\t")
        table.setdefault(figure, {}).setdefault(side, []).append(float(value))
    return table


def cell(values) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def ratio(a, b) -> str:
    if not a or not b:
        return "-"
    return f"{statistics.median(a) / statistics.median(b):.3f}"


def summarize(table) -> str:
    out = ["| figure | ours | llama.cpp | ours / llama.cpp |", "| --- | ---: | ---: | ---: |"]
    for figure, sides in table.items():
        if "ours" in sides or "llama.cpp" in sides:
            ours, theirs = sides.get("ours", []), sides.get("llama.cpp", [])
            out.append(f"| {figure} | {cell(ours)} | {cell(theirs)} | {ratio(ours, theirs)} |")
    twins = [(f, s) for f, s in table.items() if "attnres" in s]
    if twins:
        out += ["", "| figure | plain (ours) | AttnRes (ours) | AttnRes / plain |",
                "| --- | ---: | ---: | ---: |"]
        for figure, sides in twins:
            plain, attnres = sides.get("ours", []), sides["attnres"]
            out.append(f"| {figure} | {cell(plain)} | {cell(attnres)} | {ratio(attnres, plain)} |")
    reps = sorted({len(v) for s in table.values() for v in s.values()})
    out += ["", f"(medians of {', '.join(map(str, reps))} repetitions)"]
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summarize(read_rows(f)))
