"""Every request field the OpenAI API, vLLM or llama.cpp's server implements is honoured or
refused (shared/design/API.md), against the real `attnres serve` with the built-in demo model:
refused fields give a 400 naming them (and their do-nothing defaults pass); vLLM's bad_words,
include_stop_str_in_output, truncate_prompt_tokens, prompt_logprobs, continue_final_message,
per-request chat_template and stream_options rules change the output as vLLM's do; and
GET /v1/models/{id} and GET /version answer."""

import json
import re
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from http_helpers import assert_error_envelope, parse_sse, post_json, request
from server_process import ServerProcess

PROMPT = "The quick brown fox jumps over the lazy dog because"
CHAT = [{"role": "user", "content": "Tell me about foxes."}]


@pytest.fixture(scope="module")
def server(attnres_bin):
    with ServerProcess(attnres_bin, "--max-num-seqs", "16") as s:
        yield s


@pytest.fixture(scope="module")
def tok(repo_root) -> Tokenizer:
    return Tokenizer.from_file(str(Path(repo_root) / "engine/model/assets/gpt2/tokenizer.json"))


def completion(server, **body):
    status, _, r = post_json(server.http_url, "/v1/completions",
                             {"prompt": PROMPT, "max_tokens": 12, **body})
    assert status == 200, r
    return r


def refused(server, path, body, field):
    status, _, r = post_json(server.http_url, path, body)
    assert status == 400, (field, r)
    message = assert_error_envelope(r, param=field)
    assert field in message
    return message


def contains(ids, sub):
    return any(ids[i:i + len(sub)] == sub for i in range(len(ids) - len(sub) + 1))


# ---------------------------------------------------------------- refused fields

COMPLETION_REFUSED = [
    ("suffix", "and then"), ("use_beam_search", True), ("best_of", 3),
    ("structural_tag", {"type": "structural_tag"}), ("guided_whitespace_pattern", " "),
    ("logits_processors", ["x"]),
    ("priority", 5), ("n_predict", 8), ("mirostat", 2),
    ("logprob_token_ids", [1, 2]), ("cache_salt", "salt"),
]
CHAT_REFUSED = [
    ("reasoning_effort", "high"), ("echo", True),
    ("functions", [{"name": "f", "parameters": {}}]), ("function_call", "auto"),
    ("audio", {"voice": "alloy", "format": "wav"}), ("web_search_options", {}),
]


@pytest.mark.parametrize("field,value", COMPLETION_REFUSED)
def test_completions_refuse_field(server, field, value):
    refused(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, field: value}, field)


@pytest.mark.parametrize("field,value", CHAT_REFUSED)
def test_chat_refuses_field(server, field, value):
    refused(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, field: value},
            field)


def test_tool_choice_that_forces_a_call_needs_a_tool_call_parser(server):
    # The demo model's template has no tool-call syntax, so a forced call cannot be written.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        refused(server, "/v1/chat/completions",
                {"messages": CHAT, "max_tokens": 2, "tools": tools, "tool_choice": choice},
                "tool_choice")


def test_refusals_through_the_openai_client(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, suffix="!")
    assert e.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=2,
                                       reasoning_effort="high")
    assert e.value.body["param"] == "reasoning_effort"


def test_defaults_that_ask_for_nothing_pass(server, client, model_name):
    # What vLLM-style clients send when they fill in every default.
    r = completion(server, n=2, best_of=2, use_beam_search=False, response_format={"type": "text"},
                   priority=0, length_penalty=1.0, user="u", n_predict=-1, typical_p=1.0,
                   metadata={"k": "v"}, store=False, ignore_eos=True)
    assert len(r["choices"]) == 2
    out = client.chat.completions.create(
        model=model_name, messages=CHAT, max_tokens=2, parallel_tool_calls=True,
        extra_body={"tool_choice": "none", "include_reasoning": True, "echo": False,
                    "modalities": ["text"], "service_tier": "auto"})
    assert out.choices[0].message.role == "assistant"


def test_stream_options_need_stream(server):
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": CHAT})):
        refused(server, path, {**body, "max_tokens": 2, "stream_options": {"include_usage": True}},
                "stream_options")
        # An empty object asks for nothing (vLLM lets it through).
        status, _, _ = post_json(server.http_url, path, {**body, "max_tokens": 2,
                                                         "stream_options": {}})
        assert status == 200


def test_continuous_usage_stats_puts_usage_in_every_chunk(server):
    status, _, raw = request(server.http_url, "POST", "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert status == 200
    events = [json.loads(e) for e in parse_sse(raw)[:-1]]
    token_chunks = [e for e in events if e["choices"]]
    assert token_chunks and all("usage" in e for e in token_chunks)
    counts = [e["usage"]["completion_tokens"] for e in token_chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6


# ---------------------------------------------------------------- bad_words

def banned_sequences(tok, word):
    """vLLM's tokenization of a bad word (SamplingParams.update_from_tokenizer): the word with
    leading spaces dropped, plus the spelling with one leading space when that starts with a
    different token and has as many tokens (the word in the middle of text)."""
    plain = tok.encode(word.lstrip(), add_special_tokens=False).ids
    spaced = tok.encode(" " + word.lstrip(), add_special_tokens=False).ids
    return [plain] + ([spaced] if spaced[0] != plain[0] and len(spaced) == len(plain) else [])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bad_words_never_appear(server, tok, temperature):
    checked = 0
    for seed in range(4):
        body = {"prompt": f"{PROMPT} {seed}", "max_tokens": 16, "ignore_eos": True,
                "temperature": temperature, "seed": seed, "return_token_ids": True}
        free = completion(server, **body)["choices"][0]["token_ids"]
        # Ban the words of the first generated token and of two tokens from the middle.
        words = [w for w in (tok.decode([free[0]]).strip(), tok.decode(free[5:7]).strip()) if w]
        banned = [b for w in words for b in banned_sequences(tok, w)]
        if not any(contains(free, b) for b in banned):
            continue  # a word that tokenizes differently in context: nothing to check
        out = completion(server, bad_words=words, **body)["choices"][0]["token_ids"]
        assert out != free
        for b in banned:
            assert not contains(out, b), (words, b, out)
        checked += 1
    assert checked >= 2


def test_bad_words_bad_input(server):
    for value in ("word", [""], ["ok", 3]):
        refused(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "bad_words": value},
                "bad_words")


# ---------------------------------------------------------------- include_stop_str_in_output

@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_include_stop_str_in_output(server, path):
    base = {"max_tokens": 20, "ignore_eos": True, "temperature": 0}
    base.update({"prompt": PROMPT} if path == "/v1/completions" else {"messages": CHAT})

    def text(r):
        c = r["choices"][0]
        return c["text"] if "text" in c else c["message"]["content"]

    def streamed_text(body):
        status, _, raw = request(server.http_url, "POST", path, {**body, "stream": True})
        assert status == 200
        out = ""
        for e in parse_sse(raw)[:-1]:
            for c in json.loads(e)["choices"]:
                out += c.get("text") or c.get("delta", {}).get("content") or ""
        return out

    status, _, r = post_json(server.http_url, path, base)
    full = text(r)
    # Three ASCII letters from the middle of the text as the stop string.
    starts = [m.start() for m in re.finditer(r"[A-Za-z]{3}", full)]
    assert starts, full
    stop = full[starts[len(starts) // 2]:starts[len(starts) // 2] + 3]
    at = full.find(stop)
    for include, want in ((False, full[:at]), (True, full[:at + len(stop)])):
        body = {**base, "stop": [stop], "include_stop_str_in_output": include}
        status, _, r = post_json(server.http_url, path, body)
        assert status == 200
        assert text(r) == want and r["choices"][0]["finish_reason"] == "stop"
        assert r["choices"][0]["stop_reason"] == stop
        assert streamed_text(body) == want


# ---------------------------------------------------------------- truncate_prompt_tokens

def test_truncate_prompt_tokens(server, tok):
    ids = tok.encode(PROMPT, add_special_tokens=False).ids
    assert len(ids) > 6
    greedy = {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    for side, kept in (("left", ids[-4:]), ("right", ids[:4]), (None, ids[-4:])):
        extra = {"truncation_side": side} if side else {}
        r = completion(server, truncate_prompt_tokens=4, **greedy, **extra)
        assert r["usage"]["prompt_tokens"] == 4
        assert r["choices"][0]["prompt_token_ids"] == kept
        direct = completion(server, **{**greedy, "prompt": kept})
        assert r["choices"][0]["token_ids"] == direct["choices"][0]["token_ids"]
    # -1: as many as fit, which is all of this prompt.
    assert completion(server, truncate_prompt_tokens=-1, **greedy)["usage"]["prompt_tokens"] == \
        len(ids)
    status, _, r = post_json(server.http_url, "/v1/chat/completions",
                             {"messages": CHAT, "max_tokens": 2, "truncate_prompt_tokens": 3})
    assert status == 200 and r["usage"]["prompt_tokens"] == 3
    refused(server, "/v1/completions",
            {"prompt": PROMPT, "max_tokens": 2, "truncate_prompt_tokens": 10 ** 9},
            "truncate_prompt_tokens")
    refused(server, "/v1/completions",
            {"prompt": PROMPT, "max_tokens": 2, "truncate_prompt_tokens": 2,
             "truncation_side": "middle"}, "truncation_side")


# ---------------------------------------------------------------- prompt_logprobs

def test_prompt_logprobs_match_echo_logprobs(server, tok):
    ids = tok.encode(PROMPT, add_special_tokens=False).ids
    r = completion(server, prompt_logprobs=2, max_tokens=2, temperature=0)
    plp = r["choices"][0]["prompt_logprobs"]
    echo = completion(server, echo=True, logprobs=2, max_tokens=2, temperature=0)
    elp = echo["choices"][0]["logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for i in range(1, len(ids)):
        entry = plp[i]  # the prompt's own token and the top 2, by id
        assert 2 <= len(entry) <= 3
        own = entry[str(ids[i])]
        assert own["logprob"] == pytest.approx(elp["token_logprobs"][i], abs=1e-5)
        assert own["decoded_token"] == tok.decode([ids[i]])
        assert own["rank"] >= 1
        assert {1, 2} <= {v["rank"] for v in entry.values()}
        best = sorted(elp["top_logprobs"][i].values(), reverse=True)[:2]
        assert sorted((v["logprob"] for v in entry.values()), reverse=True)[:2] == \
            pytest.approx(best, abs=1e-5)
    # Chat: beside the choices, one entry per prompt token.
    status, _, c = post_json(server.http_url, "/v1/chat/completions",
                             {"messages": CHAT, "max_tokens": 2, "prompt_logprobs": 0})
    assert status == 200
    assert len(c["prompt_logprobs"]) == c["usage"]["prompt_tokens"]
    assert c["prompt_logprobs"][0] is None and all(len(e) == 1 for e in c["prompt_logprobs"][1:])
    refused(server, "/v1/completions",
            {"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": 1, "stream": True},
            "prompt_logprobs")
    refused(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "prompt_logprobs": -1},
            "prompt_logprobs")


# ---------------------------------------------------------------- chat prompt options

def tokenize(server, body):
    status, _, r = post_json(server.http_url, "/tokenize", body)
    assert status == 200, r
    return r["tokens"]


def test_continue_final_message(server, tok):
    messages = CHAT + [{"role": "assistant", "content": "Foxes are"}]
    ids = tokenize(server, {"messages": messages, "continue_final_message": True,
                            "add_generation_prompt": False})
    assert tok.decode(ids).endswith("Foxes are")
    closed = tokenize(server, {"messages": messages, "add_generation_prompt": False})
    assert len(closed) > len(ids) and tok.decode(closed).startswith(tok.decode(ids))
    status, _, r = post_json(server.http_url, "/v1/chat/completions",
                             {"messages": messages, "continue_final_message": True,
                              "max_tokens": 3, "return_token_ids": True})
    assert status == 200 and r["prompt_token_ids"] == ids
    refused(server, "/v1/chat/completions",
            {"messages": messages, "continue_final_message": True, "add_generation_prompt": True,
             "max_tokens": 2}, "continue_final_message")


def test_request_chat_template(server, tok):
    template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                "{% for d in documents or [] %}[{{ d.title }}]{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}")
    docs = [{"title": "Vulpes", "text": "..."}]
    want = "<user>Tell me about foxes.[Vulpes]<assistant>"
    ids = tokenize(server, {"messages": CHAT, "chat_template": template, "documents": docs})
    assert tok.decode(ids) == want
    status, _, r = post_json(server.http_url, "/v1/chat/completions",
                             {"messages": CHAT, "chat_template": template, "documents": docs,
                              "max_tokens": 2, "return_token_ids": True})
    assert status == 200 and r["prompt_token_ids"] == tok.encode(want).ids
    message = refused(server, "/v1/chat/completions",
                      {"messages": CHAT, "chat_template": "{% for m in messages %}",
                       "max_tokens": 2}, "chat_template")
    assert "chat_template" in message


# ---------------------------------------------------------------- small routes

def test_model_by_id(server, client, model_name):
    m = client.models.retrieve(model_name)
    assert m.id == model_name and m.object == "model" and m.owned_by == "attnres"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such/model")
    assert e.value.body["code"] == "model_not_found"
    assert "no-such/model" in e.value.body["message"]  # the %2F the client sent, decoded


def test_version(server, repo_root):
    status, _, body = request(server.http_url, "GET", "/version")
    assert status == 200
    version = re.search(r"project\(attnres VERSION ([0-9.]+)",
                        (Path(repo_root) / "CMakeLists.txt").read_text()).group(1)
    assert json.loads(body) == {"version": version}
