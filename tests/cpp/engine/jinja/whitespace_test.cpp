// Whitespace control with transformers' options: trim_blocks, lstrip_blocks,
// keep_trailing_newline=False, and the '-' / '+' modifiers. Expected strings are jinja2's.
#include "tests/cpp/engine/jinja/test_util.h"

namespace attnres::testing {
namespace {

TEST(ChatTemplateWhitespace, TrimBlocksEatsOneNewlineAfterBlockTags) {
  EXPECT_EQ(render("{% if true %}\nA\n{% endif %}\nB"), "A\nB");
  EXPECT_EQ(render("{% if true %}\n\nA{% endif %}"), "\nA");
  EXPECT_EQ(render("{{ 'x' }}\nB"), "x\nB");  // not after variable tags
  EXPECT_EQ(render("{# c #}\nB"), "B");       // but after comments
}

TEST(ChatTemplateWhitespace, LstripBlocksStripsIndentBeforeBlockTags) {
  EXPECT_EQ(render("  {% if true %}\n    A\n  {% endif %}\n"), "    A\n");
  EXPECT_EQ(render("x {% if true %}A{% endif %}"), "x A");   // not at line start
  EXPECT_EQ(render("  {{ 'v' }}"), "  v");                   // not before {{
  EXPECT_EQ(render("  {%+ if true %}A{% endif %}"), "  A");  // '+' disables it
}

TEST(ChatTemplateWhitespace, MinusStripsAllWhitespace) {
  EXPECT_EQ(render("a  \n\n  {%- if true -%}  \n\n  b  \n {%- endif %}"), "ab");
  EXPECT_EQ(render("a \n {{- 'b' -}} \n c"), "abc");
  EXPECT_EQ(render("a\n  {#- comment -#}\n  b"), "ab");
}

TEST(ChatTemplateWhitespace, PlusKeepsNewlineAfterBlock) {
  EXPECT_EQ(render("{% if true +%}\nA{% endif %}"), "\nA");
}

TEST(ChatTemplateWhitespace, TrailingNewlineDroppedAndCrlfNormalized) {
  EXPECT_EQ(render("A\n"), "A");
  EXPECT_EQ(render("A\n\n"), "A\n");
  EXPECT_EQ(render("A\r\nB\r\n"), "A\nB");
}

TEST(ChatTemplateWhitespace, RawBlock) {
  EXPECT_EQ(render("{% raw %}{{ not rendered }}{% endraw %}"), "{{ not rendered }}");
}

}  // namespace
}  // namespace attnres::testing
