"""Depth-attention introspection (docs/ATTNRES.md §5) against the NumPy reference, on random
checkpoints of every AttnRes variant: the prompt mean and per-token weights returned over HTTP
(the real server, the official `openai` client; completions and chat, streamed and not, n > 1,
echo, chunked prefill), over gRPC, and by `attnres inspect --json`. Tolerances and the
expectations' definition: depth_helpers.py (f32 1e-4 absolute, bf16 2e-2)."""

import json
import subprocess

import grpc
import numpy as np
import openai
import pytest

import attnres_ref as ref
from depth_helpers import (BF16_TOL, F32_TOL, check_depth_json, check_matrix, expected,
                           proto_matrix, sublayer_labels)
from grpc_stubs import channel, pb, pb_grpc
from checkpoint_cache import checkpoint_fixture
from engine_cli import default_reference
from make_checkpoint import ATTNRES_VARIANTS, TOKENIZER_VOCAB
from server_process import ServerProcess

SERVER_ENV = {"OMP_NUM_THREADS": "1"}
MAX_TOKENS = 3
TOL = {"f32": F32_TOL, "bf16": BF16_TOL}


def prompt_ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(2000 + seed).integers(0, TOKENIZER_VOCAB, n).tolist()


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="depth", seed=5)


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="none", timeout=120,
                         max_retries=0)


def extra(choice, name):
    value = getattr(choice, name, None)
    return value if value is not None else (choice.model_extra or {}).get(name)


def complete(client, prompt, per_token=True, **kw):
    fields = {"depth_attention_per_token": True} if per_token else {"return_depth_attention": True}
    return client.completions.create(
        model=client.models.list().data[0].id, prompt=prompt, max_tokens=MAX_TOKENS,
        temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True, **fields}, **kw)


# ---------------------------------------------------------------- HTTP, every variant

CASES = [(v, "f32", {}) for v in ATTNRES_VARIANTS] + [
    ("attnres_block", "bf16", {}),
    ("attnres_block_reset", "bf16", {}),
    ("attnres_block", "f32", {"layers": 7}),          # P = 3, a ragged last block
    ("attnres_block_reset", "f32", {"layers": 5}),    # resets at layers 2 and 4
    # docs/ATTNRES.md §2d, compactly (the engine-level parity test has the whole matrix): a null
    # column and a V-stream row; block deltas under a scalar gate; first_layer's lone source;
    # pre-gated sources.
    ("attnres_delta_v", "f32", {"gate": "sigmoid_vector", "null_source": True}),
    ("attnres_delta_block", "f32", {"gate": "sigmoid_scalar"}),
    ("attnres_first_layer", "f32", {}),
    ("attnres_pre_gated", "f32", {}),
]


@pytest.mark.parametrize("variant,dtype,kw", CASES,
                         ids=["-".join([v, d, *(f"{k}{x}" for k, x in kw.items())])
                              for v, d, kw in CASES])
def test_completions_match_the_reference(attnres_bin, checkpoint, variant, dtype, kw):
    model_dir = checkpoint(variant, dtype, **kw)
    model = default_reference(attnres_bin, model_dir)  # what the served engine rounds here
    prompt = prompt_ids(1, 9)
    with ServerProcess(attnres_bin, "--model", model_dir, env=SERVER_ENV) as server:
        r = complete(client_of(server), prompt)
        choice = r.choices[0]
        generated = extra(choice, "token_ids")
        assert len(generated) == MAX_TOKENS
        check_depth_json(extra(choice, "depth_attention"), model, prompt, generated, TOL[dtype],
                         per_token=True, what=f"{variant} {dtype}")


@pytest.fixture(scope="module")
def reset_server(attnres_bin, checkpoint):
    """2b (final mix), prompts split into 4-token prefill chunks."""
    model_dir = checkpoint("attnres_block_reset")
    with ServerProcess(attnres_bin, "--model", model_dir, "--max-num-batched-tokens", "4",
                       env=SERVER_ENV) as server:
        yield server, ref.load(model_dir)


def test_chunked_prefill_prompt_mean_and_per_token(reset_server):
    server, model = reset_server
    prompt = prompt_ids(2, 11)  # chunks of 4, 4 and 3 tokens
    choice = complete(client_of(server), prompt).choices[0]
    check_depth_json(extra(choice, "depth_attention"), model, prompt, extra(choice, "token_ids"),
                     F32_TOL, per_token=True, what="chunked")


def test_prompt_mean_only_unless_per_token_is_asked(reset_server):
    server, model = reset_server
    prompt = prompt_ids(3, 6)
    choice = complete(client_of(server), prompt, per_token=False).choices[0]
    check_depth_json(extra(choice, "depth_attention"), model, prompt, extra(choice, "token_ids"),
                     F32_TOL, per_token=False, what="mean only")
    plain = client_of(server).completions.create(
        model=client_of(server).models.list().data[0].id, prompt=prompt, max_tokens=2)
    assert extra(plain.choices[0], "depth_attention") is None


def test_streamed_equals_not_streamed(reset_server):
    server, model = reset_server
    prompt = prompt_ids(4, 7)
    whole = extra(complete(client_of(server), prompt).choices[0], "depth_attention")
    chunks = list(complete(client_of(server), prompt, stream=True))
    parts = [extra(c.choices[0], "depth_attention") for c in chunks if c.choices]
    parts = [p for p in parts if p is not None]
    # The first chunk carrying weights has the labels and the prompt mean; later ones only
    # per_token, each with the token(s) of its chunk.
    assert "prompt_mean" in parts[0] and all("prompt_mean" not in p for p in parts[1:])
    assert parts[0]["sublayers"] == whole["sublayers"]
    assert parts[0]["sources"] == whole["sources"]
    assert parts[0]["prompt_mean"] == whole["prompt_mean"]
    per_token = [m for p in parts for m in p.get("per_token", [])]
    assert per_token == whole["per_token"]
    ids = [t for c in chunks if c.choices for t in (extra(c.choices[0], "token_ids") or [])]
    check_depth_json({**parts[0], "per_token": per_token}, model, prompt, ids, F32_TOL,
                     per_token=True, what="streamed")


def test_n_choices_and_echo(reset_server):
    server, model = reset_server
    prompt = prompt_ids(5, 6)
    client = client_of(server)
    r = client.completions.create(
        model=client.models.list().data[0].id, prompt=prompt, max_tokens=MAX_TOKENS, n=2,
        echo=True, temperature=1.0, seed=3,
        extra_body={"depth_attention_per_token": True, "return_token_ids": True,
                    "ignore_eos": True})
    assert len(r.choices) == 2
    for i, choice in enumerate(r.choices):
        check_depth_json(extra(choice, "depth_attention"), model, prompt,
                         extra(choice, "token_ids"), F32_TOL, per_token=True,
                         what=f"choice {i}")


def test_chat_completions(reset_server):
    server, model = reset_server
    client = client_of(server)
    r = client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "user", "content": "Which layer reads which?"}],
        extra_body={"depth_attention_per_token": True, "return_token_ids": True,
                    "ignore_eos": True})
    prompt = (r.model_extra or {})["prompt_token_ids"]
    choice = r.choices[0]
    check_depth_json(extra(choice, "depth_attention"), model, prompt, extra(choice, "token_ids"),
                     F32_TOL, per_token=True, what="chat")
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "user", "content": "Which layer reads which?"}], stream=True,
        extra_body={"depth_attention_per_token": True, "ignore_eos": True})
    parts = [extra(c.choices[0], "depth_attention") for c in stream if c.choices]
    parts = [p for p in parts if p is not None]
    assert parts[0]["prompt_mean"] == extra(choice, "depth_attention")["prompt_mean"]
    assert [m for p in parts for m in p.get("per_token", [])] == \
        extra(choice, "depth_attention")["per_token"]


# ---------------------------------------------------------------- gRPC


def test_grpc_depth_attention(attnres_bin, checkpoint):
    model_dir = checkpoint("attnres_full")
    model = ref.load(model_dir)
    prompt = prompt_ids(6, 8)
    with ServerProcess(attnres_bin, "--model", model_dir, env=SERVER_ENV) as server:
        stub = pb_grpc.GenerateStub(channel(server.grpc_target))
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60)
        assert list(info.depth_attention_sublayers) == sublayer_labels(model)

        def generate(stream, per_token=True):
            return list(stub.Generate(pb.GenerateRequest(
                token_ids=pb.TokenIds(ids=prompt), stream=stream,
                sampling_params=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                  ignore_eos=True),
                depth_attention=pb.DepthAttentionOptions(per_token=per_token)), timeout=60))

        done = [r.complete for r in generate(stream=False) if r.HasField("complete")]
        assert len(done) == 1
        generated = list(done[0].output_ids)
        depth = done[0].depth_attention
        mean, tokens = expected(model, prompt, generated)
        assert list(depth.sublayers) == sublayer_labels(model)
        assert list(depth.sources) == list(info.depth_attention_sources)
        check_matrix(proto_matrix(depth.prompt_mean), mean, F32_TOL, "gRPC prompt mean")
        assert len(depth.per_token) == MAX_TOKENS
        for k, m in enumerate(depth.per_token):
            check_matrix(proto_matrix(m), tokens[k], F32_TOL, f"gRPC token {k}")

        # Streamed: each chunk carries its tokens' matrices; the completion the prompt mean.
        responses = generate(stream=True)
        chunks = [r.chunk for r in responses if r.HasField("chunk")]
        assert all(len(c.depth_attention) == len(c.token_ids) for c in chunks)
        streamed = [proto_matrix(m) for c in chunks for m in c.depth_attention]
        assert len(streamed) == MAX_TOKENS
        for k, m in enumerate(streamed):
            check_matrix(m, tokens[k], F32_TOL, f"gRPC streamed token {k}")
        last = [r.complete for r in responses if r.HasField("complete")][0]
        check_matrix(proto_matrix(last.depth_attention.prompt_mean), mean, F32_TOL,
                     "gRPC streamed prompt mean")
        assert len(last.depth_attention.per_token) == 0

        # Not asked: nothing.
        plain = list(stub.Generate(pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=prompt),
            sampling_params=pb.SamplingParams(max_tokens=1)), timeout=60))
        assert not plain[-1].complete.HasField("depth_attention")


def test_grpc_plain_model_is_invalid_argument(attnres_bin, checkpoint):
    with ServerProcess(attnres_bin, "--model", checkpoint("qwen3"), env=SERVER_ENV) as server:
        stub = pb_grpc.GenerateStub(channel(server.grpc_target))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(pb.GenerateRequest(
                text="hello", sampling_params=pb.SamplingParams(max_tokens=1),
                depth_attention=pb.DepthAttentionOptions()), timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "depth_attention" in err.value.details()
        assert "no depth attention" in err.value.details()
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=60)
        assert len(info.depth_attention_sublayers) == 0


# ---------------------------------------------------------------- attnres inspect --json


@pytest.mark.parametrize("variant,chunk", [("attnres_block", 0), ("attnres_full", 0),
                                           ("attnres_nobias", 0), ("attnres_block_reset", 3)])
def test_inspect_json_matches_the_reference(attnres_bin, checkpoint, tmp_path, variant, chunk):
    model_dir = checkpoint(variant)
    model = ref.load(model_dir)
    prompt = prompt_ids(7, 10)
    out = tmp_path / "depth.json"
    args = [str(attnres_bin), "inspect", "--model", str(model_dir), "--threads", "1",
            "--prompt-ids", ",".join(map(str, prompt)), "--json", str(out)]
    if chunk:
        args += ["--max-num-batched-tokens", str(chunk)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "layer 0 attention" in proc.stdout  # the text table
    got = json.loads(out.read_text())
    assert got["prompt_ids"] == prompt
    check_depth_json(got, model, prompt, [], F32_TOL, per_token=False, what=f"inspect {variant}")
