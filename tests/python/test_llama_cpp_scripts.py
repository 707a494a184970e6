"""The llama.cpp comparison scripts (clients/bench/llama_cpp/) need a llama.cpp build, GBs of
Python wheels and minutes of benchmarking, so no test runs them; this checks what can be
checked offline: every script parses (bash -n); the summary of compare.sh reads a rows file as
compare.sh writes it into the two tables (medians over repetitions, ratios); what compare.sh
and accuracy.sh would run (DRY_RUN=1: each command printed, not run): no two served runs share
a prompt seed, each of our quantizations meets llama.cpp's file of the same bits; and the
prefix-cache hit rate from either server's /metrics; compare.sh's check for --quantization
reads the whole `attnres serve --help` (a long help must not read as the flag missing)."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "clients" / "bench" / "llama_cpp"


@pytest.mark.parametrize("script", ["build.sh", "make_models.sh", "compare.sh", "same_weights.sh",
                                    "accuracy.sh"])
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


def dry_run(script, *args, **env):
    """The commands a script would run (DRY_RUN=1: printed, one a line, nothing measured)."""
    import os
    full_env = {**os.environ, "DRY_RUN": "1", "ATTNRES_LLAMA_DIR": "/nonexistent/llama", **env}
    proc = subprocess.run(["bash", str(HERE / script), *args], capture_output=True, text=True,
                          env=full_env)
    return proc


def commands(proc, program):
    import shlex
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines()
            if line.split(" ", 1)[0].endswith(program)]


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_compare_served_runs_never_share_prompts(tmp_path):
    # Every served run (2 reps x 2 shapes x 3 variants x 2 servers x 2 concurrencies) draws
    # its own prompt set: 48 distinct seeds.
    proc = dry_run("compare.sh", "2", str(tmp_path))
    serve_runs = [c for c in commands(proc, "attnres") if c[1:3] == ["bench", "serve"]]
    assert len(serve_runs) == 48
    seeds = [flag(c, "--seed") for c in serve_runs]
    assert len(set(seeds)) == len(seeds)
    assert {flag(c, "--max-concurrency") for c in serve_runs} == {"1", "8"}


def test_compare_pairs_each_quantization_with_llama_cpp_file(tmp_path):
    proc = dry_run("compare.sh", "1", str(tmp_path), SHAPES="100m")
    latency = [c for c in commands(proc, "attnres") if c[1:3] == ["bench", "latency"]]
    quant = [flag(c, "--quantization") if "--quantization" in c else "bf16" for c in latency]
    assert quant == ["bf16", "bf16", "int8", "int8", "int4", "int4"]
    assert all(flag(c, "--threads") == "2" for c in latency)
    benches = [flag(c, "-m").rsplit("/", 1)[1] for c in commands(proc, "llama-bench")]
    assert benches == ["plain-100m.gguf"] * 2 + ["plain-100m-Q8_0.gguf"] * 2 + ["plain-100m-Q4_K_M.gguf"] * 2
    servers = [line for line in proc.stdout.splitlines() if line.startswith(("serve:", "llama-server:"))]
    assert servers[2].endswith("--threads 2 --quantization int8")
    assert servers[3].endswith("plain-100m-Q8_0.gguf")
    assert servers[5].endswith("plain-100m-Q4_K_M.gguf")


def fake_install(tmp_path, help_text):
    """A llama.cpp cache whose tools and files exist, and an attnres whose `serve --help`
    prints help_text and then 200,000 more lines (past a pipe's buffer, so a reader that
    stops at the first match kills the writer with SIGPIPE); any other command fails."""
    bin_dir = tmp_path / "llama" / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("llama-bench", "llama-server"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "llama" / "models").mkdir()
    (tmp_path / "llama" / "models" / "plain-100m-Q8_0.gguf").write_text("")
    attnres = tmp_path / "attnres"
    attnres.write_text("#!/bin/sh\nif [ \"$1 $2\" = \"serve --help\" ]; then\n"
                       f"  echo '{help_text}'\n  exec seq 200000\nfi\nexit 3\n")
    attnres.chmod(0o755)
    return {"ATTNRES_LLAMA_DIR": str(tmp_path / "llama"), "ATTNRES": str(attnres)}


@pytest.mark.parametrize("help_text,refused", [("  --quantization int8|int4", False),
                                               ("  --threads N", True)])
def test_compare_reads_the_whole_help_for_quantization(tmp_path, help_text, refused):
    import os
    env = {**os.environ, "SHAPES": "100m", "VARIANTS": "int8", **fake_install(tmp_path, help_text)}
    proc = subprocess.run(["bash", str(HERE / "compare.sh"), "1", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env)
    # Past the check, the first measuring command (the fake's bench latency) fails.
    assert proc.returncode != 0
    assert ("has no --quantization" in proc.stderr) == refused, proc.stderr


@pytest.mark.parametrize("args,env", [(["0"], {}), (["x"], {}), (["1"], {"VARIANTS": "int3"})])
def test_compare_refuses_bad_arguments(tmp_path, args, env):
    proc = dry_run("compare.sh", *args, str(tmp_path), **env)
    assert proc.returncode == 2
    assert ("REPS" in proc.stderr) or ("int3" in proc.stderr)


def test_accuracy_script_plan(tmp_path):
    proc = dry_run("accuracy.sh", str(tmp_path), SHAPES="100m", PROMPTS="3", CTX="256", CHUNKS="4")
    ppl = commands(proc, "llama-perplexity")
    assert [flag(c, "-m").rsplit("/", 1)[1] for c in ppl] == [
        "plain-100m.gguf", "plain-100m-Q8_0.gguf", "plain-100m-Q4_K_M.gguf"]
    assert all(flag(c, "-c") == "256" and flag(c, "--chunks") == "4" for c in ppl)
    assert "--kl-divergence" not in ppl[0] and all("--kl-divergence" in c for c in ppl[1:])
    ours = [c for c in commands(proc, "attnres") if c[1] == "perplexity"]
    # plain and the AttnRes twin: a bf16 base, then int8 and int4 against it.
    assert len(ours) == 6
    assert ["--save-logits" in c for c in ours] == [True, False, False] * 2
    assert [flag(c, "--quantization") for c in ours if "--kl-base" in c] == ["int8", "int4"] * 2
    assert all(flag(c, "--ctx") == "256" and flag(c, "--file") == "/usr/share/common-licenses/GPL-3"
               for c in ours)
    greedy = [c for c in commands(proc, "attnres") if c[1] == "generate"]
    assert len(greedy) == 3 * 3  # each prompt: bf16, int8, int4
    assert all(flag(c, "--temperature") == "0" for c in greedy)
    assert len({flag(c, "--prompt") for c in greedy}) == 3


def test_accuracy_llama_only(tmp_path):
    proc = dry_run("accuracy.sh", str(tmp_path), SHAPES="100m 0.6b", OURS="no")
    assert len(commands(proc, "llama-perplexity")) == 6
    assert commands(proc, "attnres") == []


def test_accuracy_other_llama_types_models_and_no_greedy(tmp_path):
    proc = dry_run("accuracy.sh", str(tmp_path), SHAPES="100m", VARIANTS="int4",
                   LLAMA_TYPES="Q5_K_S Q5_K_M", MODELS="plain", GREEDY="no")
    assert [flag(c, "-m").rsplit("/", 1)[1] for c in commands(proc, "llama-perplexity")] == [
        "plain-100m.gguf", "plain-100m-Q5_K_S.gguf", "plain-100m-Q5_K_M.gguf"]
    ours = commands(proc, "attnres")
    assert [c[1] for c in ours] == ["perplexity", "perplexity"]  # plain only, no greedy runs
    assert all(flag(c, "--model").endswith("/plain-100m") for c in ours)


def test_accuracy_refuses_unknown_variant(tmp_path):
    proc = dry_run("accuracy.sh", str(tmp_path), VARIANTS="int3")
    assert proc.returncode == 2 and "int3" in proc.stderr


def load_prefix_hits():
    spec = importlib.util.spec_from_file_location("prefix_hits", HERE / "prefix_hits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prefix_hit_rate_from_either_server():
    p = load_prefix_hits()
    # As our /metrics writes them: HELP / TYPE lines, a model_name label on each sample.
    ours0 = ('# HELP attnres:prefix_cache_queries_total Prompt tokens {looked up}.\n'
             '# TYPE attnres:prefix_cache_queries_total counter\n'
             'attnres:prefix_cache_queries_total{model_name="m"} 1000\n'
             'attnres:prefix_cache_hits_total{model_name="m"} 100\n')
    ours1 = ('attnres:prefix_cache_queries_total{model_name="m"} 3000\n'
             'attnres:prefix_cache_hits_total{model_name="m"} 600\n')
    assert p.hit_percent(ours0, ours1) == pytest.approx(25.0)
    # llama-server counts computed prompt tokens apart from the cached ones.
    llama0 = "llamacpp:prompt_tokens_total 500\nllamacpp:prompt_tokens_cached_total 0\n"
    llama1 = "llamacpp:prompt_tokens_total 1400\nllamacpp:prompt_tokens_cached_total 100\n"
    assert p.hit_percent(llama0, llama1) == pytest.approx(10.0)
    assert p.hit_percent(ours1, ours1) is None
    with pytest.raises(SystemExit):
        p.hit_percent("", "other_metric 1\n")
