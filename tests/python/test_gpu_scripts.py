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


def test_lease_rehearses_the_depth_steps(attnres_bin, tmp_path):
    """depth needs the CUDA build; depthpeers runs the peer bench's reference self-check (the
    NumPy two-phase mix against the direct softmax) before it skips for want of a GPU."""
    require_binary(attnres_bin)
    output, verdicts, logs = run_lease(attnres_bin, tmp_path, "--budget", "120", "depth",
                                       "depthpeers")
    assert verdicts == {"depth": "SKIP", "depthpeers": "SKIP"}, output
    assert "the reference's self-check passed" in output, output
    assert {"depth.log", "depthpeers.log"} <= logs


# The decode levers the levers step measures: (short name, environment variable, the label
# bench_cuda_backend prints on its levers line), in the order of that line.
LEVERS = [("deep", "ATTNRES_CUDA_GEMV_DEEP", "deep"),
          ("prefetch", "ATTNRES_CUDA_PDL_PREFETCH", "prefetch"),
          ("bulk", "ATTNRES_CUDA_GEMV_BULK", "bulk"),
          ("merge", "ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE", "last-block-merge"),
          ("phase1", "ATTNRES_CUDA_PHASE1_GROUPED", "phase1-grouped"),
          ("persistent", "ATTNRES_CUDA_PERSISTENT_MLP", "persistent-mlp"),
          ("push", "ATTNRES_CUDA_BANK_PUSH_EPILOGUE", "push-epilogue")]
# gpu_lease_steps.sh's levers_settings: each setting's name and the levers it switches on.
LEVER_SETTINGS = [("baseline", ()), ("deep", ("deep",)), ("prefetch", ("prefetch",)),
                  ("both", ("deep", "prefetch")), ("bulk", ("bulk",)), ("merge", ("merge",)),
                  ("phase1", ("phase1",)), ("persistent", ("persistent",)), ("push", ("push",)),
                  ("all", tuple(name for name, _, _ in LEVERS))]

# bench_cuda_backend's step lines, the levers line saying what the environment switched on
FAKE_BENCH = "#!/bin/sh\n" + "".join(
    f'v{i}=off; [ "${{{var}:-}}" = 1 ] && v{i}=on\n' for i, (_, var, _) in enumerate(LEVERS)) + """\
echo "args: $*"
for m in attnres-0.6b plain-0.6b; do
  echo "$m: a model, bf16 depth bank"
  for b in 1 8; do
    echo "  batch  $b, context 1024: eager 1.$b ms/step (min 1.0), floor/measured 0.2$b, KV read 1 MB"
    echo "  batch  $b: kernel launches per decode step 5; levers: """ + ", ".join(
    f"{label} $v{i}" for i, (_, _, label) in enumerate(LEVERS)) + """"
    echo "  batch  $b, context 1024: graph 0.$b ms/step (min 0.1), floor/measured 0.3$b, logits identical"
  done
done
exit ${FAKE_BENCH_EXIT:-0}
"""

FAKE_TESTS = "#!/bin/sh\necho tests " + " ".join(
    f"{name}=${{{var}:-unset}}" for name, var, _ in LEVERS) + ' "$*" >> "$FAKE_TESTS_LOG"\n'


def lease_log(tmp_path, name):
    """The text of one log in the archive run_lease(attnres_bin, tmp_path, ...) brought back."""
    with tarfile.open(tmp_path / "out" / "lease-logs.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if Path(m.name).name == name)
        return tar.extractfile(member).read().decode()


def test_lease_rehearses_the_levers_steps(attnres_bin, tmp_path):
    """The levers and levers_tests steps over stand-ins for bench_cuda_backend and
    attnres_cuda_tests: one bench run per setting with that setting's switches in its
    environment, a summary line per (setting, model, batch) with what the bench says was on,
    the tests once per setting but the baseline with it on; a failing bench fails the levers
    step; without the stand-ins both steps skip."""
    require_binary(attnres_bin)
    bench, tests, tests_log = tmp_path / "bench.sh", tmp_path / "tests.sh", tmp_path / "tests.log"
    bench.write_text(FAKE_BENCH)
    tests.write_text(FAKE_TESTS)
    bench.chmod(0o755)
    tests.chmod(0o755)
    stand_ins = dict(LEVERS_BENCH=str(bench), LEVERS_TESTS=str(tests), FAKE_TESTS_LOG=str(tests_log))
    output, verdicts, logs = run_lease(attnres_bin, tmp_path / "a", "--budget", "60", "levers",
                                       "levers_tests", **stand_ins)
    assert verdicts == {"levers": "PASS", "levers_tests": "PASS"}, output
    settings = [name for name, _ in LEVER_SETTINGS]
    assert {"levers.log"} | {f"levers-{s}.log" for s in settings} <= logs
    output = lease_log(tmp_path / "a", "levers.log")
    assert "args: --only step --context 1024 --batch 1 --batch 8" in output, output
    summary = [line.split() for line in output.splitlines() if line.startswith("LEVERS ")]
    assert [s[1:7] for s in summary] == [
        [setting, model, b, f"1.{b}", f"0.{b}", f"0.3{b}"]
        for setting in settings for model in ("attnres-0.6b", "plain-0.6b")
        for b in ("1", "8")], output
    want_levers = []
    for _, on in LEVER_SETTINGS:
        words = []
        for name, _, label in LEVERS:
            words += [label, ("on" if name in on else "off") + ","]
        words[-1] = words[-1].rstrip(",")
        want_levers += [words] * 4
    assert [s[7:] for s in summary] == want_levers, output
    flags = "--gtest_brief=1 --gtest_filter=CudaGemvLevers.*:CudaOps.Linear*:" \
            "CudaFusedDecode.*:CudaBatchInvariance.*:CudaResidualEpilogue.*:" \
            "CudaAttentionLastBlockMerge.*:CudaFlashAttention.*:CudaSanitizerSized.Attention*:" \
            "CudaPhase1Grouped.*:CudaOps.DepthPhase*:CudaDepthModes.*:CudaDepthBankBf16.*:" \
            "CudaPersistentMlp.*:CudaBankPushEpilogue.*:CudaModel.AttnResBlock*"
    assert tests_log.read_text().splitlines() == [
        "tests " + " ".join(f"{name}={'1' if name in on else 'unset'}" for name, _, _ in LEVERS)
        + f" {flags}" for setting, on in LEVER_SETTINGS if on]

    output, verdicts, _ = run_lease(attnres_bin, tmp_path / "b", "--budget", "60", "levers",
                                    FAKE_BENCH_EXIT="3", **stand_ins)
    assert verdicts == {"levers": "FAIL"}, output
    output, verdicts, _ = run_lease(attnres_bin, tmp_path / "c", "--budget", "60", "levers",
                                    "levers_tests")
    assert verdicts == {"levers": "SKIP", "levers_tests": "SKIP"}, output
