"""Byte-for-byte parity of the C++ chat template engine with jinja2 as transformers uses it.

Drives tests/cpp/engine/jinja/chat_template_tool (JSON lines in/out) and compares every
rendering with jinja2 rendered the transformers way (see chat_template_reference.py).
Errors (raise_exception, undefined attributes, type errors, syntax errors) must be errors
on both sides. The tool is required: a missing build fails the test, it does not skip.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

import chat_template_cases as cases
import chat_template_reference as ref

REPO = Path(__file__).resolve().parents[2]
TOKENIZERS = REPO.parent / "shared" / "data" / "tokenizers"
BUILD_DIR = Path(os.environ.get("ATTNRES_BUILD_DIR", REPO / "build"))
TOOL = BUILD_DIR / "tests" / "cpp" / "engine" / "jinja" / "chat_template_tool"


def _model_dirs():
    dirs = []
    for d in sorted(TOKENIZERS.glob("*/")):
        cfg_path = d / "tokenizer_config.json"
        if cfg_path.exists() and json.loads(cfg_path.read_text()).get("chat_template"):
            dirs.append(d)
    return dirs


MODEL_DIRS = _model_dirs()


class Tool:
    def __init__(self):
        if not TOOL.exists():
            pytest.fail(f"{TOOL} is missing: build it (ninja chat_template_tool) or set "
                        "ATTNRES_BUILD_DIR")
        self.proc = subprocess.Popen([str(TOOL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, encoding="utf-8")

    def request(self, req):
        self.proc.stdin.write(json.dumps(req, ensure_ascii=False) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"chat_template_tool died (exit {self.proc.poll()}) on {req!r:.300}"
        reply = json.loads(line)
        return ("ok", reply["output"]) if reply["ok"] else ("error", reply["error"])

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tool():
    t = Tool()
    yield t
    t.close()


def assert_same(expected, actual, what):
    if expected[0] == "error":
        assert actual[0] == "error", f"{what}: jinja2 failed ({expected[1]}) but C++ rendered " \
                                     f"{actual[1]!r}"
        return
    assert actual[0] == "ok", f"{what}: C++ failed ({actual[1]}) but jinja2 rendered " \
                              f"{expected[1]!r}"
    assert actual[1] == expected[1], f"{what}: output differs"


def model_cases():
    out = []
    for d in MODEL_DIRS:
        for name, messages in cases.BASIC.items():
            for agp in (False, True):
                out.append(pytest.param(d, messages, agp, None, {}, id=f"{d.name}-{name}-agp{int(agp)}"))
        extra = {"qwen3": cases.QWEN3_EXTRA, "llama3.2": cases.LLAMA_EXTRA}.get(d.name, {})
        for name, (messages, tools, kwargs) in extra.items():
            for agp in (False, True):
                out.append(pytest.param(d, messages, agp, tools, kwargs,
                                        id=f"{d.name}-{name}-agp{int(agp)}"))
    return out


def test_model_dirs_found():
    names = {d.name for d in MODEL_DIRS}
    assert {"qwen3", "llama3.2", "tinyllama"} <= names, f"tokenizer dirs under {TOKENIZERS}: {names}"


@pytest.mark.parametrize("model_dir,messages,agp,tools,extra", model_cases())
def test_model_template(tool, model_dir, messages, agp, tools, extra):
    cfg_path = model_dir / "tokenizer_config.json"
    config = json.loads(cfg_path.read_text())
    if model_dir.name == "llama3.2" and "date_string" not in extra:
        extra = dict(extra, date_string="26 Jul 2024")  # strftime_now would make it time-dependent
    expected = ref.render(config["chat_template"],
                          ref.apply_context(messages, agp, config, tools, extra))
    actual = tool.request({"config_path": str(cfg_path), "messages": messages,
                           "add_generation_prompt": agp, "tools": tools, "extra": extra})
    assert_same(expected, actual, model_dir.name)


@pytest.mark.parametrize("template_name", sorted(cases.EXTRA_TEMPLATES))
@pytest.mark.parametrize("conversation", sorted(cases.BASIC) + ["system_first_assistant"])
@pytest.mark.parametrize("agp", [False, True])
def test_extra_template(tool, template_name, conversation, agp):
    source = cases.EXTRA_TEMPLATES[template_name]
    messages = cases.BASIC.get(conversation) or [{"role": "assistant", "content": "first"}]
    expected = ref.render(source, ref.apply_context(messages, agp, cases.CONFIG))
    actual = tool.request({"template": source, "config": cases.CONFIG, "messages": messages,
                           "add_generation_prompt": agp})
    assert_same(expected, actual, template_name)


def test_raise_exception_message_surfaces(tool):
    source = cases.EXTRA_TEMPLATES["gemma"]
    messages = cases.BASIC["system_multi"]
    expected = ref.render(source, ref.apply_context(messages, False, cases.CONFIG))
    actual = tool.request({"template": source, "config": cases.CONFIG, "messages": messages})
    assert expected[0] == actual[0] == "error"
    assert "System role not supported" in expected[1]
    assert "System role not supported" in actual[1]


@pytest.mark.parametrize("index", range(len(cases.EXPRESSIONS)))
def test_expression(tool, index):
    source = cases.EXPRESSIONS[index]
    expected = ref.render(source, cases.EXPR_CONTEXT)
    actual = tool.request({"template": source, "context": cases.EXPR_CONTEXT})
    assert_same(expected, actual, source)


@pytest.mark.parametrize("source", cases.SYNTAX_ERRORS)
def test_syntax_error(tool, source):
    expected = ref.render(source, {"x": 1, "y": [1]})
    assert expected[0] == "error", "case is not a jinja2 error"
    actual = tool.request({"template": source, "context": {"x": 1, "y": [1]}})
    assert actual[0] == "error"


def test_strftime_now(tool):
    source = "{{ strftime_now('%Y-%m-%d') }}"
    expected = ref.render(source, {})
    actual = tool.request({"template": source, "context": {}})
    assert actual == expected  # may flake only across midnight
