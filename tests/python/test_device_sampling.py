"""--no-device-sampling end to end (docs/ENGINE_CONTRACT.md, "Where sampling happens"), against
the real binary on the CPU backend.

The CPU backend's sample op runs the host Sampler's own pipeline (engine/sample/sample_row.h)
on the same uniform the host path would draw, so sampling on the device and on the host must
give the same tokens exactly: greedy and seeded, with every sampling parameter the device rows
take (temperature, top-k, top-p, min-p, the three penalties, min_tokens), several rows per step.
The flag must reach the engine: `attnres serve` logs where its engine samples.
"""

import subprocess
import threading

import pytest
from openai import OpenAI

from checkpoint_cache import checkpoint_fixture
from server_process import ServerProcess

PROMPTS = ["Depth mixing reads the bank", "A block of layers", "The KV cache holds",
           "Attention residuals let each layer choose", "Why mix depth?", "Where is the bank?"]

# (temperature, extra_body): greedy first, then random rows exercising each parameter.
SETTINGS = [
    (0.0, {}),
    (0.0, {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.4}),
    (1.0, {}),
    (0.8, {"top_k": 20}),
    (1.2, {"top_p": 0.9}),
    (1.0, {"min_p": 0.05}),
    (0.9, {"top_k": 50, "top_p": 0.95, "min_p": 0.02, "repetition_penalty": 1.2,
           "presence_penalty": -0.5, "frequency_penalty": 0.3, "min_tokens": 6}),
]


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="device_sampling", seed=5)


@pytest.fixture(scope="module")
def model_dir(checkpoint):
    return checkpoint("attnres_block")


def workload(server):
    """Every prompt under every setting, all submitted at once so rows share steps; seeded
    requests ask for n=2 (choice i samples with seed + i). Returns the token ids per request."""
    client = OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    jobs = [(p, t, extra) for p in PROMPTS for t, extra in SETTINGS]
    results = [None] * len(jobs)

    def one(i):
        prompt, temperature, extra = jobs[i]
        r = client.completions.create(
            model="m", prompt=prompt, max_tokens=12, temperature=temperature,
            seed=None if temperature == 0 else 100 + i, n=1 if temperature == 0 else 2,
            extra_body={"return_token_ids": True, "ignore_eos": True, **extra})
        results[i] = [c.model_extra["token_ids"] for c in r.choices]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None for r in results), "a request failed"
    return results


def serve(attnres_bin, model_dir, *extra):
    return ServerProcess(attnres_bin, "--model", str(model_dir), "--served-model-name", "m",
                         "--max-num-seqs", "16", *extra)


def test_serve_gives_the_same_tokens_with_and_without_device_sampling(attnres_bin, model_dir):
    with serve(attnres_bin, model_dir) as server:
        on_device = workload(server)
        assert "attnres serve: sampling on the device" in server.log()
    with serve(attnres_bin, model_dir, "--no-device-sampling") as server:
        on_host = workload(server)
        assert "attnres serve: sampling on the host" in server.log()
        assert "attnres serve: sampling on the device" not in server.log()
    assert on_device == on_host
    # The workload is not degenerate: seeded choices differ from each other somewhere.
    assert any(r[0] != r[1] for r in on_device if len(r) == 2)


def test_the_environment_variable_turns_it_off_too(attnres_bin, model_dir):
    with ServerProcess(attnres_bin, "--model", str(model_dir),
                       env={"ATTNRES_NO_DEVICE_SAMPLING": "1"}) as server:
        assert "attnres serve: sampling on the host" in server.log()


@pytest.mark.parametrize("sampling", [["--temperature", "0"],
                                      ["--temperature", "1.0", "--seed", "7", "--top-k", "40",
                                       "--top-p", "0.9", "--repetition-penalty", "1.2"]],
                         ids=["greedy", "seeded"])
def test_generate_gives_the_same_text_with_and_without_device_sampling(attnres_bin, model_dir,
                                                                       sampling):
    def generate(*extra):
        proc = subprocess.run([str(attnres_bin), "generate", "--model", str(model_dir),
                               "--max-tokens", "16", "--ignore-eos", *sampling, *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert generate() == generate("--no-device-sampling")
