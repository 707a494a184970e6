"""Every §2d depth mode (docs/ATTNRES.md) through the real server, against the independent NumPy
reference: `attnres serve` on a random checkpoint of each mode (its gate and null source
varied across them, every tensor non-zero), a greedy completion over HTTP with logprobs,
streamed and not: the tokens must be the reference's greedy tokens and each token's logprob
the reference's log_softmax to 1e-4 (f32 checkpoints). test_engine_parity.py covers the full
mode x gate x null-source matrix through the engine's CLI; this checks the serving path
(continuous batching, chunked prefill, the sampler) on one case per mode.
"""

import numpy as np
import pytest
from openai import OpenAI

import attnres_ref
from checkpoint_cache import checkpoint_fixture
from server_process import ServerProcess

PROMPT = [464, 6795, 286, 3241, 4088, 82, 318]
TOKENS = 10
CASES = [
    ("attnres_delta", {"gate": "sigmoid_scalar", "null_source": True}),
    ("attnres_delta_block", {"gate": "sigmoid_vector", "num_blocks": 2}),
    ("attnres_delta_v", {"gate": "learnable_alpha", "null_source": True}),
    ("attnres_first_layer", {}),
    ("attnres_pre_gated", {}),
    ("attnres_block_reset", {"gate": "sigmoid_vector"}),
]


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="modes_server", seed=9)


def reference_greedy(model, prompt, n):
    cache = attnres_ref.KVCache()
    row = model.forward(list(prompt), cache)[-1]
    tokens, logprobs = [], []
    for _ in range(n):
        token = int(np.argmax(row))
        z = row - row.max()
        logprobs.append(float(z[token] - np.log(np.sum(np.exp(z)))))
        tokens.append(token)
        row = model.forward([token], cache)[-1]
    return tokens, logprobs


@pytest.mark.parametrize("variant,kw", CASES, ids=[v + "-" + "-".join(map(str, kw.values()))
                                                   for v, kw in CASES])
def test_served_greedy_tokens_and_logprobs_match_the_reference(attnres_bin, checkpoint, variant,
                                                                kw):
    model_dir = checkpoint(variant, **kw)
    want_tokens, want_logprobs = reference_greedy(attnres_ref.load(model_dir), PROMPT, TOKENS)
    # Chunks of 4 prompt tokens: the prefill runs over several steps, beside the streamed copy.
    with ServerProcess(attnres_bin, "--model", str(model_dir), "--served-model-name", "m",
                       "--max-num-batched-tokens", "4") as server:
        client = OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
        kwargs = dict(model="m", prompt=PROMPT, max_tokens=TOKENS, temperature=0, logprobs=0,
                      extra_body={"ignore_eos": True, "return_token_ids": True})
        r = client.completions.create(**kwargs)
        choice = r.choices[0]
        assert choice.model_extra["token_ids"] == want_tokens
        assert choice.logprobs.token_logprobs == pytest.approx(want_logprobs, abs=1e-4)
        streamed = []
        for chunk in client.completions.create(stream=True, **kwargs):
            streamed += chunk.choices[0].model_extra.get("token_ids") or []
        assert streamed == want_tokens
