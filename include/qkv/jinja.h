// A Jinja interpreter for chat templates: the subset of Jinja2 that Hugging
// Face chat templates use, rendered as transformers' apply_chat_template
// renders them (trim_blocks and lstrip_blocks on).
//
//   text, {{ expr }}, {# comment #}, whitespace control {{- -}} {%- -%}
//   {% if %} {% elif %} {% else %} {% endif %}
//   {% for x in xs [if cond] %} ... {% else %} ... {% endfor %}, loop.index,
//     loop.index0, loop.first, loop.last, loop.length, loop.revindex(0),
//     loop.previtem, loop.nextitem; for a, b in pairs
//   {% set x = expr %}, {% set ns.attr = expr %}, {% set x %}...{% endset %}
//   {% macro name(a, b=default) %} ... {% endmacro %} and calls of it
//   {% generation %} ... {% endgeneration %} (transformers' mark of the
//     assistant's part: its body renders as it stands)
//   expressions: literals (strings, numbers, true/false/none, lists, dicts
//     whose keys are strings, numbers, booleans or none),
//     names, .attr, [key], [a:b:c], calls, filters (|f(args)), tests (is
//     [not] t), not/and/or, == != < <= > >= in, not in, + - * / // % ~,
//     x if c else y
//   functions: raise_exception(msg), namespace(k=v, ...), range(...),
//     strftime_now(format)
//   filters: trim, length/count, tojson, upper, lower, capitalize, title,
//     default/d, first, last, join, list, items, string, int, float, replace,
//     safe (jinja2's Markup: `+` with a plain string escapes that string for
//     HTML, as in transformers), selectattr, rejectattr, select, reject, map(attribute=), unique,
//     reverse, sort, dictsort, min, max, indent
//   tests: defined, undefined, none, string, number, integer, float, mapping,
//     iterable, sequence, boolean, true, false, equalto/eq/==, ne, odd, even,
//     divisibleby, in
//   methods: str.strip/lstrip/rstrip/startswith/endswith/split/upper/lower/
//     replace/title/capitalize/format ({}, {N}, {name}; no specs),
//     dict.get/items/keys/values
//
// Anything else (include, extends, blocks, call blocks, other filters) is an
// error naming it, at the line where it stands, before anything renders;
// except a filter or test inside an if, which (as in jinja2) is an error
// only when it runs, so that a branch the template does not take may use
// one. One newline at the end of the source is dropped, as jinja2 drops it. A
// template cannot loop or recurse without end: ranges, loop iterations,
// output and macro depth are bounded, and so is how deep values nest (128
// levels, the context's included; a namespace() goes in no list, dict or
// other namespace, so no value holds itself). Errors are one line (a raised message's
// newlines become spaces).
#pragma once

#include <nlohmann/json.hpp>
#include <memory>
#include <set>
#include <string>

namespace qkv::jinja {

// The filters and tests a template may use, by name (aliases included): the
// parser refuses any other, and every one of them is one the renderer runs
// (tests/test_jinja.cpp holds the two to each other).
const std::set<std::string>& filter_names();
const std::set<std::string>& test_names();

class Template {
public:
  // Parses `source`; a syntax error, or a construct outside the subset, is a
  // qkv::Error "line N: ...".
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // The text for `context` (a JSON object: its keys are the template's
  // names). raise_exception(msg) in the template is a qkv::Error with msg.
  std::string render(const nlohmann::ordered_json& context) const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qkv::jinja
