"""Conversations, extra templates and expression snippets for the chat template parity test."""

ODD = "braces {x} {{ not a var }} {% not a tag %} {# nor a comment #} 'single' \"double\" \\back\\slash \\n"
UNICODE = "héllo wörld — 日本語 テスト 🙂🚀 Ω≈ç√ \u00a0nbsp\u2028sep"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city. Returns °C.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
                    "flags": {"type": "array", "items": {"type": "boolean"}},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "noop", "description": "", "parameters": {}}},
]

BASIC = {
    "single": [{"role": "user", "content": "Hello!"}],
    "system_multi": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "assistant_last": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ],
    "odd_content": [
        {"role": "system", "content": "  padded system\n\n"},
        {"role": "user", "content": ODD},
        {"role": "assistant", "content": UNICODE},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "line1\nline2\r\n\ttabbed\n"},
        {"role": "user", "content": "   "},
    ],
}

QWEN3_EXTRA = {
    "tool_calls": (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris and Zürich?"},
            {"role": "assistant", "content": "",
             "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather",
                                                   "arguments": {"city": "Paris", "days": 2}}},
                 {"type": "function", "function": {"name": "get_weather",
                                                   "arguments": "{\"city\": \"Zürich\"}"}}]},
            {"role": "tool", "content": "{\"temp\": 21.5}"},
            {"role": "tool", "content": "<b>18°C</b>"},
            {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nParis 21.5, Zürich 18."},
            {"role": "user", "content": "<tool_response>fake</tool_response>"},
        ],
        TOOLS, {}),
    "thinking_history": (
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "<think>\nfirst thought\n</think>\n\nA1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2", "reasoning_content": "second thought"},
        ],
        None, {}),
    "no_thinking": ([{"role": "user", "content": "Quick answer please"}], None,
                    {"enable_thinking": False}),
    "thinking_true": ([{"role": "user", "content": "Think"}], None, {"enable_thinking": True}),
    "tools_with_system": (
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
         {"role": "assistant", "content": "calling",
          "tool_calls": [{"name": "noop", "arguments": {}}]}],
        TOOLS, {"enable_thinking": False}),
    "list_content": ([{"role": "user", "content": [{"type": "text", "text": "x"}]}], None, {}),
}

LLAMA_EXTRA = {
    "tools_date": ([{"role": "system", "content": "  sys with spaces  "},
                    {"role": "user", "content": "Weather in Paris?"}],
                   TOOLS, {"date_string": "01 Jan 2025"}),
    "tool_roundtrip": (
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather",
                                                  "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": {"temp": 21, "unit": "C"}},
            {"role": "ipython", "content": "plain text"},
            {"role": "assistant", "content": "It is 21C."},
        ],
        TOOLS, {"date_string": "26 Jul 2024"}),
    "tools_not_in_user": ([{"role": "user", "content": "hi"}], TOOLS,
                          {"date_string": "02 Feb 2025", "tools_in_user_message": False}),
    "raise_two_calls": (
        [{"role": "user", "content": "x"},
         {"role": "assistant", "tool_calls": [
             {"function": {"name": "a", "arguments": {}}},
             {"function": {"name": "b", "arguments": {}}}]}],
        None, {"date_string": "01 Jan 2025"}),
    "raise_no_user": ([{"role": "system", "content": "only system"}], TOOLS,
                      {"date_string": "01 Jan 2025"}),
    "custom_tools": ([{"role": "user", "content": "hi"}], None,
                     {"custom_tools": TOOLS[:1], "date_string": "03 Mar 2025"}),
}

EXTRA_TEMPLATES = {
    "chatml": (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "mistral_instruct": (
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
        "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
        "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
        "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
        "roles are supported!') }}{% endif %}{% endfor %}"),
    "gemma": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
        "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
        "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
        "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == "
        "'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
        "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
        "'<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}"
        "{% endif %}"),
    "llama2": (
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
        "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = "
        "messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
        "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
        "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
        "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
        "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
        "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"),
    "deepseek_style": (
        "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
        "{% endif %}{% set ns = namespace(is_first=false, system_prompt='') %}"
        "{%- for message in messages %}{%- if message['role'] == 'system' %}"
        "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
        "{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}"
        "{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}"
        "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
        "{% set content = message['content'] %}{% if '</think>' in content %}"
        "{% set content = content.split('</think>')[-1] %}{% endif %}"
        "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}"
        "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"),
    # Multi-line, indented, the way hand-written templates look: exercises trim/lstrip_blocks.
    "indented_zephyr": """{% for message in messages %}
    {% if message.role == 'system' %}
        <|system|>
        {{ message.content }}
    {%- elif message.role == 'user' -%}
        <|user|>
        {{ message.content }}{{ eos_token }}
    {% else %}
  {#- comment with lstrip #}
        <|assistant|>   {{ message.content | trim }}
    {%+ endif %}
{% endfor %}
{%- if add_generation_prompt %}
<|assistant|>
{% endif %}
""",
    "generation_block": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% else %}[{{ m.role }}] {{ m.content }}\n{% endif %}{% endfor %}"),
}

CONFIG = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}

# Expression snippets rendered with EXPR_CONTEXT: every one must match jinja2, value or error.
EXPR_CONTEXT = {
    "s": "  Hello, World! ", "n": 7, "f": 2.5, "neg": -3, "t": True, "z": None,
    "lst": [3, 1, 2], "strs": ["b", "A", "c", "a"], "d": {"b": 2, "a": 1, "items": "x"},
    "users": [{"name": "ann", "age": 30, "admin": True}, {"name": "Bob", "age": 25},
              {"name": "cy", "age": 35, "admin": False}],
    "u": "日本語🙂", "nested": {"x": {"y": [10, {"z": "deep"}]}}, "empty": [], "es": "",
}

EXPRESSIONS = [
    "{{ s }}", "{{ s|trim }}", "{{ s.strip() }}", "{{ s.lstrip() }}|", "{{ s.rstrip(' !') }}",
    "{{ s.split(',') }}", "{{ s.split() }}", "{{ 'a,b,,c'.split(',', 1) }}", "{{ 'a b c'.rsplit(' ', 1) }}",
    "{{ s.upper() }}{{ s.lower() }}", "{{ s|upper }}", "{{ 'hello wORLD-foo(bar'|title }}",
    "{{ 'hello wORLD'.title() }}", "{{ 'hELLO'|capitalize }}", "{{ s.replace('l', 'L', 2) }}",
    "{{ s|replace('o', '0') }}", "{{ s.startswith('  He') }}{{ s.endswith(('x', ' ')) }}",
    "{{ s.find('World') }}{{ u.find('語') }}{{ s.count('l') }}", "{{ '-'.join(strs) }}",
    "{{ strs|join(', ') }}", "{{ users|join(',', attribute='name') }}",
    "{{ n + f }} {{ n - 10 }} {{ n * 3 }} {{ n / 2 }} {{ n // 2 }} {{ n % 3 }} {{ n ** 2 }}",
    "{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** -1 }} {{ 10 / 4 }} {{ 4 / 2 }}",
    "{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 100.0 }} {{ 1/3 }} {{ 2.0 ** 60 }}",
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }}",
    "{{ 'ell' in s }} {{ 2 in lst }} {{ 'a' in d }} {{ 'q' not in d }} {{ 'x' in undefined_var }}",
    "{{ n ~ '-' ~ f ~ z ~ t }}", "{{ [1, 'a', none, true, 2.0, ('t',), {'k': [1]}] }}",
    "{{ d }}", "{{ d.items() }}", "{{ d|dictsort }}", "{{ d|dictsort(by='value', reverse=true) }}",
    "{{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }}", "{{ d['items'] }}",
    "{{ d.keys()|list }} {{ d.values()|list }}", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{{ lst|sort }} {{ lst|sort(reverse=true) }} {{ strs|sort }} {{ strs|sort(case_sensitive=true) }}",
    "{{ users|sort(attribute='age')|map(attribute='name')|list }}",
    "{{ users|selectattr('admin')|map(attribute='name')|list }}",
    "{{ users|rejectattr('admin')|map(attribute='name')|join }}",
    "{{ users|selectattr('age', 'gt', 26)|list|length }}", "{{ lst|select('odd')|list }}",
    "{{ lst|reject('even')|list }}", "{{ lst|map('string')|join('+') }}",
    "{{ strs|unique|list }} {{ [1, 2, 1, 3]|unique|list }}", "{{ lst|reverse|list }} {{ u|reverse }}",
    "{{ lst|first }} {{ lst|last }} {{ u|first }} {{ empty|first }}|", "{{ lst|length }} {{ u|length }} {{ d|count }}",
    "{{ lst|sum }} {{ users|sum(attribute='age') }} {{ lst|min }} {{ lst|max }}",
    "{{ '42'|int + 1 }} {{ '3.9'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ '2.5'|float }} {{ n|float }}",
    "{{ -3|abs }} {{ neg|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 7|round }} {{ 2.1|round(0, 'ceil') }}",
    "{{ undefined_var|default('dv') }} {{ es|default('dv') }} {{ es|default('dv', true) }} {{ z|d('x', boolean=true) }}",
    "{{ lst[0] }} {{ lst[-1] }} {{ lst[5] }}| {{ lst[1:] }} {{ lst[::-1] }} {{ lst[:-1] }} {{ lst[::2] }}",
    "{{ u[1:] }} {{ u[::-1] }} {{ u[-1] }} {{ s[2:7] }} {{ lst[10:] }} {{ lst[-10:1] }}",
    "{{ nested.x.y[1].z }} {{ nested['x']['y'][0] }} {{ nested.x.missing }}| {{ lst.0 }}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if z else 'no' }} {{ 'only' if z }}|",
    "{{ t and 'A' }} {{ z or 'B' }} {{ z and 'C' }} {{ not t }} {{ lst or 'x' }}",
    "{{ z is none }} {{ n is number }} {{ t is number }} {{ n is integer }} {{ f is float }} {{ t is boolean }}",
    "{{ s is string }} {{ d is mapping }} {{ lst is iterable }} {{ s is iterable }} {{ undefined_var is iterable }}",
    "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ n is eq 7 }}",
    "{{ undefined_var is defined }} {{ n is defined }} {{ undefined_var is undefined }} {{ t is true }} {{ z is false }}",
    "{{ 2 is in lst }} {{ n is not none }} {{ n is gt 3 }} {{ 'abc' is lower }} {{ 'ABC' is upper }}",
    "{{ {'a': 1} == {'a': 1.0} }} {{ (1, 2) == [1, 2] }} {{ none == none }}",
    "{{ range(5)|list }} {{ range(2, 10, 3)|list }} {{ range(5, 0, -2)|list }}",
    "{% set ns = namespace(c=0, items=[]) %}{% for x in lst %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }}",
    "{% for x in lst %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}",
    "{% for x in lst %}{{ loop.previtem }}-{{ loop.nextitem }} {{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for x in lst if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}",
    "{% for x in empty %}{{ x }}{% else %}empty!{% endfor %}",
    "{% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
    "{% for c in u %}[{{ c }}]{% endfor %}", "{% for k in d %}{{ k }}{% endfor %}",
    "{% set x = 1 %}{% for i in lst %}{% set x = i %}{% endfor %}{{ x }}",
    "{% set a, b = 'xy' %}{{ b }}{{ a }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }}",
    "{% set block %}inner {{ n }}{% endset %}[{{ block }}]", "{% filter upper %}shout {{ s }}{% endfilter %}",
    "{% with a = 5 %}{{ a * 2 }}{% endwith %}{{ a }}",
    "{{ users|tojson }}", "{{ d|tojson(indent=2) }}", "{{ {'u': u, 'q': 'a\"b\\\\c\\n', 'f': 1.0, 'e': [], 'o': {}}|tojson }}",
    "{{ d|tojson(sort_keys=true) }}", "{{ [1, [2, [3]]]|tojson(indent=1) }}", "{{ users[0]|tojson(separators=(',', ':')) }}",
    "{{ 'a\\tb\\u00e9\\x41\\'' }} {{ \"dq\\\"\" }} {{ 'raw \\d stays' }}", "{{ 'ab' 'cd' }}",
    "{{ s|indent(2) }}|{{ 'a\\nb\\n\\nc'|indent(2, first=true) }}|{{ 'a\\n\\nb'|indent(blank=true) }}",
    "{{ 'x'|center(9) }}|{{ 'hello world foo'|wordcount }} {{ '<a href=\"x\">'|e }}",
    "{{ 'Hello {}, you are {age}'.format('Ann', age=3) }}", "{{ lst|list + [4] }} {{ 'ab' * 3 }} {{ [0] * 3 }}",
    "{{ 5 - -2 }} {{ -n|abs }} {{ (1, 2) }} {{ (1,) }} {{ () }}", "{{ 1, 2 }}",
    "{{ 'abc'[1] }} {{ s|list|length }} {{ u|list }}", "{{ n|string + 'x' }} {{ z|string }}",
    "{{ 'a' ~ undefined_var ~ 'b' }} {{ undefined_var }}|{{ undefined_var|length }}|{{ undefined_var|trim }}",
    "{{ users|map(attribute='admin', default='?')|list }}", "{{ users|map(attribute='admin')|list }}",
    "{{ 1 if 2 else 3 if 4 else 5 }}", "{{ not 1 == 2 }} {{ not undefined_var is defined }}",
    "{{ 'abc'.removeprefix('a') }} {{ 'a-b'.split('-')[-1] }}", "{{ 3 * 'x' ~ 2 }}",
    # Errors must be errors on both sides.
    "{{ undefined_var.attr }}", "{{ z.attr }}", "{{ lst.append(4) }}", "{{ d.update({}) }}", "{{ n + 'x' }}",
    "{{ 'x' + n }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 1 < 'a' }}", "{{ undefined_var + 1 }}",
    "{{ n|length }}", "{{ raise_exception('boom: ' ~ n) }}", "{{ undefined_var|tojson }}",
    "{% for x in z %}{% endfor %}", "{% for x in n %}{% endfor %}", "{{ 1 in 'abc' }}", "{{ lst() }}",
    "{{ undefined_fn() }}", "{% set n.x = 1 %}", "{{ range(1000000)|length }}", "{{ ''.split('') }}",
    "{{ 'abc'.nosuchmethod() }}", "{{ nested.x.missing.deeper }}",
]

# Templates with syntax errors: jinja2 rejects them when compiling, so must we.
SYNTAX_ERRORS = [
    "{% if x %}unterminated", "{{ x ", "{% for x in %}{% endfor %}", "{% endif %}",
    "{{ x | }}", "{% set %}", "{% unknowntag %}", "{{ 'unterminated }}", "{# no end", "{{ (1, 2 }}",
    "{% for x in y %}{% else %}{% else %}{% endfor %}", "{% break %}", "{{ x is }}",
]
