"""jinja2 rendering exactly as transformers' apply_chat_template does it.

Mirrors transformers.utils.chat_template_utils._compile_jinja_template: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols, transformers'
own `tojson` filter (json.dumps, ensure_ascii=False), and the `raise_exception` and
`strftime_now` globals. The assistant-mask `{% generation %}` extension is emulated as a
plain block.
"""
import json
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationBlock(Extension):
    # transformers' AssistantTracker, minus the mask bookkeeping: renders the body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def special_tokens(config):
    """transformers' special_tokens_map: only the tokens that are set, as strings."""
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        tok = config.get(name)
        if isinstance(tok, dict):
            tok = tok.get("content")
        if tok is not None:
            out[name] = tok
    return out


def render(source, context):
    """('ok', text) or ('error', message) — any exception counts as a template error."""
    try:
        return ("ok", compile_template(source).render(**context))
    except Exception as e:  # noqa: BLE001 - every failure mode must match "error" in C++
        return ("error", f"{type(e).__name__}: {e}")


def apply_context(messages, add_generation_prompt, config, tools=None, extra=None):
    ctx = dict(special_tokens(config))
    ctx.update(messages=messages, tools=tools, documents=None,
               add_generation_prompt=add_generation_prompt)
    ctx.update(extra or {})
    return ctx
