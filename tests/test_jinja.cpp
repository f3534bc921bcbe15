// The Jinja interpreter of chat templates (qkv/jinja.h) against transformers:
// tests/fixtures/jinja/cases.json (scripts/make_jinja_fixtures.py) holds
// templates written for the test with the constructs chat templates use, and
// the text transformers' apply_chat_template environment renders for each
// context, or the message it raised; qkv renders the same bytes or raises
// the same message. Then what the interpreter refuses, each one error
// naming the line, and the bounds that keep a template finite.
#include <nlohmann/json.hpp>

#include "qkv/io.h"
#include "qkv/jinja.h"
#include "tests/test_util.h"

namespace qkv::jinja {
namespace {

using testing::error_of;

TEST(Jinja, RendersWhatTransformersRenders) {
  const auto fixture = nlohmann::ordered_json::parse(read_file(std::string(QKV_FIXTURES_DIR) + "/jinja/cases.json"));
  int compared = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["template"].get<std::string>();
    std::string got;
    const std::string error =
        error_of([&] { got = Template(fixture["templates"][name].get<std::string>()).render(c["context"]); });
    if (c.contains("error")) {
      EXPECT_EQ(error, c["error"].get<std::string>()) << name;
    } else {
      EXPECT_EQ(error, "(no error)") << name;
      EXPECT_EQ(got, c["expected"].get<std::string>()) << name;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 25);
}

TEST(Jinja, WhatItDoesNotRunIsOneErrorNamingTheLine) {
  auto parse_error = [](const std::string& source) { return error_of([&] { Template t(source); }); };
  EXPECT_EQ(parse_error("a\n{% include 'x' %}"),
            "line 2: '{% include %}' is not supported (qkv runs the chat-template subset of Jinja)");
  EXPECT_EQ(parse_error("{% if x %}a"), "line 1: '{% if %}' is never closed");
  EXPECT_EQ(parse_error("{{ x"), "line 1: '{{' is never closed");
  EXPECT_EQ(parse_error("{{ x + }}"), "line 1: unexpected the end of the tag");
  EXPECT_EQ(parse_error("{% endfor %}"), "line 1: unexpected '{% endfor %}'");
  EXPECT_EQ(parse_error("\n\n{% break %}"), "line 3: '{% break %}' outside a loop");
  EXPECT_EQ(parse_error("{{ 'abc }}"), "line 1: '{{' is never closed");
  EXPECT_EQ(parse_error("{{ a ? b }}"), "line 1: unexpected character '?'");
  auto render_error = [](const std::string& source, const nlohmann::ordered_json& context) {
    return error_of([&] { Template(source).render(context); });
  };
  EXPECT_EQ(parse_error("{{ x | wordcount }}"), "line 1: the filter 'wordcount' is not supported");
  EXPECT_EQ(parse_error("{{ x is nonsuch }}"), "line 1: the test 'nonsuch' is not supported");
  // Inside an if, as in jinja2, only when it runs.
  EXPECT_EQ(render_error("{% if x %}\n{{ x | wordcount }}{% endif %}", {{"x", "a"}}),
            "line 2: the filter 'wordcount' is not supported");
  EXPECT_EQ(render_error("{% if x is nonsuch %}{% endif %}", {{"x", "a"}}),
            "line 1: the test 'nonsuch' is not supported");
  EXPECT_EQ(Template("{% if x %}a{% elif y is nonsuch %}{{ y | wordcount }}{% endif %}b").render({{"x", true}}), "ab");
  EXPECT_EQ(render_error("{{ '{}{}'.format(1) }}", nlohmann::ordered_json::object()), "format: no argument 1 for {}{}");
  EXPECT_EQ(render_error("{{ '{:>4}'.format(1) }}", nlohmann::ordered_json::object()),
            "format: the field '{:>4}' (qkv's format takes {}, {N} and {name}, without specs)");
  EXPECT_EQ(render_error("\n{{ m.content.strip() }}", {{"m", nlohmann::ordered_json::object()}}),
            "line 2: 'content' is undefined (reading .strip)");
  EXPECT_EQ(render_error("{{ 1 / 0 }}", nlohmann::ordered_json::object()), "line 1: division by zero");
  EXPECT_EQ(render_error("{{ raise_exception('no tools here') }}", nlohmann::ordered_json::object()), "no tools here");
  EXPECT_EQ(render_error("{{ x }}", nlohmann::ordered_json::array()), "render: the context must be a JSON object");
}

// Every filter and test the parser lets through is one the renderer runs:
// applied to a list, a string and a dict (with arguments where they need
// them), each renders or fails on its operands, never as unknown. (A name
// added to the lists but not to the renderer fails here.)
TEST(Jinja, EveryNameTheParserTakesTheRendererRuns) {
  const nlohmann::ordered_json context = {{"xs", {1, 2, 2}}, {"s", "ab"}, {"d", {{"k", 1}}}};
  int checked = 0;
  for (const bool is_filter : {true, false}) {
    for (const std::string& name : is_filter ? jinja::filter_names() : jinja::test_names()) {
      for (const char* operand : {"xs", "s", "d"}) {
        const std::set<std::string> one_argument = {"selectattr", "rejectattr", "in",     "divisibleby", "equalto",
                                                    "eq",         "==",         "sameas", "ne",          "!="};
        const std::string args = name == "replace"          ? "('a', 'b')"
                                 : name == "map"            ? "('upper')"
                                 : one_argument.count(name) ? "('k')"
                                                            : "";
        const std::string source = is_filter ? std::string("{{ ") + operand + " | " + name + args + " }}"
                                             : std::string("{{ ") + operand + " is " + name + args + " }}";
        std::string error;
        try {
          jinja::Template(source).render(context);
        } catch (const Error& e) {
          error = e.what();
        }
        EXPECT_EQ(error.find("not supported"), std::string::npos) << source << ": " << error;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 3 * (int)(jinja::filter_names().size() + jinja::test_names().size()));
  EXPECT_THROW(jinja::Template("{{ xs | shuffle }}"), Error);
  EXPECT_THROW(jinja::Template("{{ xs is prime }}"), Error);
}

TEST(Jinja, AHostileTemplateStaysFinite) {
  const nlohmann::ordered_json none = nlohmann::ordered_json::object();
  EXPECT_EQ(error_of([&] { Template("{% for i in range(10000000) %}{% endfor %}").render(none); }),
            "range: more than 1048576 items");
  EXPECT_EQ(error_of([&] { Template("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").render(none); }),
            "line 1: macros call each other more than 64 deep");
  EXPECT_EQ(error_of([&] {
              Template("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}").render(none);
            }),
            "render: the output passed 16 MiB");
  EXPECT_EQ(error_of([&] {
              Template("{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}")
                  .render(none);
            }),
            "line 1: the template runs too long (1048576 steps)");
  EXPECT_EQ(error_of([&] { Template("{{ raise_exception('two\nlines') }}").render(none); }), "two lines");
  std::string deep(10000, '(');
  EXPECT_EQ(error_of([&] { Template("{{ " + deep + " }}"); }), "line 1: an expression nested too deep");
  std::string nested;
  for (int i = 0; i < 300; ++i) nested += "{% if true %}";
  EXPECT_EQ(error_of([&] { Template{nested}; }), "line 1: blocks nested too deep");
}

// Values stay acyclic and at most 128 levels deep, so that printing,
// comparing, converting and freeing one (a call a level) stays on the stack.
// The fuzzer's input: a namespace set to hold itself, then printed (repr
// recursed until the stack ran out; the cycle of shared pointers also leaked).
TEST(Jinja, ValuesNeitherHoldThemselvesNorNestWithoutEnd) {
  const nlohmann::ordered_json none = nlohmann::ordered_json::object();
  EXPECT_EQ(error_of([&] { Template("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}").render(none); }),
            "line 1: a namespace() cannot be put in a list, a dict or another namespace: set ns.x");
  EXPECT_EQ(error_of([&] { Template("{% set ns = namespace() %}{{ [ns] }}").render(none); }),
            "a namespace() cannot be put in a list, a dict or another namespace");
  EXPECT_EQ(error_of([&] { Template("{% set a = namespace() %}{{ namespace(b=a) }}").render(none); }),
            "a namespace() cannot be put in a list, a dict or another namespace");
  // Nesting carried through a namespace, a level an iteration.
  EXPECT_EQ(error_of([&] {
              Template("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}")
                  .render(none);
            }),
            "line 1: lists and dicts nested deeper than 128 levels: set ns.l");
  EXPECT_EQ(error_of([&] {
              Template(
                  "{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = {'k': ns.d} %}"
                  "{% endfor %}")
                  .render(none);
            }),
            "line 1: lists and dicts nested deeper than 128 levels: set ns.d");
  // 127 levels made so, 128 with the outer list: printed whole.
  const std::string deepest =
      Template(
          "{% set ns = namespace(l=[]) %}{% for i in range(126) %}{% set ns.l = [ns.l] %}{% endfor %}"
          "{{ [ns.l] }}")
          .render(none);
  EXPECT_EQ(deepest, std::string(128, '[') + std::string(128, ']'));
  // A value of the context: 128 levels render, 129 and 100,000 are one error.
  const auto nested_list = [](int levels) {
    return nlohmann::ordered_json::parse(std::string(levels, '[') + std::string(levels, ']'));
  };
  EXPECT_EQ(Template("{{ x | length }}").render({{"x", nested_list(128)}}), "1");
  EXPECT_EQ(error_of([&] {
              Template("{{ x | length }}").render({{"x", nested_list(129)}});
            }),
            "the context is nested deeper than 128 levels");
  EXPECT_EQ(error_of([&] {
              Template("{{ x | length }}").render({{"x", nested_list(100000)}});
            }),
            "the context is nested deeper than 128 levels");
}

// A for loop binds `loop` only in a template that reads the name somewhere
// (building its nine fields was most of an empty iteration's time: the
// hostile template above took 3 s, 0.4 s without them); where one does,
// every loop has it, inner ones their own.
TEST(Jinja, LoopIsBoundWhereTheTemplateReadsIt) {
  const nlohmann::ordered_json none = nlohmann::ordered_json::object();
  auto render = [&](const std::string& source) { return Template(source).render(none); };
  EXPECT_EQ(render("{% for x in 'ab' %}{% for y in [5, 6] %}{{ loop.index }}{{ x }}{% endfor %}"
                   "{{ loop.last }}{% endfor %}"),
            "1a2aFalse1b2bTrue");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ x }}{% if loop is defined %}!{% endif %}{% endfor %}"), "a!b!");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ x }}{% endfor %}"), "ab");
}

// Integers are exact to 64 bits (Python's have no bound): past them is an
// error naming the operation, never a wrapped or rounded number (the fuzzer
// found the cast of 2e93 to an integer, undefined behaviour, in `**`).
TEST(Jinja, IntegerArithmeticIsExactOrAnError) {
  const nlohmann::ordered_json none = nlohmann::ordered_json::object();
  auto render = [&](const std::string& source) { return Template(source).render(none); };
  // 2^53 + 1 is not a double: a sum in floating point gave ...992.
  EXPECT_EQ(render("{{ 9007199254740993 + 0 }} {{ 3 ** 39 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** -1 }}"),
            "9007199254740993 4052555153018976267 -4 2 -2 0.5");
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 5) | list | length }} {{ "
                   "'abc'[::9223372036854775807] }}"),
            "2 a");
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }} {{ true + true }} {{ 1e18 | int }}"),
            "0 2 1000000000000000000");
  for (const auto& [source, error] : std::initializer_list<std::pair<std::string, std::string>>{
           {"{{ 99999999999 ** 9 }}", "line 1: integer overflow: '**' past 64 bits"},
           {"{{ 4611686018427387904 * 2 }}", "line 1: integer overflow: '*' past 64 bits"},
           {"{{ 9223372036854775807 + 1 }}", "line 1: integer overflow: '+' past 64 bits"},
           {"{{ (-9223372036854775807 - 1) // -1 }}", "line 1: integer overflow: '//' past 64 bits"},
           {"{{ -(-9223372036854775807 - 1) }}", "line 1: integer overflow: '-' past 64 bits"},
           {"{{ 1e300 | int }}", "line 1: int of 1e+300: past 64 bits"},
           {"{{ 'ab' * 9223372036854775807 }}", "line 1: a string too long"}})
    EXPECT_EQ(error_of([&] { render(source); }), error) << source;
}

}  // namespace
}  // namespace qkv::jinja
