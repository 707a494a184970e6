"""One request's failure stays that request's (docs/ENGINE_CONTRACT.md, "Fault isolation"),
end to end against the real `attnres serve` binary and `attnres generate`.

The checkpoint has more LM-head rows (50304) than its tokenizer has tokens (GPT-2's 50257), as
every Qwen3 checkpoint does, and its padding rows are scaled up so that they *win* the argmax:
the unmasked NumPy reference picks padding ids, and the server must never sample them. A
request that names a padding id (logit_bias, allowed_token_ids, prompt ids) is a 400 /
INVALID_ARGUMENT naming the id; innocent requests running beside everything else get exactly
what they get alone, and the server stays healthy throughout.
"""

import json
import subprocess
import threading
import time

import grpc
import pytest
from openai import BadRequestError, OpenAI

import attnres_ref
from checkpoint_cache import checkpoint_fixture
from grpc_stubs import DEFAULT_TIMEOUT, GrpcServerProcess, channel, collect, pb, pb_grpc
from http_helpers import assert_error_envelope, post_json, request
from server_process import ServerProcess

TOKENIZER_VOCAB = 50257  # GPT-2: ids [50257, 50304) are padding rows
PADDING_ID = 50300
PROMPT_IDS = [464, 6795, 286, 3241, 4088, 82]


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="faults", seed=11)


@pytest.fixture(scope="module")
def model_dir(checkpoint):
    return checkpoint("attnres_block", pad_scale=30.0)


@pytest.fixture(scope="module")
def reference(model_dir):
    return attnres_ref.load(model_dir)


@pytest.fixture(scope="module")
def server(attnres_bin, model_dir):
    with GrpcServerProcess(attnres_bin, "--model", str(model_dir), "--max-num-seqs", "16",
                           "--served-model-name", "padded") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


def test_the_checkpoint_would_sample_padding_without_the_mask(reference):
    # Otherwise the tests below could not fail.
    unmasked = reference.greedy(PROMPT_IDS, 8)
    assert any(t >= TOKENIZER_VOCAB for t in unmasked), unmasked


def completion(client, **fields):
    fields.setdefault("max_tokens", 8)
    extra = fields.pop("extra_body", {})
    return client.completions.create(model="padded", prompt=fields.pop("prompt", PROMPT_IDS),
                                     extra_body={"return_token_ids": True, **extra}, **fields)


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_never_samples_padding_and_matches_the_masked_reference(client, reference, stream):
    expected = reference.greedy(PROMPT_IDS, 8, decodable=TOKENIZER_VOCAB)
    if stream:
        ids = []
        for chunk in completion(client, temperature=0, stream=True,
                                extra_body={"ignore_eos": True}):
            ids += chunk.choices[0].model_extra.get("token_ids") or []
    else:
        r = completion(client, temperature=0, extra_body={"ignore_eos": True})
        ids = r.choices[0].model_extra["token_ids"]
        assert r.choices[0].finish_reason == "length"
    assert ids == expected


@pytest.mark.parametrize("stream", [False, True])
def test_sampled_choices_never_produce_or_report_padding(client, stream):
    kwargs = dict(temperature=1.0, seed=5, n=3, logprobs=5, max_tokens=12,
                  extra_body={"ignore_eos": True})
    ids = {i: [] for i in range(3)}
    tops = []
    if stream:
        for chunk in completion(client, stream=True, **kwargs):
            for c in chunk.choices:
                ids[c.index] += c.model_extra.get("token_ids") or []
                if c.logprobs:
                    tops += c.logprobs.top_logprobs or []
    else:
        r = completion(client, **kwargs)
        for c in r.choices:
            ids[c.index] = c.model_extra["token_ids"]
            tops += c.logprobs.top_logprobs
    for choice, toks in ids.items():
        assert len(toks) == 12, (choice, toks)
        assert all(0 <= t < TOKENIZER_VOCAB for t in toks), toks
    assert tops and all(len(t) >= 1 for t in tops)


PADDING_FIELDS = [
    ("logit_bias", {str(PADDING_ID): 100}, "logit_bias", f"got {PADDING_ID}"),
    ("allowed_token_ids", [11, PADDING_ID], "allowed_token_ids", f"got {PADDING_ID}"),
    ("stop_token_ids", [PADDING_ID], "stop_token_ids", f"got {PADDING_ID}"),
]
PADDING_CASES = [(path, *case) for path in ("/v1/completions", "/v1/chat/completions")
                 for case in PADDING_FIELDS]
PADDING_CASES.append(("/v1/completions", "prompt", [464, PADDING_ID], "prompt", str(PADDING_ID)))


@pytest.mark.parametrize("path,field,value,param,named", PADDING_CASES)
@pytest.mark.parametrize("stream", [False, True])
def test_padding_ids_in_a_request_are_a_400_naming_the_id(server, path, field, value, param,
                                                          named, stream):
    body = {"model": "padded", "max_tokens": 2, "stream": stream, field: value}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "Hello"}]
    elif field != "prompt":
        body["prompt"] = "Hello"
    status, _, reply = post_json(server.http_url, path, body)
    assert status == 400, reply
    message = assert_error_envelope(reply, param=param)
    assert named in message, message
    if field != "prompt":
        assert "padding row" in message, message
    assert request(server.http_url, "GET", "/health")[0] == 200


def test_the_openai_client_gets_the_400(client):
    with pytest.raises(BadRequestError) as e:
        completion(client, logit_bias={str(PADDING_ID): 100})
    assert str(PADDING_ID) in str(e.value)


def test_an_empty_allowed_token_ids_is_a_400(server):
    status, _, reply = post_json(server.http_url, "/v1/completions",
                                 {"model": "padded", "prompt": "Hi", "allowed_token_ids": []})
    assert status == 400
    assert "allowed_token_ids" in assert_error_envelope(reply, param="allowed_token_ids")


def test_allowed_token_ids_restricts_what_is_sampled(client):
    allowed = [11, 13, 262, 290]
    r = completion(client, temperature=1.0, seed=3, n=2, max_tokens=10,
                   extra_body={"allowed_token_ids": allowed, "ignore_eos": True})
    for c in r.choices:
        assert c.model_extra["token_ids"] and set(c.model_extra["token_ids"]) <= set(allowed)


def test_grpc_refuses_padding_ids_and_serves_the_rest(server, reference):
    with channel(server.grpc_target) as ch:
        stub = pb_grpc.GenerateStub(ch)
        for fields in (
            dict(token_ids=pb.TokenIds(ids=[464, PADDING_ID]),
                 sampling_params=pb.SamplingParams(max_tokens=2)),
            dict(text="Hello", sampling_params=pb.SamplingParams(
                max_tokens=2, logit_bias={PADDING_ID: 100.0})),
            dict(text="Hello", sampling_params=pb.SamplingParams(
                max_tokens=2, allowed_token_ids=[PADDING_ID])),
        ):
            with pytest.raises(grpc.RpcError) as e:
                collect(stub.Generate(pb.GenerateRequest(**fields), timeout=DEFAULT_TIMEOUT))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert str(PADDING_ID) in e.value.details(), e.value.details()
        result = collect(stub.Generate(pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=PROMPT_IDS),
            sampling_params=pb.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)),
            timeout=DEFAULT_TIMEOUT))
    choice = result["choices"][0]
    assert not choice["complete"].error
    assert list(choice["complete"].output_ids) == reference.greedy(PROMPT_IDS, 8,
                                                                  decodable=TOKENIZER_VOCAB)


def test_innocent_requests_are_unaffected_by_everything_around_them(server, client):
    """Bad requests, padding-prone sampled requests and innocent greedy ones, all at once."""
    innocent_prompts = [[464, 3290, 318], [40, 1842, 257, 2068], [1212, 318, 257]]

    def innocent(prompt):
        r = completion(client, prompt=prompt, temperature=0, max_tokens=10,
                       extra_body={"ignore_eos": True})
        return r.choices[0].model_extra["token_ids"]

    alone = [innocent(p) for p in innocent_prompts]
    results, errors, health = {}, [], []

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - collected and asserted on below
            errors.append((name, repr(e)))

    def bad(i):
        status, _, reply = post_json(server.http_url, "/v1/completions", {
            "model": "padded", "prompt": "x", "max_tokens": 2,
            "logit_bias": {str(PADDING_ID + i % 3): 100}})
        return status

    def sampled(i):
        r = completion(client, temperature=1.5, seed=i, n=2, max_tokens=16, stream=False,
                       extra_body={"ignore_eos": True})
        return [c.model_extra["token_ids"] for c in r.choices]

    threads = [threading.Thread(target=run, args=(f"innocent{k}", lambda p=p: innocent(p)))
               for k, p in enumerate(innocent_prompts)]
    threads += [threading.Thread(target=run, args=(f"bad{i}", lambda i=i: bad(i))) for i in range(6)]
    threads += [threading.Thread(target=run, args=(f"sampled{i}", lambda i=i: sampled(i)))
                for i in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        health.append(request(server.http_url, "GET", "/health")[0])
        for t in threads:
            t.join(timeout=0.05)
    assert not errors, errors
    for k in range(len(innocent_prompts)):
        assert results[f"innocent{k}"] == alone[k]
    assert all(results[f"bad{i}"] == 400 for i in range(6))
    for i in range(4):
        for toks in results[f"sampled{i}"]:
            assert len(toks) == 16 and all(t < TOKENIZER_VOCAB for t in toks)
    assert health and set(health) == {200}, health
    metrics = request(server.http_url, "GET", "/metrics")[2].decode()
    assert "attnres:engine_alive 1" in metrics.replace('{model_name="padded"}', "")


def test_attnres_generate_never_samples_padding(attnres_bin, model_dir, reference):
    out = subprocess.run([str(attnres_bin), "generate", "--model", str(model_dir), "--prompt-ids",
                          ",".join(map(str, PROMPT_IDS)), "--max-tokens", "8", "--temperature",
                          "0", "--ignore-eos", "--json"],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout)
    assert result["token_ids"] == reference.greedy(PROMPT_IDS, 8, decodable=TOKENIZER_VOCAB)
    bad = subprocess.run([str(attnres_bin), "generate", "--model", str(model_dir), "--prompt-ids",
                          f"464,{PADDING_ID}", "--max-tokens", "2"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0
    assert str(PADDING_ID) in bad.stderr and "padding row" in bad.stderr, bad.stderr


def test_a_failed_forward_stops_the_server_with_exit_status_1(attnres_bin):
    """The other side of the rule: a failure of the step itself (here injected into the
    forward from the second step on) leaves the KV cache unknown, so the engine stops: the
    running request gets the error, /health answers 503 and the process exits 1 for its
    supervisor to restart it."""
    server = ServerProcess(attnres_bin, env={"ATTNRES_TEST_FAIL_FORWARD_AFTER": "1"})
    server.__enter__()
    try:
        status, _, reply = post_json(server.http_url, "/v1/completions", {
            "prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert status in (500, 503), reply
        assert "injected forward failure" in reply["error"]["message"]
        deadline = time.monotonic() + 30
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.proc.returncode == 1, server.log()
        assert "the engine stopped after an error" in server.log()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
