"""End-to-end tests of POST /v1/responses (the OpenAI Responses API) against the real
`attnres serve` binary, through the official `openai` client: text and item input,
instructions, streaming, previous_response_id over the bounded store (and its eviction),
function tools and tool results, forced tool_choice and text.format (constrained decoding on
random weights, checked with jsonschema), and bad input. Each Responses request is checked against
the /v1/chat/completions request it amounts to: same prompt tokens, same greedy output."""

import json
import shutil
from pathlib import Path

import jsonschema
import openai
import pytest

from http_helpers import assert_error_envelope, post_json
from make_checkpoint import make_checkpoint
from server_process import ServerProcess

SERVER_ENV = {"OMP_NUM_THREADS": "1"}
QWEN3_TOKENIZER = (Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tokenizers"
                   / "qwen3")
STORE_SIZE = 3
# Greedy and never stopping early, so both sides of a comparison run the same steps.
GREEDY = {"temperature": 0}
NO_EOS = {"ignore_eos": True}

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}, "strict": True}
WEATHER_TOOL_CHAT = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items()
                                                      if k != "type"}}


def make_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="none", timeout=120,
                         max_retries=0)


@pytest.fixture(scope="module")
def server(attnres_bin):
    with ServerProcess(attnres_bin, "--max-stored-responses", str(STORE_SIZE),
                       env=SERVER_ENV) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return make_client(server)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def qwen3_server(attnres_bin, ckpt_root):
    """A tiny random-weight Qwen3 checkpoint with the real Qwen3 tokenizer and chat template
    (tools, tool calls and tool results rendered as Qwen3 renders them)."""
    with ServerProcess(attnres_bin, "--model", str(make_qwen3_checkpoint(ckpt_root)),
                       env=SERVER_ENV) as s:
        yield s


def make_qwen3_checkpoint(ckpt_root) -> Path:
    out = ckpt_root / "responses_qwen3"
    if (out / "tokenizer.json").exists():
        return out
    make_checkpoint(out, "qwen3", seed=3, vocab_size=151936)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(QWEN3_TOKENIZER / name, out / name)
    gen = json.loads((out / "generation_config.json").read_text())
    gen.update(bos_token_id=151643, eos_token_id=151645)
    (out / "generation_config.json").write_text(json.dumps(gen))
    return out


# What a trained Qwen3 writes when it calls a tool: its thinking, then a Hermes call.
SCRIPTED_CALL = ("<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n"
                 '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')


@pytest.fixture(scope="module")
def calling_server(attnres_bin, ckpt_root):
    """The Qwen3-template checkpoint made to answer with SCRIPTED_CALL (the test-only
    ATTNRES_TEST_SCRIPTED_REPLY runner sets the logits; everything after is the server's)."""
    with ServerProcess(attnres_bin, "--model", str(make_qwen3_checkpoint(ckpt_root)),
                       env={**SERVER_ENV, "ATTNRES_TEST_SCRIPTED_REPLY": SCRIPTED_CALL}) as s:
        yield s


def chat(client, model, messages, max_tokens, **extra):
    return client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                          **GREEDY, extra_body={**NO_EOS, **extra})


def respond(client, model, input, max_output_tokens=6, **kwargs):
    extra = kwargs.pop("extra_body", {})
    return client.responses.create(model=model, input=input, max_output_tokens=max_output_tokens,
                                   **GREEDY, extra_body={**NO_EOS, **extra}, **kwargs)


# ---------------------------------------------------------------- plain text

def test_text_input_matches_chat(client, model):
    r = respond(client, model, "Say something about foxes.")
    c = chat(client, model, [{"role": "user", "content": "Say something about foxes."}], 6)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == model
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert len(r.output) == 1
    item = r.output[0]
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert item.status == "incomplete"
    assert [p.type for p in item.content] == ["output_text"] and item.content[0].annotations == []
    assert r.output_text == c.choices[0].message.content
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.usage.output_tokens == 6 == c.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.input_tokens_details.cached_tokens >= 0


def test_instructions_and_item_input_match_chat(client, model):
    items = [{"role": "developer", "content": "Be terse."},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "Hello"},
                          {"type": "input_text", "text": "there"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hi."}]},
             {"role": "user", "content": "Again"}]
    r = respond(client, model, items, instructions="You are a fox.")
    c = chat(client, model, [{"role": "system", "content": "You are a fox."},
                             {"role": "system", "content": "Be terse."},
                             {"role": "user", "content": "Hello\nthere"},
                             {"role": "assistant", "content": "Hi."},
                             {"role": "user", "content": "Again"}], 6)
    assert r.instructions == "You are a fox."
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.output_text == c.choices[0].message.content


def test_echoed_fields(client, model):
    r = client.responses.create(model=model, input="x", max_output_tokens=2, temperature=0.5,
                                top_p=0.9, metadata={"k": "v"}, user="u1", store=False,
                                parallel_tool_calls=False, tools=[WEATHER_TOOL],
                                tool_choice="auto", text={"format": {"type": "text"}})
    assert r.metadata == {"k": "v"} and r.user == "u1" and r.store is False
    assert r.temperature == 0.5 and r.top_p == 0.9 and r.max_output_tokens == 2
    assert r.parallel_tool_calls is False and r.tool_choice == "auto"
    assert r.text.format.type == "text" and r.previous_response_id is None
    assert [t.name for t in r.tools] == ["get_weather"] and r.tools[0].type == "function"
    assert isinstance(r.created_at, (int, float)) and r.background is False and r.error is None


def test_stop_completes(client, model):
    # A stop string that the greedy text contains ends it early: status completed.
    full = respond(client, model, "Count.", max_output_tokens=8).output_text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), full
    r = respond(client, model, "Count.", max_output_tokens=8, extra_body={"stop": [stop]})
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output[0].status == "completed"
    assert r.output_text == full[:full.index(stop)]


# ---------------------------------------------------------------- streaming

def test_stream_events_assemble_to_the_whole_response(client, model):
    whole = respond(client, model, "Tell a story.", max_output_tokens=8)
    events = list(respond(client, model, "Tell a story.", max_output_tokens=8, stream=True))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2  # the text streams as it is generated
    text = "".join(e.delta for e in deltas)
    assert text == whole.output_text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert all(e.item_id == item_id for e in deltas)
    final = events[-1].response
    assert final.id == events[0].response.id and final.output[0].id == item_id
    assert final.output_text == text and final.usage.output_tokens == 8


def test_stream_helper(client, model):
    with client.responses.stream(model=model, input="Hello", max_output_tokens=5, temperature=0,
                                 extra_body=NO_EOS) as stream:
        events = list(stream)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    done = [e for e in events if e.type == "response.output_text.done"]
    assert len(done) == 1 and done[0].text == "".join(e.delta for e in deltas)
    assert deltas[-1].snapshot == done[0].text  # the helper's running snapshot


def test_stream_with_tools_equals_whole(client, model):
    events = list(respond(client, model, "Weather?", max_output_tokens=5, stream=True,
                          tools=[WEATHER_TOOL]))
    whole = respond(client, model, "Weather?", max_output_tokens=5, tools=[WEATHER_TOOL])
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        whole.output_text


# ---------------------------------------------------------------- previous_response_id

def test_previous_response_id_continues_the_conversation(client, model):
    first = respond(client, model, "My name is Ada.", instructions="Be kind.")
    second = respond(client, model, "What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # The first turn (but not its instructions) comes before the new input.
    c = chat(client, model, [{"role": "user", "content": "My name is Ada."},
                             {"role": "assistant", "content": first.output_text},
                             {"role": "user", "content": "What is my name?"}], 6)
    assert second.usage.input_tokens == c.usage.prompt_tokens > first.usage.input_tokens
    assert second.output_text == c.choices[0].message.content
    third = respond(client, model, "And again?", previous_response_id=second.id)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_store_false_and_eviction(client, model):
    unstored = respond(client, model, "x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError) as e:
        respond(client, model, "y", max_output_tokens=1, previous_response_id=unstored.id)
    assert e.value.body["param"] == "previous_response_id"
    first = respond(client, model, "a", max_output_tokens=1)
    # STORE_SIZE newer responses push the first out (least recently used first).
    for i in range(STORE_SIZE):
        respond(client, model, f"b{i}", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError) as e:
        respond(client, model, "c", max_output_tokens=1, previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"
    assert "evicted" in e.value.body["message"]


def test_retrieve_a_stored_response(client, model):
    r = respond(client, model, "Keep this.", metadata={"n": "1"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    unstored = respond(client, model, "x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(unstored.id)
    assert e.value.body["param"] == "response_id"


def test_streamed_response_is_stored(client, model):
    events = list(respond(client, model, "Hi", max_output_tokens=3, stream=True))
    first = events[-1].response
    second = respond(client, model, "Next", previous_response_id=first.id)
    assert second.usage.input_tokens > first.usage.input_tokens
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()


# ---------------------------------------------------------------- function tools (Qwen3 template)

def test_tools_reach_the_template(qwen3_server):
    client = make_client(qwen3_server)
    model = client.models.list().data[0].id
    r = respond(client, model, "Weather in Paris?", tools=[WEATHER_TOOL])
    c = chat(client, model, [{"role": "user", "content": "Weather in Paris?"}], 6,
             tools=[WEATHER_TOOL_CHAT])
    plain = respond(client, model, "Weather in Paris?")
    assert r.usage.input_tokens == c.usage.prompt_tokens > plain.usage.input_tokens + 20
    assert r.output_text == c.choices[0].message.content
    # tool_choice "none", as on the chat path: the template still shows the tools, and no
    # calls are parsed (the same as the chat request with tool_choice "none").
    none = respond(client, model, "Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="none")
    c_none = chat(client, model, [{"role": "user", "content": "Weather in Paris?"}], 6,
                  tools=[WEATHER_TOOL_CHAT], tool_choice="none")
    assert none.usage.input_tokens == r.usage.input_tokens == c_none.usage.prompt_tokens
    assert none.tool_choice == "none"
    assert [i.type for i in none.output if i.type == "function_call"] == []
    assert none.output_text == (c_none.choices[0].message.content or "")


def test_function_call_output_round_trips_through_the_template(qwen3_server):
    client = make_client(qwen3_server)
    model = client.models.list().data[0].id
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": json.dumps({"city": "Paris"})},
             {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}]
    r = respond(client, model, items, tools=[WEATHER_TOOL])
    c = chat(client, model, [{"role": "user", "content": "Weather in Paris?"},
                             {"role": "assistant", "content": "",
                              "tool_calls": [{"id": "call_1", "type": "function",
                                              "function": {"name": "get_weather",
                                                           "arguments": json.dumps({"city": "Paris"})}}]},
                             {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
                              "content": "Sunny, 21 C"}], 6, tools=[WEATHER_TOOL_CHAT])
    assert r.usage.input_tokens == c.usage.prompt_tokens
    assert r.output_text == c.choices[0].message.content
    # The tool result is in the prompt: a different result changes the prompt's length.
    longer = dict(items[2], output="Sunny, 21 C, light wind from the west")
    r2 = respond(client, model, items[:2] + [longer], tools=[WEATHER_TOOL])
    assert r2.usage.input_tokens > r.usage.input_tokens


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("body, param", [
    ({}, "input"),
    ({"input": 42}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools"),
    ({"input": "x", "tools": {"type": "function"}}, "tools"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "tools": [WEATHER_TOOL], "tool_choice": {"type": "file_search"}},
     "tool_choice"),
    # The demo model's template has no tool-call syntax: a call cannot be forced.
    ({"input": "x", "tools": [WEATHER_TOOL], "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tools": [WEATHER_TOOL],
      "tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {},
                                        "strict": "yes"}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {},
                                        "whitespace": " "}}}, "text.format"),
    # Schemas the constraint compiler refuses: an unknown type, a keyword it cannot enforce.
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s",
                                        "schema": {"type": "nonsense"}}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s",
                                        "schema": {"not": {"type": "string"}}}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "bogus"}}}, "text.format"),
    ({"input": "x", "text": {"format": "json_object"}}, "text.format"),
    ({"input": "x", "max_output_tokens": "ten"}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": "hot"}, "temperature"),
    ({"input": "x", "top_p": 2}, "top_p"),
    ({"input": "x", "instructions": 5}, "instructions"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"input": "x", "context_management": [{"type": "compaction"}]}, "context_management"),
    ({"input": "x", "moderation": {"model": "omni-moderation-latest"}}, "moderation"),
    ({"input": "x", "previous_response_id": 7}, "previous_response_id"),
    ({"input": "x" * 5000, "max_output_tokens": 10**6}, "input"),
])
def test_bad_input_is_a_400_naming_the_field(server, model, body, param):
    status, _, reply = post_json(server.http_url, "/v1/responses", {"model": model, **body})
    assert status == 400, reply
    assert_error_envelope(reply, param=param)


def test_bad_input_through_the_client(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")


def test_qwen3_streamed_items_equal_the_whole_response(qwen3_server):
    # The Qwen3 template thinks and has a call syntax: the answer goes through both parsers as
    # it streams, and the streamed items equal the non-streamed response's.
    client = make_client(qwen3_server)
    model = client.models.list().data[0].id
    whole = respond(client, model, "Weather in Paris?", tools=[WEATHER_TOOL])
    events = list(respond(client, model, "Weather in Paris?", tools=[WEATHER_TOOL], stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == [i.type for i in whole.output]
    assert events[-1].response.output_text == whole.output_text
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_engine_failure_is_a_failed_response(attnres_bin, stream):
    # A forward that fails after its first steps (the test-only fault injection): the stream
    # ends with response.failed carrying the error; a whole response is a 500 / 503.
    server = ServerProcess(attnres_bin, env={**SERVER_ENV, "ATTNRES_TEST_FAIL_FORWARD_AFTER": "3"})
    server.__enter__()
    try:
        client = make_client(server)
        if stream:
            events = list(client.responses.create(input="Hello", max_output_tokens=16,
                                                  temperature=0, stream=True,
                                                  extra_body=NO_EOS))
            assert events[0].type == "response.created"
            assert events[-1].type == "response.failed"
            failed = events[-1].response
            assert failed.status == "failed" and failed.error.code == "server_error"
            assert "injected forward failure" in failed.error.message
        else:
            with pytest.raises(openai.InternalServerError) as e:
                client.responses.create(input="Hello", max_output_tokens=16, temperature=0,
                                        extra_body=NO_EOS)
            assert "injected forward failure" in e.value.body["message"]
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def _mutations(rng, value, depth=0):
    """A random variant of a JSON value: a leaf replaced by a value of another type, a key
    dropped, or a list emptied, at a random place."""
    odd = [None, 0, -1, 1.5, "", "x", True, [], {}, [None], {"type": 3}]
    if depth > 4 or not isinstance(value, (dict, list)) or not value or rng.random() < 0.25:
        return rng.choice(odd)
    if isinstance(value, dict):
        out = dict(value)
        key = rng.choice(list(out))
        if rng.random() < 0.2:
            del out[key]
        else:
            out[key] = _mutations(rng, out[key], depth + 1)
        return out
    out = list(value)
    i = rng.randrange(len(out))
    out[i] = _mutations(rng, out[i], depth + 1)
    return out


def test_mutated_bodies_are_answered_or_refused_never_a_5xx(server, model):
    import random
    rng = random.Random(45)
    base = {"model": model, "instructions": "Be brief.", "max_output_tokens": 1,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                      {"type": "function_call", "call_id": "c1", "name": "get_weather",
                       "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
            "tools": [WEATHER_TOOL], "tool_choice": "auto", "text": {"format": {"type": "text"}},
            "metadata": {"k": "v"}, "store": False, "temperature": 0}
    for _ in range(150):
        body = _mutations(rng, base)
        if isinstance(body, dict):
            body["max_output_tokens"] = 1
            body["stream"] = False
        status, _, reply = post_json(server.http_url, "/v1/responses", json.dumps(body))
        assert status == 200 or 400 <= status < 500, (body, reply)
        if status != 200:
            assert_error_envelope(reply)
    assert server.health() == 200


# ---------------------------------------------------------------- a model that calls a tool

def test_a_tool_call_becomes_reasoning_and_function_call_items(calling_server):
    client = make_client(calling_server)
    model = client.models.list().data[0].id
    r = client.responses.create(model=model, input="Weather in Paris?", tools=[WEATHER_TOOL],
                                max_output_tokens=64)
    assert r.status == "completed"
    assert [i.type for i in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == "\nThe user wants the weather.\n"
    call = r.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert call.status == "completed" and r.output_text == ""
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    # Without tools the same answer is reasoning and a message holding the raw call.
    plain = client.responses.create(model=model, input="Weather in Paris?", max_output_tokens=64)
    assert [i.type for i in plain.output] == ["reasoning", "message"]
    assert plain.output_text.strip().startswith("<tool_call>")


def test_a_streamed_tool_call_assembles_to_the_whole_one(calling_server):
    client = make_client(calling_server)
    model = client.models.list().data[0].id
    kwargs = dict(model=model, input="Weather in Paris?", tools=[WEATHER_TOOL],
                  max_output_tokens=64)
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    assert events[-1].type == "response.completed"
    final = events[-1].response
    assert [i.type for i in final.output] == ["reasoning", "function_call"]
    call_index = 1
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["reasoning", "function_call"]
    assert added[1].item.name == "get_weather" and added[1].item.arguments == ""
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert arguments == done[0].arguments == final.output[call_index].arguments
    assert json.loads(arguments) == json.loads(whole.output[call_index].arguments)
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == whole.output[0].content[0].text


def test_a_tool_loop_over_previous_response_id(calling_server):
    # The Agents SDK's loop: the model calls, the client runs the tool and sends its output
    # as a function_call_output item continuing the stored response.
    client = make_client(calling_server)
    model = client.models.list().data[0].id
    first = client.responses.create(model=model, input="Weather in Paris?", tools=[WEATHER_TOOL],
                                    max_output_tokens=64)
    call = first.output[1]
    second = client.responses.create(
        model=model, previous_response_id=first.id, tools=[WEATHER_TOOL], max_output_tokens=64,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}])
    assert second.status == "completed"
    # The second prompt is the chat conversation with the call and its result in it.
    c = client.chat.completions.create(
        model=model, max_tokens=64, tools=[WEATHER_TOOL_CHAT],
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "",
                   "reasoning_content": first.output[0].content[0].text,
                   "tool_calls": [{"id": call.call_id, "type": "function",
                                   "function": {"name": call.name,
                                                "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "name": call.name,
                   "content": "Sunny"}])
    assert second.usage.input_tokens == c.usage.prompt_tokens
    assert second.usage.input_tokens > first.usage.input_tokens


@pytest.mark.parametrize("streamed", [False, True])
def test_the_openai_agents_sdk_runs_a_tool_loop(calling_server, streamed):
    # The OpenAI Agents SDK over /v1/responses: the model calls get_weather, the SDK runs it
    # and (stop_on_first_tool) returns its result as the final output.
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    client = openai.AsyncOpenAI(base_url=calling_server.http_url + "/v1", api_key="none",
                                timeout=120, max_retries=0)
    model = make_client(calling_server).models.list().data[0].id
    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                  model=OpenAIResponsesModel(model=model, openai_client=client),
                  tool_use_behavior="stop_on_first_tool")

    async def run():
        if not streamed:
            return await Runner.run(agent, "Weather in Paris?")
        result = Runner.run_streamed(agent, "Weather in Paris?")
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert calls == ["Paris"]
    assert result.final_output == "Sunny in Paris"


# ---------------------------------------------------------------- constrained decoding

# Bounded arguments, so a random model's constrained call ends within max_output_tokens.
FORECAST_TOOL = {"type": "function", "name": "get_forecast", "description": "Forecast",
                 "parameters": {"type": "object",
                                "properties": {"city": {"enum": ["Oslo", "Zürich", "東京"]},
                                               "days": {"type": "integer", "minimum": 1,
                                                        "maximum": 3}},
                                "required": ["city", "days"], "additionalProperties": False}}
CLOCK_TOOL = {"type": "function", "name": "now", "description": "The time",
              "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}
FORCED_TOOLS = {t["name"]: t for t in (FORECAST_TOOL, CLOCK_TOOL)}
IM_END = 151645
# Thinking off (the prompt closes it), so the constraint holds from the first token.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def forced(client, seed, tool_choice, **kwargs):
    return client.responses.create(
        model=client.models.list().data[0].id, input="Forecast for Oslo?", tools=[FORECAST_TOOL,
                                                                                  CLOCK_TOOL],
        tool_choice=tool_choice, parallel_tool_calls=False, max_output_tokens=80, temperature=1.0,
        extra_body={"seed": seed, **NO_THINKING}, **kwargs)


def check_call(item, names):
    assert item.type == "function_call" and item.status == "completed"
    assert item.name in names and item.call_id.startswith("call_")
    jsonschema.validate(json.loads(item.arguments), FORCED_TOOLS[item.name]["parameters"])


@pytest.mark.parametrize("tool_choice, names", [
    ("required", {"get_forecast", "now"}),
    ({"type": "function", "name": "get_forecast"}, {"get_forecast"}),
])
def test_forced_tool_choice_makes_a_valid_function_call(qwen3_server, tool_choice, names):
    client = make_client(qwen3_server)
    for seed in range(3):
        r = forced(client, seed, tool_choice)
        assert r.status == "completed", r.output
        assert [i.type for i in r.output] == ["function_call"], r.output
        check_call(r.output[0], names)
        assert r.parallel_tool_calls is False
        if isinstance(tool_choice, dict):
            assert r.tool_choice.type == "function" and r.tool_choice.name == "get_forecast"
        else:
            assert r.tool_choice == "required"
        # Streamed, the same seed makes the same call, its arguments streamed in fragments.
        events = list(forced(client, seed, tool_choice, stream=True))
        assert events[-1].type == "response.completed"
        final = events[-1].response
        assert [i.type for i in final.output] == ["function_call"]
        check_call(final.output[0], names)
        added = [e for e in events if e.type == "response.output_item.added"]
        assert [(e.item.type, e.item.name) for e in added] == [("function_call",
                                                                r.output[0].name)]
        arguments = "".join(e.delta for e in events
                            if e.type == "response.function_call_arguments.delta")
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert arguments == done[0].arguments == final.output[0].arguments
        assert arguments == r.output[0].arguments


def test_required_with_parallel_calls_makes_only_valid_calls(qwen3_server):
    # Parallel calls allowed: a bias toward the end token (which the constraint allows only
    # between calls) lets the random model stop after some calls.
    client = make_client(qwen3_server)
    for seed in range(2):
        r = client.responses.create(
            model=client.models.list().data[0].id, input="Forecast?", tools=[FORECAST_TOOL,
                                                                            CLOCK_TOOL],
            tool_choice="required", max_output_tokens=120, temperature=1.0,
            extra_body={"seed": seed, "logit_bias": {str(IM_END): 3}, **NO_THINKING})
        assert r.status == "completed", r.output
        assert r.output and all(i.type == "function_call" for i in r.output), r.output
        for item in r.output:
            check_call(item, {"get_forecast", "now"})


def test_forced_tool_choice_with_text_format_is_a_400(qwen3_server):
    client = make_client(qwen3_server)
    with pytest.raises(openai.BadRequestError) as e:
        forced(client, 0, "required", text={"format": {"type": "json_object"}})
    assert e.value.body["param"] == "tool_choice"


# A small schema whose strings are bounded, so a random model's answer ends.
THING_SCHEMA = {"type": "object",
                "properties": {"color": {"enum": ["red", "green", "blue"]},
                               "name": {"type": "string", "maxLength": 6},
                               "size": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["color", "name", "size"], "additionalProperties": False}
THING_FORMAT = {"format": {"type": "json_schema", "name": "thing", "schema": THING_SCHEMA,
                           "strict": True}}


def test_text_format_json_schema_output_validates(client, model):
    for seed in range(4):
        kwargs = dict(model=model, input="Describe a thing.", text=THING_FORMAT,
                      max_output_tokens=100, temperature=1.0, extra_body={"seed": seed})
        r = client.responses.create(**kwargs)
        # The grammar ends the answer (completed); a cut one would be incomplete, not invalid.
        assert r.status == "completed", r.output_text
        jsonschema.validate(json.loads(r.output_text), THING_SCHEMA)
        assert r.text.format.type == "json_schema" and r.text.format.name == "thing"
        assert r.text.format.schema_ == THING_SCHEMA and r.text.format.strict is True
        events = list(client.responses.create(**kwargs, stream=True))
        assert events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == events[-1].response.output_text == r.output_text


def test_text_format_json_object_output_is_an_object(client, model):
    for seed in range(3):
        r = client.responses.create(model=model, input="Any JSON.", max_output_tokens=40,
                                    temperature=1.0, text={"format": {"type": "json_object"}},
                                    extra_body={"seed": seed})
        assert r.text.format.type == "json_object"
        if r.status == "completed":
            assert isinstance(json.loads(r.output_text), dict)
        else:  # cut by max_output_tokens: the start of an object
            assert r.status == "incomplete" and r.output_text.startswith("{")


def test_text_format_matches_the_chat_response_format(client, model):
    # The same request on both routes: the same constrained tokens.
    r = client.responses.create(model=model, input="Describe a thing.", text=THING_FORMAT,
                                max_output_tokens=100, temperature=0)
    c = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Describe a thing."}], max_tokens=100,
        temperature=0, response_format={"type": "json_schema", "json_schema": {
            "name": "thing", "schema": THING_SCHEMA, "strict": True}})
    assert r.output_text == c.choices[0].message.content
    assert r.usage.output_tokens == c.usage.completion_tokens
