"""The GPU run's scripts (kernels/cuda/gpu_first_run.sh and what it calls) run only on a lent
GPU machine, seldom; these checks keep them from rotting in between: the shell script parses,
and tests/gpu/variant_parity.py runs against the real CLI with the CPU on both sides (every
check it makes, on three variants), and with two settings that round differently, where its
bf16-noise gate must still pass them and the logits must differ where this CPU rounds linear
inputs to bf16."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine_cli import require_binary

REPO = Path(__file__).resolve().parents[2]
PARITY = REPO / "tests" / "gpu" / "variant_parity.py"
VARIANTS = "qwen3,attnres_full,attnres_delta_v"


def test_gpu_first_run_parses():
    subprocess.run(["bash", "-n", str(REPO / "kernels" / "cuda" / "gpu_first_run.sh")], check=True)


def run_parity(attnres_bin, tmp_path, *extra):
    out = tmp_path / "parity.json"
    proc = subprocess.run([sys.executable, str(PARITY), "--attnres", str(attnres_bin),
                           "--devices", "cpu,cpu", "--variants", VARIANTS, "--json", str(out),
                           *extra], capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.read_text()) if out.exists() else []


def test_variant_parity_cpu_against_itself(attnres_bin, tmp_path):
    require_binary(attnres_bin)
    proc, results = run_parity(attnres_bin, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["variant"] for r in results] == VARIANTS.split(",")
    for r in results:
        assert r["ok"] and r["rel_l2"] == 0.0 and r["first_divergence"] is None, r
        assert r["bf16_noise"] > 0.0, r  # the f32 KV cache and bank moved the logits


def test_variant_parity_f32_linear_inputs_within_the_noise(attnres_bin, tmp_path):
    require_binary(attnres_bin)
    proc, results = run_parity(attnres_bin, tmp_path, "--first-args",
                               "--linear-input-dtype float32")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    inspect = subprocess.run([str(attnres_bin), "inspect", "--model", "builtin:demo"],
                             capture_output=True, text=True, timeout=120).stdout
    for r in results:
        assert r["ok"], r
        if "linear inputs bfloat16" in inspect:  # auto rounds here: the sides differ
            assert 0.0 < r["rel_l2"] < 3 * r["bf16_noise"] + 3e-2, r
