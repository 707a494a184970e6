"""Structured output end to end (README, "Structured output"), against the real `attnres serve`
with the random-weight demo model: only an enforced constraint can make its output valid, so
every answer is checked against its constraint with an independent checker (jsonschema, json,
re), over seeds and temperatures, streamed and not, n > 1, prefix caching on (serve's
default), over HTTP and gRPC. Also: the official client's chat.completions.parse() with a Pydantic model,
unconstrained requests batched with constrained ones keep their tokens, and bad input is a 400
naming the field."""

import json
import re
import threading
from typing import Literal

import grpc
import jsonschema
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from http_helpers import assert_error_envelope, post_json
from grpc_stubs import DEFAULT_TIMEOUT, GrpcServerProcess, channel, collect, pb, pb_grpc

SERVER_ENV = {"OMP_NUM_THREADS": "1"}
CHAT = [{"role": "user", "content": "Describe a thing."}]

# Small enough that the grammar forces an end well inside max_tokens: enum, boolean, a bounded
# integer and a short string, no other properties.
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"type": "string", "maxLength": 6},
    },
    "required": ["color", "ok", "count", "tag"],
    "additionalProperties": False,
}
SEEDS = [1, 2, 3]
TEMPERATURES = [0.0, 0.8, 1.5]


@pytest.fixture(scope="module")
def server(attnres_bin):
    with GrpcServerProcess(attnres_bin, "--max-model-len", "512", "--max-num-seqs", "16",
                       "--served-model-name", "demo",
                       env=SERVER_ENV) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


def chat_texts(client, stream, n, **kwargs):
    """Every choice's (text, finish_reason), streamed or not."""
    if not stream:
        r = client.chat.completions.create(model="demo", messages=CHAT, n=n, **kwargs)
        return [(c.message.content, c.finish_reason) for c in r.choices]
    texts, finish = [""] * n, [None] * n
    for chunk in client.chat.completions.create(model="demo", messages=CHAT, n=n, stream=True,
                                                **kwargs):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
    return list(zip(texts, finish))


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_validate(client, stream):
    for seed in SEEDS:
        for temperature in TEMPERATURES:
            answers = chat_texts(
                client, stream, n=2, max_tokens=80, seed=seed, temperature=temperature,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "thing", "schema": SCHEMA}})
            for text, finish in answers:
                assert finish == "stop", (seed, temperature, text)
                jsonschema.validate(json.loads(text), SCHEMA)


def test_json_schema_spellings_on_both_endpoints(client, server):
    spellings = [{"structured_outputs": {"json": SCHEMA}}, {"guided_json": SCHEMA},
                 {"json_schema": SCHEMA}, {"guided_json": json.dumps(SCHEMA)}]
    for extra in spellings:
        for path, body in [("/v1/completions", {"prompt": "A thing:"}),
                           ("/v1/chat/completions", {"messages": CHAT})]:
            status, _, out = post_json(server.http_url, path, {
                **body, **extra, "max_tokens": 80, "temperature": 1.0, "seed": 5})
            assert status == 200, out
            choice = out["choices"][0]
            text = choice["text"] if "text" in choice else choice["message"]["content"]
            assert choice["finish_reason"] == "stop", text
            jsonschema.validate(json.loads(text), SCHEMA)


# Completions of a cut-off JSON text: finish a literal, number or \\u escape, close a string,
# then supply a missing value or key, then close the open containers.
_FILLERS = ["", "0", "00", "000", "0000", "ue", "rue", "e", "alse", "lse", "se", "ull", "ll", "l"]
_VALUES = ["", "null", ": null", "\"k\": null"]


def is_object_prefix(text):
    """Whether `text` is the start of some JSON object: some short completion parses to one
    (an independent check of what the grammar let through when max_tokens cut it off)."""
    for filler in _FILLERS:
        head = text + filler
        stack, in_string, escaped = [], False, False
        for ch in head:
            if in_string:
                escaped = not escaped and ch == "\\"
                in_string = escaped or ch != '"'
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                stack.append(ch)
            elif ch in "}]" and stack:
                stack.pop()
        if in_string:
            head += '"'
        closers = "".join("}" if c == "{" else "]" for c in reversed(stack))
        for value in _VALUES:
            try:
                if isinstance(json.loads(head + value + closers), dict):
                    return True
            except json.JSONDecodeError:
                pass
    return False


def test_object_prefix_checker():
    for good in ['{"a": 1', '{"a": "x', '{"a": [1, {"b": tr', '{"a', '{"a": -', '{"a": 1, ',
                 '{"a": "\\u00']:
        assert is_object_prefix(good), good
    for bad in ['{"a" 1', '{]', '[1', '{"a": 1}}', '{"a": 1} x', '{"a": nul1']:
        assert not is_object_prefix(bad), bad


def test_json_object_answers_are_objects(client):
    """A random model seldom closes a free-form object within max_tokens: answers that end
    parse to an object, and the ones cut off are the start of one."""
    for seed in SEEDS:
        for temperature in TEMPERATURES:
            for text, finish in chat_texts(client, seed % 2 == 0, n=2, max_tokens=60, seed=seed,
                                           temperature=temperature,
                                           response_format={"type": "json_object"}):
                if finish == "stop":
                    assert isinstance(json.loads(text), dict), text
                else:
                    assert finish == "length" and is_object_prefix(text), (finish, text)


@pytest.mark.parametrize("extra,pattern", [
    ({"guided_regex": r"[a-z]{3,8}-[0-9]{2}"}, r"[a-z]{3,8}-[0-9]{2}"),
    ({"structured_outputs": {"regex": r"(yes|no), [A-Z][a-z]{0,5}\."}},
     r"(yes|no), [A-Z][a-z]{0,5}\."),
    ({"guided_choice": ["alpha", "beta", "gamma delta"]}, r"alpha|beta|gamma delta"),
    ({"structured_outputs": {"choice": ["x", "yy"]}}, r"x|yy"),
    ({"grammar": 'root ::= "yes" | "no" | ("maybe " [0-9])'}, r"yes|no|maybe [0-9]"),
    ({"guided_grammar": 'root ::= item ("," item){0,3}\nitem ::= [a-c]{1,4}'},
     r"[a-c]{1,4}(,[a-c]{1,4}){0,3}"),
    ({"structured_outputs": {"grammar": 'root ::= "<" [0-9]{1,3} ">"'}}, r"<[0-9]{1,3}>"),
])
def test_regex_choice_and_grammar_answers_match(client, extra, pattern):
    for seed in SEEDS:
        for temperature in TEMPERATURES:
            for stream in (False, True):
                for text, finish in chat_texts(client, stream, n=2, max_tokens=40, seed=seed,
                                               temperature=temperature, extra_body=extra):
                    assert finish == "stop", (extra, text)
                    assert re.fullmatch(pattern, text), (extra, text)


class Thing(BaseModel):
    color: Literal["red", "green", "blue"]
    size: int = Field(ge=0, le=9)
    shiny: bool


def test_openai_parse_returns_a_parsed_object(client):
    for seed in SEEDS:
        completion = client.chat.completions.parse(
            model="demo", messages=CHAT, response_format=Thing, max_tokens=80, seed=seed,
            temperature=1.0)
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "stop", message.content
        assert isinstance(message.parsed, Thing)
        assert message.parsed == Thing.model_validate_json(message.content)


def test_unconstrained_requests_keep_their_tokens_beside_constrained_ones(client):
    def plain():
        r = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=24,
                                      temperature=0, extra_body={"ignore_eos": True,
                                                                 "return_token_ids": True})
        return r.choices[0].model_extra["token_ids"]

    alone = plain()
    results, errors = {}, []

    def constrained(i):
        try:
            client.completions.create(
                model="demo", prompt=f"Item {i}:", max_tokens=60, temperature=1.0, seed=i,
                extra_body={"guided_json": SCHEMA})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def unconstrained(i):
        results[i] = plain()

    threads = [threading.Thread(target=constrained, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=unconstrained, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(tokens == alone for tokens in results.values()), (alone, results)


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "bogus"}}, "response_format"),
    ({"response_format": "json_object"}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "bogus"}}}}, "response_format"),
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
     "guided_json"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
     "guided_json"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"structured_outputs": {"regex": "[z-a]"}}, "structured_outputs"),
    ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar"),
    ({"grammar": "this is not a grammar"}, "grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 1]}, "guided_choice"),
    ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "grammar"),
    ({"guided_decoding_backend": "outlines", "guided_regex": "a"}, "guided_decoding_backend"),
    ({"structured_outputs": {"structural_tag": '{"type": "nope"}'}}, "structured_outputs"),
    ({"guided_regex": "a" * 70000}, "guided_regex"),
    ({"guided_json": '{"type":"array","items":' * 70 + "{}" + "}" * 70}, "guided_json"),
])
def test_bad_constraints_are_a_400_naming_the_field(server, extra, param):
    for path, body in [("/v1/chat/completions", {"messages": CHAT}),
                       ("/v1/completions", {"prompt": "hi"})]:
        status, _, out = post_json(server.http_url, path, {**body, **extra, "max_tokens": 4})
        assert status == 400, (extra, out)
        assert_error_envelope(out, param=param)


def test_text_response_format_is_unconstrained(server):
    body = {"messages": CHAT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    _, _, plain = post_json(server.http_url, "/v1/chat/completions", body)
    _, _, text = post_json(server.http_url, "/v1/chat/completions",
                           {**body, "response_format": {"type": "text"}})
    assert text["choices"][0]["message"] == plain["choices"][0]["message"]


@pytest.mark.parametrize("constraint,check", [
    ({"regex": r"[a-z]{2,6}=[0-9]"}, lambda t: re.fullmatch(r"[a-z]{2,6}=[0-9]", t)),
    ({"choice": pb.StringList(values=["one", "two words"])}, lambda t: t in ("one", "two words")),
    ({"json_schema": json.dumps(SCHEMA)},
     lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ({"grammar": 'root ::= "[" [0-9]{1,6} "]"'}, lambda t: re.fullmatch(r"\[[0-9]{1,6}\]", t)),
    ({"json_object": True}, None),  # may be cut off: checked below
])
def test_grpc_constraints(server, constraint, check):
    with channel(server.grpc_target) as ch:
        stub = pb_grpc.GenerateStub(ch)
        for seed in SEEDS:
            params = pb.SamplingParams(max_tokens=60, temperature=1.0, seed=seed, n=2,
                                       **constraint)
            out = collect(stub.Generate(pb.GenerateRequest(text="A thing:", sampling_params=params,
                                                           stream=seed % 2 == 0),
                                        timeout=DEFAULT_TIMEOUT))
            for choice in out["choices"].values():
                complete = choice["complete"]
                if check is None:
                    assert is_object_prefix(complete.text), complete.text
                    continue
                assert complete.finish_reason == "stop", (constraint, complete)
                assert check(complete.text), (constraint, complete.text)
                if seed % 2 == 0:  # streamed: the chunks add up to the same text
                    assert choice["text"] == complete.text


@pytest.mark.parametrize("constraint,fragment", [
    ({"regex": "(unclosed"}, "regex: invalid regex"),
    ({"json_schema": "{not json"}, "json_schema: invalid JSON schema"),
    ({"grammar": "root ::= nowhere"}, "grammar: invalid grammar"),
    ({"choice": pb.StringList(values=[])}, "choice: invalid choice"),
])
def test_grpc_bad_constraints_are_invalid_argument(server, constraint, fragment):
    with channel(server.grpc_target) as ch:
        stub = pb_grpc.GenerateStub(ch)
        with pytest.raises(grpc.RpcError) as error:
            collect(stub.Generate(pb.GenerateRequest(
                text="hi", sampling_params=pb.SamplingParams(max_tokens=4, **constraint)),
                timeout=DEFAULT_TIMEOUT))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in error.value.details(), error.value.details()
