"""The GPU lease's scripts (kernels/cuda/gpu_lease.sh, gpu_lease_steps.sh and what they call)
run only on a lent GPU machine, seldom; these checks keep them from rotting in between: the
lease runs here as its CPU rehearsal (every step's verdict, the budget, the timeouts, the one
archive of logs that comes back), and tests/gpu/variant_parity.py runs against the real CLI
with the CPU on both sides (every check it makes, on three variants), and with two settings
that round differently, where its bf16-noise gate must still pass them and the logits must
differ where this CPU rounds linear inputs to bf16."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from engine_cli import require_binary

REPO = Path(__file__).resolve().parents[2]
PARITY = REPO / "tests" / "gpu" / "variant_parity.py"
VARIANTS = "qwen3,attnres_full,attnres_delta_v"


LEASE = REPO / "kernels" / "cuda" / "gpu_lease.sh"


def test_gpu_lease_scripts_parse():
    for script in (LEASE, REPO / "kernels" / "cuda" / "gpu_lease_steps.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)


def run_lease(attnres_bin, tmp_path, *args, **env):
    """`gpu_lease.sh lease --device cpu ARGS`; returns (output, {step: verdict}, archive)."""
    out = tmp_path / "out"
    environment = dict(os.environ, OUT=str(out), ATTNRES_BUILD_DIR=str(attnres_bin.parents[2]),
                       PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env)
    proc = subprocess.run(["bash", str(LEASE), "lease", "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=600, env=environment)
    verdicts = {}
    for line in (out / "verdicts.txt").read_text().splitlines():
        _, step, verdict, *_ = line.split()
        verdicts[step] = verdict
    archive = out / "lease-logs.tar.gz"
    with tarfile.open(archive) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert sorted(p.name for p in out.iterdir()) == ["lease-logs.tar.gz", "verdicts.txt"]
    return proc.stdout + proc.stderr, verdicts, names


def test_lease_rehearsal_runs_every_step_on_the_cpu(attnres_bin, tmp_path):
    require_binary(attnres_bin)
    output, verdicts, logs = run_lease(
        attnres_bin, tmp_path, "--budget", "300", "e2e", "nccl", "variants", "peer", "racecheck_decode",
        E2E_TESTS="tests/python/test_http_api.py", E2E_PYTEST_ARGS="-k stream_equals_non_stream",
        VARIANTS="qwen3")
    assert verdicts["e2e"] == "PASS", output
    assert verdicts["nccl"] == "SKIP", output  # needs the CUDA build
    assert verdicts["variants"] == "PASS", output
    assert verdicts["peer"] in ("PASS", "SKIP"), output  # SKIP: no torch here
    assert verdicts["racecheck_decode"] == "SKIP", output
    assert {"setup.log", "e2e.log", "nccl.log", "variants.log", "variant_parity.json",
            "verdicts.txt"} <= logs


SANITIZER_STEPS = ("racecheck_probe", "racecheck_norms", "racecheck_decode",
                   "racecheck_attention", "synccheck", "initcheck", "cluster_repeat", "memcheck")


def test_lease_rehearses_the_sanitizer_steps(attnres_bin, tmp_path):
    """Each compute-sanitizer step skips on the CPU after checking that every pattern of its
    gtest filter names a test of attnres_cuda_tests (where the build has it); a pattern that
    names none fails the step."""
    require_binary(attnres_bin)
    cuda_tests = attnres_bin.parents[2] / "tests/cpp/kernels/cuda/attnres_cuda_tests"
    output, verdicts, logs = run_lease(attnres_bin, tmp_path / "a", "--budget", "120",
                                       *SANITIZER_STEPS)
    assert verdicts == {step: "SKIP" for step in SANITIZER_STEPS}, output
    assert {f"{step}.log" for step in SANITIZER_STEPS} <= logs
    if not cuda_tests.exists():
        return  # a build without nvcc: nothing to list the filters against
    output, verdicts, _ = run_lease(attnres_bin, tmp_path / "b", "--budget", "60",
                                    "racecheck_decode", "synccheck",
                                    RACECHECK_FILTER="CudaSanitizerSized.Decode*:NoSuchSuite.*")
    assert verdicts == {"racecheck_decode": "FAIL", "synccheck": "SKIP"}, output
    assert "NoSuchSuite.* names no test" in output, output


def test_lease_reports_failures_timeouts_and_the_budget(attnres_bin, tmp_path):
    require_binary(attnres_bin)
    output, verdicts, logs = run_lease(
        attnres_bin, tmp_path / "a", "--budget", "120", "e2e", "nosuchstep", "variants",
        E2E_TESTS="tests/python/no_such_test_file.py", LEASE_TIMEOUT_variants="1")
    assert verdicts == {"nosuchstep": "FAIL", "e2e": "FAIL", "variants": "TIMEOUT"}, output
    assert "no such step" in output and "after 1s" in output, output
    assert {"e2e.log", "variants.log"} <= logs
    output, verdicts, _ = run_lease(attnres_bin, tmp_path / "b", "--budget", "5", "e2e")
    assert verdicts == {"e2e": "SKIP"} and "the budget is spent" in output, output
