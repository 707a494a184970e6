"""End-to-end tests of the gRPC API (proto/attnres/v1/generate.proto) against the real
`attnres serve` binary with the built-in demo model: generation on text and token ids (streamed
deltas, completions, n > 1, stop conditions, seeds, usage, logprobs), Abort and client-side
cancellation (the request's KV memory must be freed), health, validation errors, tokenization,
model info and API keys.

Every call has a deadline and every wait is bounded; nothing sleeps for a fixed time.
"""

import signal
import time
import uuid
from pathlib import Path

import grpc
import pytest
from tokenizers import Tokenizer

from grpc_stubs import (DEFAULT_TIMEOUT, GrpcServerProcess, channel, collect, health_pb,
                        health_pb_grpc, pb, pb_grpc)

GPT2_TOKENIZER = Path(__file__).resolve().parents[2] / "engine/model/assets/gpt2/tokenizer.json"
MAX_MODEL_LEN = 2048
PROMPT = "The depth of attention residuals"


@pytest.fixture(scope="module")
def server(attnres_bin):
    with GrpcServerProcess(attnres_bin, "--max-model-len", str(MAX_MODEL_LEN),
                           "--max-num-seqs", "8") as s:
        yield s


@pytest.fixture(scope="module")
def stub(server):
    with channel(server.grpc_target) as ch:
        yield pb_grpc.GenerateStub(ch)


@pytest.fixture(scope="module")
def hf():
    return Tokenizer.from_file(str(GPT2_TOKENIZER))


def generate(stub, metadata=None, **fields):
    """One Generate call, read to the end: collect()'s dict."""
    return collect(stub.Generate(pb.GenerateRequest(**fields), timeout=DEFAULT_TIMEOUT,
                                 metadata=metadata))


def greedy(max_tokens, **extra):
    return pb.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **extra)


def only_choice(result):
    assert list(result["choices"]) == [0]
    return result["choices"][0]


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# --- health and model info -------------------------------------------------------------------


def test_health_check_is_serving(server):
    with channel(server.grpc_target) as ch:
        health = health_pb_grpc.HealthStub(ch)
        for service in ("", "attnres.v1.Generate"):
            reply = health.Check(health_pb.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb.HealthCheckResponse.SERVING


def test_health_check_of_an_unknown_service_is_not_found(server):
    with channel(server.grpc_target) as ch:
        with pytest.raises(grpc.RpcError) as error:
            health_pb_grpc.HealthStub(ch).Check(
                health_pb.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no.such.Service" in error.value.details()


def test_health_watch_sends_the_status_and_a_cancelled_watch_ends(server):
    with channel(server.grpc_target) as ch:
        health = health_pb_grpc.HealthStub(ch)
        for service, status in (("", health_pb.HealthCheckResponse.SERVING),
                                ("attnres.v1.Generate", health_pb.HealthCheckResponse.SERVING),
                                ("no.such.Service", health_pb.HealthCheckResponse.SERVICE_UNKNOWN)):
            call = health.Watch(health_pb.HealthCheckRequest(service=service),
                                timeout=DEFAULT_TIMEOUT)
            assert next(call).status == status, service
            call.cancel()
            with pytest.raises(grpc.RpcError) as error:
                next(call)
            assert error.value.code() == grpc.StatusCode.CANCELLED
        # The server is unharmed by the watches its clients walked away from.
        reply = health.Check(health_pb.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb.HealthCheckResponse.SERVING


def test_model_info(stub):
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=DEFAULT_TIMEOUT)
    assert info.served_model_name == "attnres-demo"
    assert info.model_source == "built-in:demo"
    assert info.max_model_len == MAX_MODEL_LEN
    assert info.vocab_size == 50257
    assert info.architecture == "qwen3_attnres"
    assert info.model_type == "qwen3_attnres"
    assert info.attnres_mode == "block"
    assert info.attnres_num_blocks > 0 and info.num_layers > 0
    assert list(info.eos_token_ids) == [50256]  # the GPT-2 tokenizer's <|endoftext|>


# --- Generate ---------------------------------------------------------------------------------


def test_generate_text_streams_deltas_that_add_up(stub, hf):
    result = generate(stub, text=PROMPT, sampling_params=greedy(12), stream=True)
    [request_id] = result["request_ids"]
    assert request_id.startswith("grpc-")  # made by the server: the client sent none
    choice = only_choice(result)
    complete = choice["complete"]
    assert choice["chunks"] >= 1
    assert complete.finish_reason == "length"
    assert len(choice["ids"]) == 12
    assert list(complete.output_ids) == choice["ids"]
    assert complete.text == choice["text"]
    assert choice["text"] == hf.decode(choice["ids"], skip_special_tokens=True)
    prompt_len = len(hf.encode(PROMPT).ids)
    assert (complete.usage.prompt_tokens, complete.usage.completion_tokens,
            complete.usage.total_tokens) == (prompt_len, 12, prompt_len + 12)
    assert complete.error == ""


def test_generate_is_deterministic_at_temperature_zero(stub):
    first = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(10), stream=True))
    second = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(10), stream=True))
    assert first["ids"] == second["ids"]


def test_generate_on_token_ids_matches_text_input(stub, hf):
    ids = hf.encode(PROMPT).ids
    request_id = f"token-ids-{uuid.uuid4().hex}"
    by_ids = generate(stub, request_id=request_id, token_ids=pb.TokenIds(ids=ids),
                      sampling_params=greedy(10), stream=True)
    assert by_ids["request_ids"] == {request_id}  # the client's id on every message
    by_text = generate(stub, text=PROMPT, sampling_params=greedy(10), stream=True)
    assert only_choice(by_ids)["ids"] == only_choice(by_text)["ids"]
    assert only_choice(by_ids)["complete"].usage.prompt_tokens == len(ids)


def test_not_streamed_sends_only_the_completion(stub, hf):
    streamed = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(8), stream=True))
    whole = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(8), stream=False))
    assert whole["chunks"] == 0
    assert list(whole["complete"].output_ids) == streamed["ids"]
    assert whole["complete"].text == hf.decode(streamed["ids"], skip_special_tokens=True)


def test_detokenize_false_sends_token_ids_only(stub):
    choice = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(6), stream=True,
                                  detokenize=False))
    assert len(choice["ids"]) == 6
    assert choice["text"] == "" and choice["complete"].text == ""


def test_n_choices_have_indices_and_seeds_reproduce(stub):
    params = pb.SamplingParams(temperature=1.0, seed=1234, n=3, max_tokens=8, ignore_eos=True)
    first = generate(stub, text=PROMPT, sampling_params=params, stream=True)
    second = generate(stub, text=PROMPT, sampling_params=params, stream=True)
    assert sorted(first["choices"]) == [0, 1, 2]
    for index, choice in first["choices"].items():
        complete = choice["complete"]
        assert complete is not None and complete.index == index
        assert complete.finish_reason == "length"
        assert list(complete.output_ids) == choice["ids"] and len(choice["ids"]) == 8
        assert complete.usage.completion_tokens == 8
        assert second["choices"][index]["ids"] == choice["ids"]
    # Choice i samples with seed + i: with 8 sampled tokens, three identical choices would mean
    # the seeds are not applied per choice.
    assert len({tuple(c["ids"]) for c in first["choices"].values()}) > 1


def test_stop_string_ends_the_choice_and_is_excluded(stub):
    full = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(24), stream=True))
    text = full["text"]
    assert len(text) >= 6, f"the demo model produced too little text: {text!r}"
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop
    params = greedy(24, stop=[stop])
    stopped = only_choice(generate(stub, text=PROMPT, sampling_params=params, stream=True))
    complete = stopped["complete"]
    assert complete.finish_reason == "stop"
    assert complete.stop_string == stop
    assert stopped["text"] == text[:text.find(stop)]
    assert complete.text == stopped["text"]


def test_stop_token_id_ends_the_choice(stub):
    full = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(12), stream=True))
    stop_token = full["ids"][4]
    first = full["ids"].index(stop_token)
    stopped = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(
        12, stop_token_ids=[stop_token]), stream=True))
    assert stopped["complete"].finish_reason == "stop"
    assert stopped["complete"].stop_token_id == stop_token
    assert stopped["ids"] == full["ids"][:first + 1]  # the stop token is generated, not shown


def test_logprobs_come_with_every_token(stub):
    choice = only_choice(generate(stub, text=PROMPT, sampling_params=greedy(5, logprobs=2),
                                  stream=False))
    complete = choice["complete"]
    assert len(complete.logprobs) == 5
    for token_id, lp in zip(complete.output_ids, complete.logprobs):
        assert lp.token_id == token_id
        assert lp.logprob <= 0 and lp.rank == 1  # greedy: the best token
        assert len(lp.top_logprobs) == 2
        assert lp.top_logprobs[0].token_id == token_id


# --- Abort and cancellation -------------------------------------------------------------------


def start_long_request(stub, hf, request_id):
    """A request that would run for max_model_len tokens; returns the call after its first chunk."""
    max_tokens = MAX_MODEL_LEN - len(hf.encode(PROMPT).ids)
    call = stub.Generate(pb.GenerateRequest(request_id=request_id, text=PROMPT,
                                            sampling_params=greedy(max_tokens), stream=True),
                         timeout=DEFAULT_TIMEOUT)
    first = next(call)
    assert first.HasField("chunk")
    return call, max_tokens


def test_abort_ends_a_running_request(stub, hf):
    request_id = f"abort-{uuid.uuid4().hex}"
    call, max_tokens = start_long_request(stub, hf, request_id)
    stub.Abort(pb.AbortRequest(request_id=request_id), timeout=DEFAULT_TIMEOUT)
    rest = collect(call)
    complete = rest["choices"][0]["complete"]
    assert complete.finish_reason == "abort"
    assert complete.usage.completion_tokens < max_tokens
    assert call.code() == grpc.StatusCode.OK
    # Unknown ids are ignored (vLLM): the abort may race the request's end.
    stub.Abort(pb.AbortRequest(request_id=request_id), timeout=DEFAULT_TIMEOUT)
    stub.Abort(pb.AbortRequest(request_id="no-such-request"), timeout=DEFAULT_TIMEOUT)


ABORTED = 'attnres:request_success_total{model_name="attnres-demo",finished_reason="abort"}'


def engine_idle(server):
    m = server.metrics()
    return (m["attnres:num_requests_running"] == 0 and m["attnres:num_requests_waiting"] == 0
            and m["attnres:kv_cache_usage_perc"] == 0)


def test_cancelled_call_aborts_its_request(server, stub, hf):
    # Stats are published after each engine step, so a request that just ended may not be
    # counted yet: take the baseline once the engine is seen idle (its snapshot then includes
    # every earlier request's end).
    wait_until(lambda: engine_idle(server), what="the engine to be idle")
    aborted_before = server.metrics().get(ABORTED, 0.0)
    call, _ = start_long_request(stub, hf, f"cancel-{uuid.uuid4().hex}")
    wait_until(lambda: server.metrics()["attnres:num_requests_running"] >= 1,
               what="the long request to be running")
    call.cancel()
    with pytest.raises(grpc.RpcError) as error:
        collect(call)
    assert error.value.code() == grpc.StatusCode.CANCELLED
    wait_until(lambda: engine_idle(server),
               what="the cancelled request to leave the engine and free its KV cache")
    assert server.metrics()[ABORTED] == aborted_before + 1


def test_finished_requests_are_recorded_in_the_metrics(server, stub):
    count = "attnres:e2e_request_latency_seconds_count"
    before = server.metrics().get(count, 0.0)
    generate(stub, text=PROMPT, sampling_params=greedy(3), stream=True)
    assert wait_until(lambda: server.metrics()[count] >= before + 1, what=count)


# --- errors -----------------------------------------------------------------------------------


def expect_error(code, fragment, call, *args, **kwargs):
    with pytest.raises(grpc.RpcError) as error:
        result = call(*args, timeout=DEFAULT_TIMEOUT, **kwargs)
        if not isinstance(result, pb.TokenizeResponse | pb.DetokenizeResponse):
            collect(result)
    assert error.value.code() == code, error.value.details()
    assert fragment in error.value.details()
    return error.value.details()


@pytest.mark.parametrize("fields, fragment", [
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(temperature=-1)}, "temperature"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(top_p=0)}, "top_p"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(max_tokens=0)}, "max_tokens"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(logprobs=-1)}, "logprobs"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(logprobs=21)}, "logprobs"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(stop=[""])}, "stop[0]"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(n=-2)}, "n: got -2"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(logit_bias={60000: 1.0})},
     "logit_bias"),
    ({"text": PROMPT, "sampling_params": pb.SamplingParams(stop_token_ids=[50257])},
     "stop_token_ids[0]"),
    ({"token_ids": pb.TokenIds(ids=[1, 2, 50257])}, "token_ids[2]"),
    ({"token_ids": pb.TokenIds(ids=[-1])}, "token_ids[0]"),
    ({"token_ids": pb.TokenIds(ids=[])}, "token_ids"),
    ({"text": ""}, "text"),
    ({}, "input"),
])
def test_invalid_arguments_name_the_field(stub, fields, fragment):
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, fragment, stub.Generate,
                 pb.GenerateRequest(**fields))


def test_prompt_plus_max_tokens_over_the_context_quotes_both_numbers(stub, hf):
    prompt_len = len(hf.encode(PROMPT).ids)
    max_tokens = MAX_MODEL_LEN
    details = expect_error(grpc.StatusCode.INVALID_ARGUMENT, str(MAX_MODEL_LEN), stub.Generate,
                           pb.GenerateRequest(text=PROMPT,
                                              sampling_params=pb.SamplingParams(
                                                  max_tokens=max_tokens)))
    assert str(prompt_len + max_tokens) in details


def test_a_request_id_in_use_is_rejected(stub, hf):
    request_id = f"dup-{uuid.uuid4().hex}"
    call, _ = start_long_request(stub, hf, request_id)
    try:
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, "request_id", stub.Generate,
                     pb.GenerateRequest(request_id=request_id, text=PROMPT))
    finally:
        stub.Abort(pb.AbortRequest(request_id=request_id), timeout=DEFAULT_TIMEOUT)
        collect(call)


# --- tokenization -----------------------------------------------------------------------------


def test_tokenize_detokenize_round_trip(stub, hf):
    text = "Hello, depth attention! Ünïcødé 🚀"
    reply = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=DEFAULT_TIMEOUT)
    assert list(reply.token_ids) == hf.encode(text).ids
    assert reply.count == len(reply.token_ids)
    assert reply.max_model_len == MAX_MODEL_LEN
    back = stub.Detokenize(pb.DetokenizeRequest(token_ids=reply.token_ids),
                           timeout=DEFAULT_TIMEOUT)
    assert back.text == text
    # Part of a multi-byte character: U+FFFD like the HF tokenizer, never invalid UTF-8 (which a
    # proto3 string could not carry).
    rocket = hf.encode("🚀").ids
    part = stub.Detokenize(pb.DetokenizeRequest(token_ids=rocket[:1]), timeout=DEFAULT_TIMEOUT)
    assert part.text == hf.decode(rocket[:1])


def test_detokenize_rejects_ids_outside_the_vocabulary(stub):
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "token_ids[1]", stub.Detokenize,
                 pb.DetokenizeRequest(token_ids=[10, 50257]))


# --- shutdown ---------------------------------------------------------------------------------


def test_shutdown_turns_health_not_serving_and_refuses_new_requests(attnres_bin, hf):
    # A long context so the running request outlives the checks below by far (the demo model
    # needs tens of seconds for 16k tokens); it is aborted explicitly at the end.
    long_len = 16384
    with GrpcServerProcess(attnres_bin, "--max-model-len", str(long_len)) as server:
        with channel(server.grpc_target) as ch:
            stub = pb_grpc.GenerateStub(ch)
            health = health_pb_grpc.HealthStub(ch)
            request_id = f"drain-{uuid.uuid4().hex}"
            max_tokens = long_len - len(hf.encode(PROMPT).ids)
            call = stub.Generate(pb.GenerateRequest(request_id=request_id, text=PROMPT,
                                                    sampling_params=greedy(max_tokens),
                                                    stream=True), timeout=DEFAULT_TIMEOUT)
            assert next(call).HasField("chunk")
            server.proc.send_signal(signal.SIGTERM)  # draining: the request keeps running

            def not_serving():
                reply = health.Check(health_pb.HealthCheckRequest(), timeout=10)
                return reply.status == health_pb.HealthCheckResponse.NOT_SERVING

            wait_until(not_serving, what="health NOT_SERVING after SIGTERM")
            expect_error(grpc.StatusCode.UNAVAILABLE, "shutting down", stub.Generate,
                         pb.GenerateRequest(text=PROMPT))
            stub.Abort(pb.AbortRequest(request_id=request_id), timeout=DEFAULT_TIMEOUT)
            assert collect(call)["choices"][0]["complete"].finish_reason == "abort"
        assert server.stop() == 0


def test_health_watch_reports_not_serving_and_ends_on_shutdown(attnres_bin):
    with GrpcServerProcess(attnres_bin) as server:
        with channel(server.grpc_target) as ch:
            health = health_pb_grpc.HealthStub(ch)
            watches = {service: health.Watch(health_pb.HealthCheckRequest(service=service),
                                             timeout=DEFAULT_TIMEOUT)
                       for service in ("", "attnres.v1.Generate", "no.such.Service")}
            firsts = {service: next(call).status for service, call in watches.items()}
            started = time.monotonic()
            # Open watches must not hold the shutdown up (stop() fails the test on a hang).
            assert server.stop() == 0
            stop_seconds = time.monotonic() - started
            # The rest of each stream: a change to NOT_SERVING, then the end (status OK: the
            # server ended the watch, it was not cut off at the shutdown deadline).
            rests = {service: [r.status for r in call] for service, call in watches.items()}
            for service, call in watches.items():
                assert call.code() == grpc.StatusCode.OK, (service, call.code(), call.details())
    Status = health_pb.HealthCheckResponse
    assert firsts == {"": Status.SERVING, "attnres.v1.Generate": Status.SERVING,
                      "no.such.Service": Status.SERVICE_UNKNOWN}
    assert rests == {"": [Status.NOT_SERVING], "attnres.v1.Generate": [Status.NOT_SERVING],
                     "no.such.Service": []}, rests
    assert stop_seconds < 30, stop_seconds


# --- API keys ---------------------------------------------------------------------------------


def test_api_key_is_required_when_configured(attnres_bin):
    key = "grpc-test-secret"
    with GrpcServerProcess(attnres_bin, "--api-key", key) as keyed:
        with channel(keyed.grpc_target) as ch:
            keyed_stub = pb_grpc.GenerateStub(ch)
            for metadata in (None, [("authorization", "Bearer wrong")],
                             [("authorization", key)]):
                with pytest.raises(grpc.RpcError) as error:
                    keyed_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=DEFAULT_TIMEOUT,
                                            metadata=metadata)
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as error:
                generate(keyed_stub, text=PROMPT, sampling_params=greedy(2))
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
            good = [("authorization", f"Bearer {key}")]
            info = keyed_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=DEFAULT_TIMEOUT,
                                           metadata=good)
            assert info.served_model_name == "attnres-demo"
            result = generate(keyed_stub, metadata=good, text=PROMPT, sampling_params=greedy(2))
            assert only_choice(result)["complete"].finish_reason == "length"
            # Health stays open, as HTTP /health does.
            reply = health_pb_grpc.HealthStub(ch).Check(health_pb.HealthCheckRequest(),
                                                        timeout=10)
            assert reply.status == health_pb.HealthCheckResponse.SERVING


# --- server reflection ------------------------------------------------------------------------


def test_server_reflection_lists_and_describes_the_services(server):
    """What grpcurl does without the .proto files: list the services over reflection, then
    fetch their descriptors."""
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase)

    with channel(server.grpc_target) as ch:
        database = ProtoReflectionDescriptorDatabase(ch)
        services = set(database.get_services())
        assert {"attnres.v1.Generate", "grpc.health.v1.Health"} <= services
        pool = DescriptorPool(database)
        generate_service = pool.FindServiceByName("attnres.v1.Generate")
        methods = {m.name for m in generate_service.methods}
        assert {"Generate", "Abort", "Tokenize", "Detokenize", "GetModelInfo"} <= methods
        request = pool.FindMessageTypeByName("attnres.v1.GenerateRequest")
        assert "sampling_params" in request.fields_by_name
