#!/usr/bin/env python3
"""Writes tests/fixtures/jinja/cases.json: chat templates (written here for
the test, using the constructs Hugging Face chat templates use) with the
text transformers renders for them, through the same Jinja environment
apply_chat_template uses (transformers.utils.chat_template_utils:
trim_blocks, lstrip_blocks, its tojson, raise_exception). tests/test_jinja.cpp
renders each with qkv's interpreter and compares; cases whose rendering
raises record the message.

Usage: python3 scripts/make_jinja_fixtures.py [--out tests/fixtures/jinja]
Needs: transformers, jinja2 (pip install transformers).
"""
import argparse
import json
import os

from transformers.utils.chat_template_utils import _compile_jinja_template

CHAT = [
    {"role": "system", "content": "  You are terse.\n"},
    {"role": "user", "content": "我是中国人"},
    {"role": "assistant", "content": "私は中国人です "},
    {"role": "user", "content": "And\n  in English?"},
]
NO_SYSTEM = CHAT[1:]
BAD_ORDER = [CHAT[1], CHAT[1]]
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "The time in a city.",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "enum": ["東京", "Paris"]}},
                                               "required": ["city"]}}}]

TEMPLATES = {
    # <|im_start|> turns, a default system message, the generation prompt.
    "turns": (
        "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
        "{%- set rest = messages[1:] %}{%- else %}{%- set system = 'Default system.' %}{%- set rest = messages %}"
        "{%- endif %}\n"
        "<|im_start|>system\n{{ system | trim }}<|im_end|>\n"
        "{% for m in rest %}\n"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # [INST] pairs: the system text folded into the first user turn, roles
    # checked to alternate, stripped contents, bos and eos tokens.
    "inst": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
        "{% set loop_messages = messages[1:] %}{% set sys = messages[0]['content'].strip() %}"
        "{% else %}{% set loop_messages = messages %}{% set sys = false %}{% endif %}"
        "{% for message in loop_messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if loop.index0 == 0 and sys %}{% set content = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + "
        "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
        "{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
        "{% endfor %}"),
    # Roles renamed with a conditional expression, "model" turns, trim.
    "renamed": (
        "{{ bos_token }}{% for message in messages %}"
        "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{% if role == 'system' %}{% continue %}{% endif %}"
        "{{ '<start_of_turn>' ~ role ~ '\n' ~ (message['content'] | trim) ~ '<end_of_turn>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"),
    # A namespace set inside a loop, selectattr, counting, loop.last.
    "namespace": (
        "{%- set ns = namespace(system='', turns=0) -%}\n"
        "{%- for m in messages -%}\n"
        "  {%- if m.role == 'system' -%}{%- set ns.system = ns.system ~ m.content -%}\n"
        "  {%- else -%}{%- set ns.turns = ns.turns + 1 -%}{%- endif -%}\n"
        "{%- endfor -%}\n"
        "system={{ ns.system | trim | tojson }} turns={{ ns.turns }} "
        "users={{ messages | selectattr('role', 'equalto', 'user') | list | length }} "
        "others={{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | join(',') }}\n"
        "{%- for m in messages if m.role != 'system' %}\n"
        "[{{ loop.index }}/{{ loop.length }}{{ ' last' if loop.last }}] {{ m.content | length }}\n"
        "{%- endfor %}"),
    # Tools as JSON (indented and not), dict iteration, items.
    "tools": (
        "{%- if tools is defined and tools %}# Tools\n"
        "{% for t in tools %}{{ t | tojson }}\n{{ t.function | tojson(indent=2) }}\n{% endfor %}"
        "{% for key, value in tools[0].function.parameters.properties.city.items() %}{{ key }}={{ value }};"
        "{% endfor %}\n"
        "{% for k in tools[0].function %}{{ k }} {% endfor %}\n"
        "{% for pair in tools[0]['function'] | items %}{{ pair[0] }}:{{ pair[1] is string }} {% endfor %}\n"
        "{%- else %}no tools{% endif %}"),
    # Whitespace: trim_blocks, lstrip_blocks, "-" and "+" markers, comments.
    "whitespace": (
        "a\n"
        "    {% if true %}\n"
        "    b\n"
        "    {% endif %}\n"
        "  {# a comment #}\n"
        "c  {{- ' d ' -}}  e\n"
        "\t{%+ if true %}f{% endif %}\n"
        "{%- for x in [1, 2, 3] %}\n"
        "  x{{ x }}\n"
        "{%- endfor %}\n"
        "{{ 'g' }}\n"
        "\n"
        "{% set block %}  inside {{ 1 + 1 }}  {% endset %}[{{ block }}]"),
    # Macros with defaults, called with positional and named arguments.
    "macros": (
        "{% macro turn(role, text, close='<end>') %}<{{ role }}>{{ text }}{{ close }}{% endmacro %}"
        "{% for m in messages %}{{ turn(m.role, m.content | trim) }}{% endfor %}"
        "{{ turn('x', 'y', close='!') }}{{ turn(text='t', role='r') }}"),
    # Strings, numbers and lists: methods, filters, arithmetic, tests, printing.
    "values": (
        "{{ 'Hello World'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'abc'.upper() }}\n"
        "{{ 'a,b,,c'.split(',') }} {{ ' x  y '.split() }} {{ 'path/to'.replace('/', '.') }}\n"
        "{{ 'prefix-body'.startswith('pre') }} {{ 'body.txt'.endswith(('.md', '.txt')) }} {{ '--x--'.strip('-') }}\n"
        "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2.5 }} {{ 'ab' * 3 }}\n"
        "{{ 0.1 }} {{ 1.0 }} {{ 2.5e-7 }} {{ 1e16 }} {{ 3 }} {{ -4 }} {{ none }} {{ true }} {{ false }}\n"
        "{{ [1, 'two', none, true, 2.0] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }}\n"
        "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1, 2] }}\n"
        "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ none is none }} {{ 'x' is string }}"
        " {{ {} is mapping }} {{ 1.5 is number }} {{ undefined_name is defined }} {{ x is not defined }}\n"
        "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ [1, 2, 1, 3] | unique | list }}"
        " {{ [1, 2, 3] | reverse | list }} {{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }}"
        " {{ 'abc' | reverse }} {{ [1, 2, 3] | join('-') }}\n"
        "{{ undefined_name | default('fallback') }} {{ '' | default('empty', true) }} {{ '12' | int + 1 }}"
        " {{ 3 | float }} {{ 'MiXeD' | lower }} {{ 'x' | upper }} {{ 5 | string ~ '!' }}\n"
        "{{ [1, 2, 3, 4, 5][1:3] }} {{ [1, 2, 3, 4, 5][::-1] }} {{ [1, 2, 3, 4, 5][-2:] }} {{ 'hello'[1:-1] }}"
        " {{ 'hello'[0] }} {{ [1, 2][-1] }} {{ [1, 2, 3][none::-1] }} {{ [1, 2, 3][5:-9:-1] }}\n"
        "{{ 1 < 2 and 2 <= 2 and 3 > 2 and 3 >= 3 and 1 != 2 }} {{ not false }} {{ none or 'or' }}"
        " {{ 0 and 'never' }} {{ 'yes' if 1 else 'no' }} {{ range(3) | list }} {{ range(1, 10, 4) | list }}\n"
        "{% for a, b in [[1, 'x'], [2, 'y']] %}{{ a }}{{ b }}{% endfor %}"
        " {% for i in [] %}never{% else %}empty loop{% endfor %}"
        " {% for c in 'ab' %}{{ loop.revindex }}{{ c }}{{ loop.previtem | default('^') }}{% endfor %}"),
    # Newest first over the messages with a namespace (the last user query),
    # thinking text cut from earlier answers, tool calls when a message has them.
    "reverse": (
        "{%- set ns = namespace(last_query=messages|length - 1) %}\n"
        "{%- for message in messages[::-1] %}\n"
        "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
        "    {%- if message.role == 'user' and message.content is string and "
        "not message.content.startswith('<tool_response>') %}\n"
        "        {%- set ns.last_query = index %}{% break %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- for message in messages %}\n"
        "    {%- set content = message.content if message.content is string else '' %}\n"
        "    {%- if message.role == 'assistant' %}\n"
        "        {%- if '</think>' in content %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}\n"
        "        {{- '<|im_start|>assistant\\n' + content }}\n"
        "        {%- if message.tool_calls %}{%- for call in message.tool_calls %}\n"
        "            {%- if call.function is defined %}{%- set call = call.function %}{%- endif %}\n"
        "            {{- '\\n<tool_call>\\n{\"name\": \"' }}{{ call.name }}{{ '\", \"arguments\": ' }}"
        "{{ call.arguments | tojson }}{{- '}\\n</tool_call>' }}\n"
        "        {%- endfor %}{%- endif %}\n"
        "        {{- '<|im_end|>\\n' }}\n"
        "    {%- else %}\n"
        "        {{- '<|im_start|>' + message.role + '\\n' + content + "
        "(' [latest]' if loop.index0 == ns.last_query else '') + '<|im_end|>\\n' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
        "{%- endif %}{%- endif %}"),
    # A dated system header, tools in the first user message, role headers.
    "headers": (
        "{{- bos_token }}\n"
        "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}\n"
        "{%- if messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content']|trim %}\n"
        "    {%- set messages = messages[1:] %}\n"
        "{%- else %}\n"
        "    {%- set system_message = '' %}\n"
        "{%- endif %}\n"
        "{{- '<|header|>system<|end_header|>\\n\\n' }}\n"
        "{{- 'Today Date: ' + date_string + '\\n\\n' }}\n"
        "{%- if tools is not none and tools is defined %}\n"
        "    {{- 'Respond with a JSON call of one of:\\n' }}\n"
        "    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}\n"
        "{%- endif %}\n"
        "{{- system_message }}{{- '<|eot|>' }}\n"
        "{%- for message in messages %}\n"
        "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
        "        {{- '<|header|>' + message['role'] + '<|end_header|>\\n\\n' + message['content'] | trim + "
        "'<|eot|>' }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|header|>assistant<|end_header|>\\n\\n' }}{%- endif %}\n"),
    # The system text in the last user message, [AVAILABLE_TOOLS] once,
    # alternation checked with a namespace.
    "last-user": (
        "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
        "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}\n"
        "{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}\n"
        "{%- set ns = namespace(index=0) %}\n"
        "{%- for message in loop_messages %}\n"
        "    {%- if message.role == 'user' or message.role == 'assistant' %}\n"
        "        {%- if (message['role'] == 'user') != (ns.index % 2 == 0) %}\n"
        "            {{- raise_exception('After the optional system message, roles must alternate') }}\n"
        "        {%- endif %}\n"
        "        {%- set ns.index = ns.index + 1 %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{{- bos_token }}\n"
        "{%- for message in loop_messages %}\n"
        "    {%- if message['role'] == 'user' %}\n"
        "        {%- if tools is not none and (message == user_messages[-1]) %}"
        "{{- '[AVAILABLE_TOOLS] ' + (tools | map(attribute='function') | map(attribute='name') | list | tojson) "
        "+ '[/AVAILABLE_TOOLS]' }}{%- endif %}\n"
        "        {%- if loop.last and system_message is defined %}\n"
        "            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}\n"
        "        {%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}\n"
        "    {%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] | trim + eos_token }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"),
    # Filters the published templates of Llama 3.1, Gemma, Command R and
    # others use (found by rendering those with qkv and jinja2 side by side):
    # reject/select with a test, dictsort (keys without case, by value,
    # reversed), min and max, indent, a filter on none; `in` an undefined
    # name; an unknown filter inside an if branch that does not run (jinja2
    # only fails on it when it runs); str.format.
    "filters": (
        "{%- set builtin = ['code_interpreter', 'brave_search', 'wolfram'] %}"
        "Tools: {{ builtin | reject('equalto', 'code_interpreter') | join(', ') }}\n"
        "{{ [0, 1, '', 'a', none] | select | list | tojson }} {{ [1, 2, 3, 4] | reject('odd') | list }}\n"
        "{%- set props = {'b': 2, 'A': 3, 'c': 1} %}\n"
        "{% for k, v in props | dictsort %}{{ k }}={{ v }} {% endfor %}|"
        "{% for k, v in props | dictsort(by='value') %}{{ k }} {% endfor %}|"
        "{% for k, v in props | dictsort(true, reverse=true) %}{{ k }} {% endfor %}"
        "{{ props | dictsort | first }} {{ props | items | list | last }} {{ props.items() | list | first }}\n"
        "{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A', 'c'] | min }} {{ ['b', 'A', 'c'] | max }} "
        "{{ messages | max(attribute='content') | tojson }}\n"
        "[{{ 'one\ntwo\n\nthree\n' | indent(2) }}]"
        "[{{ 'one\ntwo' | indent(first=true, width='> ') }}][{{ 'a\n\nb' | indent(1, blank=true) }}]\n"
        "{{ none | selectattr('role') | list | length }} {{ tools | map(attribute='type') | list }}\n"
        "{{ 'citations' in controls }} {{ 'x' not in controls }}\n"
        "{%- if tools is defined and tools is string %}{{ tools | from_json }}{% endif %}\n"
        "{{ '<eos{}>'.format(2) }} {{ '{1}-{0}'.format('a', 'b') }} {{ '{{{name}}}'.format(name=messages | length) }}\n"),
    # Dicts with keys other than strings, as ByteDance-Seed-OSS's template
    # has them (a table of thinking budgets by integer): lookup, dictsort by
    # number, `in`, get, keys, items, a key given twice, 1 and 1.0 and true
    # as one key, their printing and tojson.
    "keys": (
        "{%- set gears = {0: 0, 1024: 256, 512: 128, 8192: 1024, 2048: 512} %}"
        "{%- set ns = namespace(interval=none) %}"
        "{%- for k, v in gears | dictsort %}{%- if ns.interval is none and budget <= k %}"
        "{%- set ns.interval = v %}{%- endif %}{%- endfor %}"
        "{{ ns.interval }} {{ gears[8192] }} {{ gears[2048.0] }} {{ 512 in gears }} {{ '512' in gears }} "
        "{{ gears.get(1024) }} {{ gears.get(7, 'none') }} {{ gears.keys() | list }} {{ gears | list | first }}\n"
        "{%- set mixed = {1: 'a', 'b': 2, none: 'n', 1.0: 'one', true: 'yes', 2.5: 'f'} %}"
        "{{ mixed }} {{ mixed | length }} {{ mixed[1] }} {{ mixed[none] }} {{ mixed.items() | list }}\n"
        "{{ mixed | tojson }} {{ {'x': 1, 'x': 2} }} {{ gears[3] is defined }}\n"),
    # jinja2's Markup, which |safe returns: `+` with a plain string escapes
    # that string for HTML (functionary v3.1's tool list comes out so through
    # transformers, whose own tojson returns a plain string); `~` joins as
    # plain strings; trim, upper and string keep a Markup one, and a plain
    # string's `+` is plain.
    "markup": (
        "{%- for t in tools %}{{ \"Use '\"|safe + t['function']['name'] + \"' <now>\\n\"|safe"
        " + t['function'] | tojson }}\n{% endfor %}"
        "{{ '<function=' + 'f&g' + '>' + {'a': \"it's\"} | tojson + '</function>' }}\n"
        "{{ '<a>' ~ ('\"b\"' | safe) ~ '<c>' }} {{ ('<x> ' | safe | trim) + '<y>' }} "
        "{{ ('q' | safe | upper) + '&' }} {{ (5 | safe) + '<' }} {{ '<p>' + '</p>' }}\n"),
    # transformers' {% generation %} block (the assistant's tokens, for
    # return_assistant_tokens_mask): its body renders as it stands.
    "generation": (
        "{%- for m in messages %}{%- if m['role'] == 'assistant' %}[A] {% generation %}{{ m['content'] }}"
        "{%- endgeneration %}{%- else %}[{{ m['role'] }}] {{ m['content'] }}{%- endif %}\n{% endfor %}"),
}

CASES = [
    ("turns", {"messages": CHAT, "add_generation_prompt": True}),
    ("turns", {"messages": NO_SYSTEM, "add_generation_prompt": False}),
    ("inst", {"messages": CHAT[:3] + [CHAT[3]], "bos_token": "<s>", "eos_token": "</s>"}),
    ("inst", {"messages": NO_SYSTEM, "bos_token": "<s>", "eos_token": "</s>"}),
    ("inst", {"messages": BAD_ORDER, "bos_token": "<s>", "eos_token": "</s>"}),
    ("renamed", {"messages": CHAT, "bos_token": "<bos>", "add_generation_prompt": True}),
    ("namespace", {"messages": CHAT}),
    ("tools", {"messages": CHAT, "tools": TOOLS}),
    ("tools", {"messages": CHAT}),
    ("whitespace", {}),
    ("macros", {"messages": NO_SYSTEM}),
    ("values", {}),
    ("reverse", {"messages": CHAT + [{"role": "assistant", "content": "<think>\nhm\n</think>\n\nIt is.",
                                      "tool_calls": [{"type": "function", "function": {
                                          "name": "get_time", "arguments": {"city": "東京"}}}]},
                                     {"role": "user", "content": "<tool_response>12:00</tool_response>"}],
                 "add_generation_prompt": True, "enable_thinking": False}),
    ("reverse", {"messages": NO_SYSTEM, "add_generation_prompt": False}),
    ("headers", {"messages": CHAT, "bos_token": "<|begin|>", "tools": TOOLS, "add_generation_prompt": True}),
    ("headers", {"messages": NO_SYSTEM, "bos_token": "<|begin|>", "tools": None, "date_string": "4 Dec 2026",
                 "add_generation_prompt": True}),
    ("last-user", {"messages": CHAT, "bos_token": "<s>", "eos_token": "</s>", "tools": TOOLS}),
    ("last-user", {"messages": NO_SYSTEM, "bos_token": "<s>", "eos_token": "</s>", "tools": None}),
    ("last-user", {"messages": BAD_ORDER, "bos_token": "<s>", "eos_token": "</s>", "tools": None}),
    ("filters", {"messages": CHAT}),
    ("filters", {"messages": CHAT, "tools": TOOLS}),
    ("keys", {"budget": 600}),
    ("keys", {"budget": 9000}),
    ("markup", {"tools": TOOLS}),
    ("generation", {"messages": CHAT}),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "jinja"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cases = []
    for name, context in CASES:
        case = {"template": name, "context": context}
        try:
            case["expected"] = _compile_jinja_template(TEMPLATES[name]).render(**context)
        except Exception as e:  # noqa: BLE001 (recorded: the test expects qkv to fail the same way)
            case["error"] = str(e)
        cases.append(case)
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"templates": TEMPLATES, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} raising")


if __name__ == "__main__":
    main()
