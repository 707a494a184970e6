"""Tool calls and reasoning end to end, with the official `openai` client against `attnres serve`
on a random-weight checkpoint that carries the real Qwen3 tokenizer and chat template (so the
server picks the hermes tool-call parser and the qwen3 reasoning parser from the template).

A random model writes no tool calls or thinking of its own. The reasoning split is checked
against the raw text of the same tokens: the chat answer (its prompt ids from return_token_ids)
is replayed through /v1/completions with the same seed, and its text must split exactly as the
parser says. Forced calls (tool_choice "required" / named) come from constrained decoding, so
the random model's calls are checked against the functions' schemas; where the test needs a
model that writes calls of its own, a scripted reply stands in for it (see below).
"""

import json
import shutil

import pytest
from openai import BadRequestError, OpenAI
from tokenizers import Tokenizer

import chat_template_reference as template_ref
from qwen3_checkpoint import CITY_TOOL as CITY
from qwen3_checkpoint import IM_END, QWEN3, make_qwen3_checkpoint
from qwen3_checkpoint import NOW_TOOL as NOW
from server_process import ServerProcess

THINK_END = 151668  # </think>

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time",
                                          "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def qwen3_model(ckpt_root):
    path = make_qwen3_checkpoint(ckpt_root / "tools_qwen3", seed=5)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def server(attnres_bin, qwen3_model):
    with ServerProcess(attnres_bin, "--model", qwen3_model, "--max-model-len", "4096") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(QWEN3 / "tokenizer.json"))


def model_name(client):
    return client.models.list().data[0].id


def test_server_picks_the_parsers_from_the_template(server):
    log = server.log()
    assert "chat answers: tool calls hermes, reasoning qwen3" in log


def test_tool_choice_errors_name_the_field(client):
    messages = [{"role": "user", "content": "hi"}]
    cases = [
        dict(tool_choice="required"),  # no tools
        dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
        dict(tools=[WEATHER], tool_choice="sometimes"),
    ]
    for extra in cases:
        with pytest.raises(BadRequestError) as e:
            client.chat.completions.create(model=model_name(client), messages=messages,
                                           max_tokens=2, **extra)
        assert e.value.body["param"] == "tool_choice", extra
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=model_name(client), messages=messages, max_tokens=2,
                                       tools=[{"type": "function", "function": {"parameters": {}}}])
    assert e.value.body["param"] == "tools"


def test_tool_result_turn_renders_as_transformers_does(client, tokenizer):
    """An assistant turn with tool_calls (arguments as the JSON string clients send back) and
    the tool's answer render exactly as transformers renders them with arguments as a dict."""
    arguments = {"city": "Zürich", "days": 2}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}
    messages = [{"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"clear\"}"}]
    r = client.chat.completions.create(model=model_name(client), messages=messages,
                                       tools=[WEATHER], max_tokens=3,
                                       extra_body={"return_token_ids": True})
    prompt_ids = r.model_extra["prompt_token_ids"]
    config = json.loads((QWEN3 / "tokenizer_config.json").read_text())
    as_dict = json.loads(json.dumps(messages))
    as_dict[1]["tool_calls"][0]["function"]["arguments"] = arguments
    status, text = template_ref.render(config["chat_template"], template_ref.apply_context(
        as_dict, True, config, tools=[WEATHER]))
    assert status == "ok", text
    assert '"arguments": {"city": "Zürich", "days": 2}}' in text
    assert "<tool_response>\n{\"sky\": \"clear\"}\n</tool_response>" in text
    assert prompt_ids == tokenizer.encode(text, add_special_tokens=False).ids


def raw_completion(client, prompt_ids, **sampling):
    r = client.completions.create(model=model_name(client), prompt=prompt_ids, **sampling)
    return r.choices[0].text


def split_reasoning(raw, starts_in_reasoning):
    """The qwen3 / deepseek_r1 split, written independently of the server's parser."""
    if raw.startswith("<think>"):
        raw, starts_in_reasoning = raw[len("<think>"):], True
    if not starts_in_reasoning:
        return None, raw or None
    reasoning, sep, content = raw.partition("</think>")
    return reasoning, (content or None) if sep else None


def stream_answer(client, **request):
    reasoning, content, finish = "", "", None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            delta = choice.delta.model_extra or {}
            assert delta.get("reasoning") == delta.get("reasoning_content")
            reasoning += delta.get("reasoning_content") or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return reasoning, content, finish


def check_reasoning_split(client, messages, starts_in_reasoning, seeds, **extra):
    # Words, spaces and </think> only, so the random model writes reasoning, the marker, then
    # content, at random places.
    allowed = [THINK_END, 9707, 1879, 0, 220, 11]  # </think> Hello world ! space ,
    raws = []
    for seed in seeds:
        sampling = dict(max_tokens=24, temperature=1.0, seed=seed)
        body = dict(model=model_name(client), messages=messages, **sampling,
                    extra_body={"allowed_token_ids": allowed, "return_token_ids": True, **extra})
        r = client.chat.completions.create(**body)
        message = r.choices[0].message.model_extra
        raw = raw_completion(client, r.model_extra["prompt_token_ids"], **sampling,
                             extra_body={"allowed_token_ids": allowed})
        raws.append(raw)
        want_reasoning, want_content = split_reasoning(raw, starts_in_reasoning)
        assert message["reasoning_content"] == want_reasoning, (seed, raw)
        assert message["reasoning"] == want_reasoning
        assert r.choices[0].message.content == want_content, (seed, raw)
        s_reasoning, s_content, _ = stream_answer(client, **body)
        assert s_reasoning == (want_reasoning or "") and s_content == (want_content or ""), seed
    # The seeds put the marker inside the answers, text on both sides.
    assert any(raw.find("</think>") > 0 and not raw.endswith("</think>") for raw in raws), raws


def test_enable_thinking_false_makes_everything_content(client):
    """The template closes thinking in the prompt: a </think> the model writes is content."""
    check_reasoning_split(client, [{"role": "user", "content": "Say hi"}],
                          starts_in_reasoning=False, seeds=range(3),
                          chat_template_kwargs={"enable_thinking": False})


def test_deepseek_r1_parser_starts_in_reasoning(attnres_bin, qwen3_model):
    with ServerProcess(attnres_bin, "--model", qwen3_model, "--reasoning-parser", "deepseek_r1",
                       "--tool-call-parser", "none") as s:
        assert "chat answers: tool calls none, reasoning deepseek_r1" in s.log()
        client = OpenAI(base_url=s.http_url + "/v1", api_key="unused", max_retries=0)
        check_reasoning_split(client, [{"role": "user", "content": "Think, then say hi"}],
                              starts_in_reasoning=True, seeds=range(4))
        # include_reasoning: false drops it, and leaves the content as it was.
        r = client.chat.completions.create(
            model=model_name(client), messages=[{"role": "user", "content": "hi"}],
            max_tokens=8, seed=1, extra_body={"include_reasoning": False})
        assert r.choices[0].message.model_extra["reasoning_content"] is None
        # Without a tool-call parser there is no call syntax to force.
        with pytest.raises(BadRequestError) as e:
            client.chat.completions.create(
                model=model_name(client), messages=[{"role": "user", "content": "hi"}],
                max_tokens=2, tools=[WEATHER], tool_choice="required")
        assert e.value.body["param"] == "tool_choice"


# ---- forced calls: tool_choice "required" / named, enforced by constrained decoding ----

def check_arguments(name, arguments):
    """The arguments against the function's schema (written out: both schemas are small)."""
    args = json.loads(arguments)
    assert isinstance(args, dict)
    if name == "get_weather":
        assert set(args) == {"city", "days"}
        assert args["city"] in ("Oslo", "Zürich", "東京") and args["days"] in (1, 2, 3)
    else:
        assert name == "now" and args == {}


@pytest.mark.parametrize("parallel", [True, False])
def test_required_tool_choice_calls_given_functions(client, parallel):
    # With parallel calls a random model would add calls until max_tokens: a bias toward the
    # end token (which the constraint allows only between calls) lets it stop.
    for seed in range(4):
        body = dict(model=model_name(client), tools=[CITY, NOW], tool_choice="required",
                    messages=[{"role": "user", "content": "Weather in Oslo for 2 days?"}],
                    max_tokens=150, temperature=1.0, seed=seed, parallel_tool_calls=parallel,
                    logit_bias={str(IM_END): 3}, extra_body=NO_THINKING)
        r = client.chat.completions.create(**body)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (seed, choice.message)
        calls = choice.message.tool_calls
        assert calls and (parallel or len(calls) == 1)
        for call in calls:
            assert call.id.startswith("call_") and call.type == "function"
            check_arguments(call.function.name, call.function.arguments)
        streamed, content, _, finish = stream_chat(client, **body)
        assert finish == "tool_calls" and content == ""
        assert [(c["name"], c["arguments"]) for c in streamed] == \
            [(c.function.name, c.function.arguments) for c in calls]


def test_named_tool_choice_calls_that_function(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model=model_name(client), tools=[CITY, NOW], n=2, seed=seed, temperature=1.0,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "Weather?"}], max_tokens=120,
            extra_body=NO_THINKING)
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls"
            assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
            check_arguments("get_weather", choice.message.tool_calls[0].function.arguments)


def test_forced_call_waits_for_the_reasoning_to_end(client):
    """With thinking on, the constraint starts after </think>: the model (allowed only
    </think> at first, by logit_bias) closes its reasoning, then must call."""
    r = client.chat.completions.create(
        model=model_name(client), tools=[NOW], tool_choice="required", seed=0, max_tokens=60,
        parallel_tool_calls=False, messages=[{"role": "user", "content": "Time?"}],
        logit_bias={str(THINK_END): 100})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    # No <think> opened it, so for Qwen3 the </think> is content, and the call follows it.
    assert choice.message.model_extra["reasoning_content"] is None
    assert choice.message.content == "</think>"
    assert [c.function.name for c in choice.message.tool_calls] == ["now"]


def test_response_format_waits_for_the_reasoning_to_end(client):
    """response_format, like a forced call, starts after </think> while thinking is open (the
    logit_bias makes the model close it first); with thinking closed in the prompt it starts at
    the first token, so the biased </think> can never be written."""
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    request = dict(model=model_name(client), seed=0, max_tokens=40,
                   logit_bias={str(THINK_END): 100},
                   messages=[{"role": "user", "content": "Yes or no?"}],
                   response_format={"type": "json_schema",
                                    "json_schema": {"name": "answer", "schema": schema}})
    text = client.chat.completions.create(**request).choices[0].message.content
    assert text.startswith("</think>"), text
    assert json.loads(text[len("</think>"):]) in ({"answer": "yes"}, {"answer": "no"})
    text = client.chat.completions.create(**request, extra_body=NO_THINKING).choices[0]
    text = text.message.content
    assert json.loads(text) in ({"answer": "yes"}, {"answer": "no"})


def test_langchain_forced_tool_loop(server):
    """LangChain's ChatOpenAI.bind_tools with tool_choice "required": the forced call, the
    tool's result sent back through the template, then the model's own answer."""
    from typing import Literal

    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: Literal["Oslo", "Paris"]) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    llm = ChatOpenAI(base_url=server.http_url + "/v1", api_key="unused", model="tools_qwen3",
                     temperature=1.0, max_tokens=60, seed=3, max_retries=0,
                     extra_body=NO_THINKING)
    messages = [HumanMessage("What is the weather in Oslo?")]
    ai = llm.bind_tools([get_weather], tool_choice="required",
                        parallel_tool_calls=False).invoke(messages)
    assert ai.tool_calls and ai.response_metadata["finish_reason"] == "tool_calls"
    messages.append(ai)
    for call in ai.tool_calls:
        assert call["name"] == "get_weather" and call["args"]["city"] in ("Oslo", "Paris")
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    answer = llm.bind_tools([get_weather]).invoke(messages)
    assert isinstance(answer.content, str) and answer.content
    assert answer.response_metadata["finish_reason"] in ("stop", "length")


# ---- the parsers over a model that writes calls: a scripted reply ----
# ATTNRES_TEST_SCRIPTED_REPLY (server/cli/scripted_reply_runner.h) makes the forward's logits
# pick this reply's tokens; sampling, detokenizing and everything after are the server's own.

SCRIPT_CALLS = [
    {"name": "get_weather", "arguments": '{"city": "Zürich", "days": 2}'},
    {"name": "now", "arguments": "{}"},
]
SCRIPT_TEXT = (
    "<think>\nThe user wants the weather ☀.\n</think>\n\nLet me check.\n"
    + "\n".join(f'<tool_call>\n{{"name": "{c["name"]}", "arguments": {c["arguments"]}}}\n</tool_call>'
                for c in SCRIPT_CALLS))
SCRIPT = SCRIPT_TEXT + "<|im_end|>"


@pytest.fixture(scope="module")
def scripted(attnres_bin, qwen3_model):
    with ServerProcess(attnres_bin, "--model", qwen3_model, "--max-model-len", "4096",
                       env={"ATTNRES_TEST_SCRIPTED_REPLY": SCRIPT}) as s:
        yield s


@pytest.fixture(scope="module")
def scripted_client(scripted):
    return OpenAI(base_url=scripted.http_url + "/v1", api_key="unused", max_retries=0)


def chat(client, **extra):
    body = dict(model=model_name(client), messages=[{"role": "user", "content": "Weather?"}],
                max_tokens=200, temperature=0.7, seed=1)
    body.update(extra)
    return body


def test_scripted_reply_is_the_raw_text_without_tools(scripted_client):
    r = scripted_client.chat.completions.create(**chat(scripted_client))
    # No tools: nothing parsed as a call, the thinking still split off.
    message = r.choices[0].message
    assert message.tool_calls is None
    assert message.model_extra["reasoning_content"] == "\nThe user wants the weather ☀.\n"
    assert message.content == SCRIPT_TEXT.split("</think>")[1]
    assert r.choices[0].finish_reason == "stop"


def test_auto_tool_calls_whole_and_streamed(scripted_client):
    body = chat(scripted_client, tools=[WEATHER, CLOCK], n=2)
    r = scripted_client.chat.completions.create(**body)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        message = choice.message
        assert message.content == "\n\nLet me check."
        assert message.model_extra["reasoning_content"] == "\nThe user wants the weather ☀.\n"
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == \
            [(c["name"], c["arguments"]) for c in SCRIPT_CALLS]
        assert all(c.id.startswith("call_") and c.type == "function" for c in message.tool_calls)
        assert len({c.id for c in message.tool_calls}) == 2
    body["n"] = 1
    calls, content, reasoning, finish = stream_chat(scripted_client, **body)
    assert finish == "tool_calls"
    assert content == "\n\nLet me check."
    assert reasoning == "\nThe user wants the weather ☀.\n"
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c["name"], c["arguments"]) for c in SCRIPT_CALLS]


def stream_chat(client, **request):
    """Assembles a stream as a client does, checking vLLM's delta protocol on the way: a call's
    first delta carries its index, id, type and name (arguments ""), later ones fragments."""
    calls, content, reasoning, finish = {}, "", "", None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            assert finish is None, "nothing after the finish reason"
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning") == extra.get("reasoning_content")
            reasoning += extra.get("reasoning_content") or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason
            for d in choice.delta.tool_calls or []:
                if d.id is not None:
                    assert d.index == len(calls) and d.type == "function"
                    assert d.function.name and d.function.arguments == ""
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                else:
                    assert d.function.name is None and d.index in calls
                    calls[d.index]["arguments"] += d.function.arguments
    return [calls[i] for i in sorted(calls)], content, reasoning, finish


def test_tool_choice_none_parses_no_calls(scripted_client):
    for stream in (False, True):
        body = chat(scripted_client, tools=[WEATHER], tool_choice="none")
        if stream:
            calls, content, _, finish = stream_chat(scripted_client, **body)
        else:
            choice = scripted_client.chat.completions.create(**body).choices[0]
            calls, content, finish = choice.message.tool_calls or [], choice.message.content, \
                choice.finish_reason
        assert calls == [] and finish == "stop"
        assert content == SCRIPT_TEXT.split("</think>")[1]


def test_parallel_tool_calls_false_keeps_the_first_call(scripted_client):
    r = scripted_client.chat.completions.create(
        **chat(scripted_client, tools=[WEATHER, CLOCK], parallel_tool_calls=False))
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    calls, _, _, finish = stream_chat(
        scripted_client, **chat(scripted_client, tools=[WEATHER, CLOCK], parallel_tool_calls=False))
    assert [c["name"] for c in calls] == ["get_weather"] and finish == "tool_calls"


def test_thinking_disabled_leaves_the_think_block_in_content(scripted_client):
    r = scripted_client.chat.completions.create(
        **chat(scripted_client, tools=[WEATHER, CLOCK], extra_body=NO_THINKING))
    message = r.choices[0].message
    assert message.model_extra["reasoning_content"] is None
    assert message.content == SCRIPT_TEXT.split("<tool_call>")[0].rstrip("\n")
    assert len(message.tool_calls) == 2



def test_langchain_tool_loop(scripted):
    """LangChain's ChatOpenAI.bind_tools runs a tool loop: the model's calls come back as
    LangChain tool calls, their results go back as ToolMessages through the template, and the
    next turn (tool_choice none) is the model's answer."""
    from typing import Literal

    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, days: int) -> str:
        """The weather in a city for some days."""
        return f"Sunny in {city} for {days} days"

    @tool
    def now() -> str:
        """The time."""
        return "12:00"

    tools = {"get_weather": get_weather, "now": now}
    llm = ChatOpenAI(base_url=scripted.http_url + "/v1", api_key="unused", model="tools_qwen3",
                     temperature=0.7, max_tokens=200, seed=3, max_retries=0)
    messages = [HumanMessage("What is the weather in Zürich?")]
    ai = llm.bind_tools(list(tools.values())).invoke(messages)
    assert [c["name"] for c in ai.tool_calls] == ["get_weather", "now"]
    assert ai.tool_calls[0]["args"] == {"city": "Zürich", "days": 2}
    assert ai.response_metadata["finish_reason"] == "tool_calls"
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(tools[call["name"]].invoke(call["args"]),
                                    tool_call_id=call["id"]))
    answer = llm.bind_tools(list(tools.values()), tool_choice="none").invoke(messages)
    assert not answer.tool_calls
    assert answer.content == SCRIPT_TEXT.split("</think>")[1]
    assert answer.response_metadata["finish_reason"] == "stop"
