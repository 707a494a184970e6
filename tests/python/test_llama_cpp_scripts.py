"""The llama.cpp comparison scripts (clients/bench/llama_cpp/) need a llama.cpp build, GBs of
Python wheels and minutes of benchmarking, so no test runs them; this checks what can be
checked offline: every script parses (bash -n), and the summary of compare.sh reads a rows
file as compare.sh writes it into the two tables (medians over repetitions, ratios)."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "clients" / "bench" / "llama_cpp"


@pytest.mark.parametrize("script", ["build.sh", "make_models.sh", "compare.sh", "same_weights.sh"])
def test_script_parses(script):
    subprocess.run(["bash", "-n", str(HERE / script)], check=True)


def load_summarize():
    spec = importlib.util.spec_from_file_location("summarize", HERE / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Two repetitions of a few figures, tab-separated as compare.sh's row() writes them.
SAMPLE = """\
100m prefill tok/s, 128-token prompt\tours\t1\t900
100m prefill tok/s, 128-token prompt\tattnres\t1\t890
100m prefill tok/s, 128-token prompt\tllama.cpp\t1\t1000
100m prefill tok/s, 128-token prompt\tours\t2\t1100
100m prefill tok/s, 128-token prompt\tattnres\t2\t1090
100m prefill tok/s, 128-token prompt\tllama.cpp\t2\t1000
100m served median TTFT ms, 1 client(s)\tours\t1\t20
100m served median TTFT ms, 1 client(s)\tllama.cpp\t1\t40
100m served median TTFT ms, 1 client(s)\tours\t2\t30
100m served median TTFT ms, 1 client(s)\tllama.cpp\t2\t40
"""


def test_summary_tables():
    s = load_summarize()
    text = s.summarize(s.read_rows(SAMPLE.splitlines()))
    lines = text.splitlines()
    assert "| 100m prefill tok/s, 128-token prompt | 1000.0 | 1000.0 | 1.000 |" in lines
    assert "| 100m served median TTFT ms, 1 client(s) | 25.0 | 40.0 | 0.625 |" in lines
    # The AttnRes table holds only the figures with a twin value: median 990 vs 1000.
    twin = lines[lines.index("| figure | plain (ours) | AttnRes (ours) | AttnRes / plain |"):]
    assert "| 100m prefill tok/s, 128-token prompt | 1000.0 | 990.0 | 0.990 |" in twin
    assert not any("TTFT" in line for line in twin)
    assert lines[-1] == "(medians of 2 repetitions)"
