"""End-to-end tests of the `attnres` command against the real binary: what a user sees.

Covers the built-in demo model, sampling reproducibility, stop strings, text that equals the
Hugging Face tokenizer's decoding of the generated ids, and clear errors (never a crash) for
bad flags and defective checkpoints.
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from make_checkpoint import make_checkpoint

GPT2_TOKENIZER = Path(__file__).resolve().parents[2] / "engine/model/assets/gpt2/tokenizer.json"


def run(attnres_bin, *args, check=True):
    if not attnres_bin.exists():
        pytest.fail(f"attnres binary not found at {attnres_bin}: build first (tests/run.sh)")
    proc = subprocess.run([str(attnres_bin), *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"attnres {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def generate_json(attnres_bin, *args):
    return json.loads(run(attnres_bin, "generate", "--json", *args).stdout)


@pytest.fixture(scope="module")
def small_model(ckpt_root):
    return make_checkpoint(ckpt_root / "cli_attnres_block", "attnres_block", seed=3)


def test_demo_model_generates_and_text_matches_hf_decoding(attnres_bin):
    out = generate_json(attnres_bin, "--prompt", "Hello, depth attention", "--max-tokens", "12",
                        "--temperature", "0", "--ignore-eos")
    assert out["model"] == "built-in:demo"
    assert len(out["token_ids"]) == 12
    assert out["finish_reason"] == "length"
    hf = Tokenizer.from_file(str(GPT2_TOKENIZER))
    assert out["prompt_ids"] == hf.encode("Hello, depth attention").ids
    assert out["text"] == hf.decode(out["token_ids"], skip_special_tokens=True)
    # The sampled token's logprob comes with every token in --json mode, and is a logprob.
    assert len(out["logprobs"]) == 12
    assert all(lp["logprob"] <= 0 for lp in out["logprobs"])


def test_plain_text_mode_streams_the_same_text(attnres_bin):
    args = ["--prompt", "Streaming", "--max-tokens", "10", "--temperature", "0", "--ignore-eos"]
    streamed = run(attnres_bin, "generate", *args).stdout
    assert streamed == generate_json(attnres_bin, *args)["text"] + "\n"


def test_device_auto_runs_on_the_cpu_when_no_gpu_is_visible(attnres_bin):
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"],
                                                     capture_output=True).returncode == 0:
        pytest.skip("a GPU is visible here: auto picks it")
    args = ["--prompt", "Which device", "--max-tokens", "6", "--temperature", "0", "--ignore-eos"]
    auto = run(attnres_bin, "generate", "--json", "--device", "auto", *args)
    cpu = generate_json(attnres_bin, "--device", "cpu", *args)
    assert json.loads(auto.stdout)["token_ids"] == cpu["token_ids"]
    assert "CUDA" not in auto.stderr


def test_seed_makes_sampling_reproducible(attnres_bin, small_model):
    args = ["--model", small_model, "--prompt-ids", "10,20,30", "--max-tokens", "16",
            "--temperature", "1.0", "--ignore-eos"]
    a = generate_json(attnres_bin, *args, "--seed", "1")["token_ids"]
    b = generate_json(attnres_bin, *args, "--seed", "1")["token_ids"]
    c = generate_json(attnres_bin, *args, "--seed", "2")["token_ids"]
    assert a == b
    assert a != c


def test_stop_string_truncates_output(attnres_bin):
    base = ["--prompt", "Stop strings", "--max-tokens", "24", "--temperature", "0", "--ignore-eos"]
    full = generate_json(attnres_bin, *base)["text"]
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), f"need a visible stop string, got {stop!r} from {full!r}"
    out = generate_json(attnres_bin, *base, "--stop", stop)
    assert out["finish_reason"] == "stop"
    assert out["text"] == full[:full.index(stop)]


def test_logits_file_has_one_row_per_token(attnres_bin, small_model, tmp_path):
    out = tmp_path / "logits.npy"
    run(attnres_bin, "logits", "--model", small_model, "--token-ids", "1,2,3,4,5", "--prefill", "3",
        "--out", out)
    logits = np.load(out)
    assert logits.shape == (5, 50304)
    assert np.isfinite(logits).all()


def test_inspect_prints_the_depth_plan(attnres_bin, small_model):
    text = run(attnres_bin, "inspect", "--model", small_model).stdout
    assert "qwen3_attnres" in text
    assert "depth plan: block AttnRes" in text
    assert "mix[b0 p]" in text and "bank += p" in text


def test_builtin_shape_takes_another_mode(attnres_bin):
    """builtin:SHAPE@MODE+GATE (bench latency --modes uses it): the plan is that mode's."""
    text = run(attnres_bin, "inspect", "--model", "builtin:demo@delta_v+sigmoid_vector").stdout
    assert "depth plan: delta_v AttnRes" in text
    assert "x + mix[b0]" in text and "V stream" in text and "gated" in text
    out = generate_json(attnres_bin, "--model", "builtin:demo@pre_gated", "--prompt-ids", "1,2,3",
                        "--max-tokens", "2", "--temperature", "0", "--ignore-eos")
    assert len(out["token_ids"]) == 2


def test_unsupported_attnres_mode_names_file_and_field(attnres_bin, small_model, tmp_path):
    broken = tmp_path / "mode"
    shutil.copytree(small_model, broken)
    config = json.loads((broken / "config.json").read_text())
    config["attnres_mode"] = "sparse_delta"
    (broken / "config.json").write_text(json.dumps(config))
    proc = run(attnres_bin, "inspect", "--model", broken, check=False)
    assert proc.returncode == 1
    assert "config.json" in proc.stderr and "attnres_mode" in proc.stderr
    assert "sparse_delta" in proc.stderr
    proc = run(attnres_bin, "inspect", "--model", "builtin:demo@sparse_delta", check=False)
    assert proc.returncode == 1 and "attnres_mode" in proc.stderr


def test_bench_latency_pairs_each_model_with_its_twin(attnres_bin, ckpt_root, tmp_path):
    """Two models of one shape: every iteration's times are reported, and the AttnRes model's
    overhead is the median over iterations of its time over the twin's in the same iteration.
    (That the iterations alternate is not visible from outside; the pairing is.)"""
    full = make_checkpoint(ckpt_root / "cli_attnres_full", "attnres_full", seed=4)
    plain = make_checkpoint(ckpt_root / "cli_qwen3", "qwen3", seed=4)
    out = tmp_path / "latency.json"
    text = run(attnres_bin, "bench", "latency", "--model", full, "--model", plain,
               "--input-len", "8", "--output-len", "3", "--iters", "3", "--warmup", "0",
               "--threads", "1", "--json", out).stdout
    rows = json.loads(out.read_text())
    assert [Path(r["model"]).name for r in rows] == ["cli_attnres_full", "cli_qwen3"]
    attnres, twin = rows
    for r in rows:
        assert len(r["prefill_seconds_per_iteration"]) == 3
        assert len(r["decode_ms_per_iteration"]) == 3
        assert all(t > 0 for t in r["prefill_seconds_per_iteration"])
    assert "prefill_overhead_vs_twin" not in twin
    for key, series in (("prefill_overhead_vs_twin", "prefill_seconds_per_iteration"),
                        ("decode_overhead_vs_twin", "decode_ms_per_iteration")):
        paired = sorted(a / b for a, b in zip(attnres[series], twin[series]))
        assert attnres[key] == pytest.approx(paired[1] - 1.0, rel=1e-9)
    assert "prefill vs" in text and "%" in text.splitlines()[-2]


@pytest.mark.parametrize("args, message", [
    (["generate", "--no-such-flag"], "unknown flag --no-such-flag"),
    (["generate", "--max-tokens"], "needs a value"),
    (["generate", "--max-tokens", "ten"], "not a valid number"),
    (["generate", "--temperature", "-1"], "temperature"),
    (["generate", "--prompt-ids", "1,99999999"], "field prompt[1]: got 99999999, expected a token id in [0, 50257)"),
    (["generate", "--max-tokens", "100000000"], "context length"),
    (["generate", "--model", "/nonexistent/model"], "not found"),
    (["bench", "latency", "--batch", "0"], "--batch"),
])
def test_bad_flags_are_clear_errors(attnres_bin, args, message):
    proc = run(attnres_bin, *args, check=False)
    assert proc.returncode == 1, proc.stderr
    assert message in proc.stderr


def test_truncated_checkpoint_names_file_and_tensor(attnres_bin, small_model, tmp_path):
    broken = tmp_path / "truncated"
    shutil.copytree(small_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    proc = run(attnres_bin, "generate", "--model", broken, check=False)
    assert proc.returncode == 1
    assert "model.safetensors" in proc.stderr and "truncated" in proc.stderr


def test_missing_tensor_is_named(attnres_bin, small_model, tmp_path):
    broken = tmp_path / "missing"
    shutil.copytree(small_model, broken)
    # Rewrite the checkpoint without one tensor, through the reference's reader and safetensors.
    from attnres_ref import read_safetensors
    from safetensors.numpy import save_file
    tensors = read_safetensors(broken / "model.safetensors")
    del tensors["model.layers.1.mlp_res_norm.weight"]
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(broken / "model.safetensors"))
    proc = run(attnres_bin, "generate", "--model", broken, check=False)
    assert proc.returncode == 1
    assert "model.layers.1.mlp_res_norm.weight" in proc.stderr


def test_unsupported_architecture_is_named(attnres_bin, small_model, tmp_path):
    broken = tmp_path / "arch"
    shutil.copytree(small_model, broken)
    config = json.loads((broken / "config.json").read_text())
    config["model_type"] = "mamba"
    (broken / "config.json").write_text(json.dumps(config))
    proc = run(attnres_bin, "inspect", "--model", broken, check=False)
    assert proc.returncode == 1
    assert "mamba" in proc.stderr
