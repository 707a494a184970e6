// Expression semantics: values print like Python's str(), operators follow Python, and
// Undefined behaves like jinja2's default Undefined. Expected strings are what jinja2 prints.
#include "tests/cpp/engine/jinja/test_util.h"

namespace attnres::testing {
namespace {

using nlohmann::ordered_json;

TEST(ChatTemplateExpr, PrintsLikePythonStr) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 2.0] }}"), "[1, 'a', None, True, 2.0]");
  EXPECT_EQ(render("{{ {'k': 'v', 'n': [1]} }}"), "{'k': 'v', 'n': [1]}");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1.5e-7 }}|{{ 100.0 }}|{{ 1/3 }}"),
            "0.30000000000000004|1e+16|1.5e-07|100.0|0.3333333333333333");
  EXPECT_EQ(render("{{ none }}|{{ True }}|{{ (1,) }}|{{ \"it's\" ~ [\"it's\"] }}"),
            "None|True|(1,)|it's[\"it's\"]");
}

TEST(ChatTemplateExpr, PythonArithmetic) {
  EXPECT_EQ(
      render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}"),
      "3 -4 2 3.5 1024 0.5");
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [0] * 2 }} {{ [1] + [2] }} {{ 1 ~ 2 }}"),
            "ababab [0, 0] [1, 2] 12");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ 1 < 2 < 3 }} {{ 'a' in 'cat' }}"),
            "True True True True");
  EXPECT_EQ(render("{{ 'x' if 0 else 'y' }} {{ 0 or 'z' }} {{ 1 and 'w' }} {{ not none }}"),
            "y z w True");
}

TEST(ChatTemplateExpr, UndefinedLikeJinja2) {
  ordered_json ctx = {{"d", {{"a", 1}}}};
  EXPECT_EQ(render("[{{ missing }}][{{ d.b }}][{{ missing|length }}][{{ 'a' ~ missing }}]", ctx),
            "[][][0][a]");
  EXPECT_EQ(render("{{ missing is defined }} {{ d.b is undefined }} {{ 'x' in missing }}", ctx),
            "False True False");
  EXPECT_EQ(render("{% for x in missing %}never{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{{ missing|default('dv') }} {{ ''|default('dv', true) }}"), "dv dv");
}

TEST(ChatTemplateExpr, StringMethodsAreCodePointAware) {
  ordered_json ctx = {{"u", "日本語🙂"}};
  EXPECT_EQ(render("{{ u|length }} {{ u[1] }} {{ u[::-1] }} {{ u[-1] }} {{ u.find('語') }}", ctx),
            "4 本 🙂語本日 🙂 2");
  EXPECT_EQ(render("{{ ' a b '.split() }} {{ 'a,b,,c'.split(',', 1) }} {{ 'x\\n'.rstrip('\\n') }}"),
            "['a', 'b'] ['a', 'b,,c'] x");
  EXPECT_EQ(
      render("{{ 'hello wORLD'.title() }} {{ 'hello wORLD-x'|title }} {{ 'aBC'|capitalize }}"),
      "Hello World Hello World-X Abc");
}

TEST(ChatTemplateExpr, SlicesAndIndexing) {
  ordered_json ctx = {{"l", {1, 2, 3, 4}}};
  EXPECT_EQ(
      render("{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-1] }} {{ l[9] }}|", ctx),
      "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] [1, 3] 4 |");
}

TEST(ChatTemplateExpr, FiltersAndTojson) {
  ordered_json ctx = {{"tools", ordered_json::array({{{"z", 1}, {"a", "é\"\n"}}})}};
  // Key order is kept and non-ASCII is not escaped, like transformers' tojson.
  EXPECT_EQ(render("{{ tools|tojson }}", ctx), "[{\"z\": 1, \"a\": \"é\\\"\\n\"}]");
  EXPECT_EQ(render("{{ tools[0]|tojson(indent=2) }}", ctx),
            "{\n  \"z\": 1,\n  \"a\": \"é\\\"\\n\"\n}");
  EXPECT_EQ(
      render(
          "{{ [3, 1, 2]|sort|join(',') }} {{ ['b', 'A']|sort|first }} {{ [1, 1, 2]|unique|list }}"),
      "1,2,3 A [1, 2]");
  EXPECT_EQ(
      render("{{ [{'n': 'a', 'x': 1}, {'n': 'b'}]|selectattr('x')|map(attribute='n')|list }}"),
      "['a']");
  EXPECT_EQ(render("{{ 2.567|round(2) }} {{ 2.5|round }} {{ '42'|int + 1 }} {{ ' x '|trim }}"),
            "2.57 2.0 43 x");
}

// Found by tests/fuzz/jinja_fuzzer (a leak): a namespace that holds itself, or two that hold
// each other, is a reference cycle; the render must still free them. LeakSanitizer (the ASan run
// and the fuzzers, which replay this input from tests/fuzz/corpus/jinja_fuzzer) checks the
// freeing; this checks that the values still render while the render lasts.
TEST(ChatTemplateExpr, NamespacesThatHoldThemselvesRenderAndAreFreed) {
  EXPECT_EQ(render("{% set ns = namespace(a=0) %}{% set ns.a = ns %}{{ ns.a.a.a is defined }}"),
            "True");
  EXPECT_EQ(render("{% set x = namespace() %}{% set y = namespace(x=x) %}{% set x.y = y %}"
                   "{{ x.y.x.y is defined }}{% set x.y = 1 %}{{ x.y }}"),
            "True1");
  EXPECT_THAT(render_error("{% set ns = namespace() %}{% set ns.self = ns %}{{ 1 + 'a' }}"),
              ::testing::HasSubstr("unsupported operand"));  // freed on the error path too
}

TEST(ChatTemplateExpr, LoopVariablesAndNamespace) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.revindex0 }}{{ loop.first }}"
                   "{{ loop.last }};{% endfor %}"),
            "12TrueFalse;21FalseFalse;30FalseTrue;");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) if i is odd %}"
                   "{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "4");
  // A plain set inside a loop does not leak out of it (jinja2 scoping).
  EXPECT_EQ(render("{% set x = 'out' %}{% for i in [1] %}{% set x = 'in' %}{% endfor %}{{ x }}"),
            "out");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}"
                   "{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "02");
}

TEST(ChatTemplateExpr, Macros) {
  EXPECT_EQ(
      render("{% macro m(a, b='B') %}{{ a }}-{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, b=2) }}"),
      "1-B 1-2");
}

}  // namespace
}  // namespace attnres::testing
