// The flags grammar both commands share (clients/cli_flags, parsed by CLI11): both value
// spellings, repeatable flags, the ATTNRES_* environment fallback and its precedence, boolean
// switches from the environment, the errors naming the flag, and the --help text.
#include "clients/cli_flags/flags.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "engine/core/error.h"

namespace attnres::cli {
namespace {

const std::vector<FlagSpec> kSpecs = {
    {"max-tokens", "N", "tokens to generate at most"},
    {"prompt", "TEXT", "the prompt"},
    {"stop", "TEXT", "stop text", true},
    {"ignore-eos", "", "keep going"},
    {"verbose", "", "say more", true},
};
const std::string kPrefix = "ATTNRES_FLAGS_TEST_";

// Sets the variables for a test's lifetime.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars)
      : vars_(std::move(vars)) {
    for (const auto& [name, value] : vars_) setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : vars_) unsetenv(name.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

std::string error_of(const std::vector<std::string>& args, const std::string& prefix = "") {
  try {
    Flags flags(kSpecs, args, prefix);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Flags, BothValueSpellings) {
  Flags flags(kSpecs, {"--max-tokens", "5", "--prompt=a=b c"});
  EXPECT_EQ(flags.get_int("max-tokens", 0), 5);
  EXPECT_EQ(flags.get("prompt"), "a=b c");  // split at the first '=' only
  EXPECT_FALSE(flags.has("stop"));
  EXPECT_EQ(flags.get("stop", "none"), "none");
  EXPECT_EQ(Flags(kSpecs, {"--max-tokens=7"}).get_int("max-tokens", 0), 7);
}

TEST(Flags, AValueIsTheNextArgumentWhateverItLooksLike) {
  Flags flags(kSpecs, {"--max-tokens", "-1", "--prompt", "--stop", "--stop", "-"});
  EXPECT_EQ(flags.get_int("max-tokens", 0), -1);
  EXPECT_EQ(flags.get("prompt"), "--stop");
  EXPECT_EQ(flags.get_all("stop"), std::vector<std::string>{"-"});
  EXPECT_EQ(Flags(kSpecs, {"--prompt", "--"}).get("prompt"), "--");
  EXPECT_EQ(Flags(kSpecs, {"--prompt", "[a,b]"}).get("prompt"), "[a,b]");
  EXPECT_EQ(Flags(kSpecs, {"--prompt", ""}).get("prompt"), "");
}

TEST(Flags, AnEmptyInlineValueIsEmpty) {
  Flags flags(kSpecs, {"--prompt=", "--max-tokens", "3"});
  EXPECT_TRUE(flags.has("prompt"));
  EXPECT_EQ(flags.get("prompt", "x"), "");
  EXPECT_EQ(flags.get_int("max-tokens", 0), 3);
}

TEST(Flags, RepeatableFlagsKeepEveryValueInOrder) {
  Flags flags(kSpecs, {"--stop", "a", "--prompt", "p", "--stop=b", "--stop", "c", "--verbose",
                       "--verbose"});
  EXPECT_EQ(flags.get_all("stop"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(flags.get("stop"), "c");  // get() is the last one
  EXPECT_EQ(flags.get_all("verbose"), (std::vector<std::string>{"1", "1"}));
  EXPECT_TRUE(Flags(kSpecs, {}).get_all("stop").empty());
}

TEST(Flags, BooleanSwitches) {
  Flags flags(kSpecs, {"--ignore-eos"});
  EXPECT_TRUE(flags.has("ignore-eos"));
  EXPECT_EQ(flags.get("ignore-eos"), "1");
  EXPECT_FALSE(Flags(kSpecs, {}).has("ignore-eos"));
}

TEST(Flags, TheEnvironmentFillsAbsentFlags) {
  ScopedEnv env(
      {{kPrefix + "MAX_TOKENS", "9"}, {kPrefix + "PROMPT", "from env"}, {kPrefix + "STOP", "s,t"}});
  Flags flags(kSpecs, {}, kPrefix);
  EXPECT_EQ(flags.get_int("max-tokens", 0), 9);
  EXPECT_EQ(flags.get("prompt"), "from env");
  EXPECT_EQ(flags.get_all("stop"), std::vector<std::string>{"s,t"});  // one value, not split
  // Without a prefix the environment is not read.
  EXPECT_FALSE(Flags(kSpecs, {}).has("max-tokens"));
  EXPECT_EQ(Flags::env_name("ATTNRES_", "max-num-batched-tokens"),
            "ATTNRES_MAX_NUM_BATCHED_TOKENS");
}

TEST(Flags, TheCommandLineBeatsTheEnvironment) {
  ScopedEnv env({{kPrefix + "MAX_TOKENS", "not a number"},
                 {kPrefix + "STOP", "env"},
                 {kPrefix + "PROMPT", "env"}});
  Flags flags(kSpecs, {"--max-tokens", "4", "--stop", "a", "--stop", "b", "--prompt="}, kPrefix);
  EXPECT_EQ(flags.get_int("max-tokens", 0), 4);
  EXPECT_EQ(flags.get_all("stop"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(flags.get("prompt", "x"), "");
  // Given once on the command line, a non-repeatable flag set in the environment is not
  // "given twice".
  EXPECT_EQ(error_of({"--max-tokens", "1"}, kPrefix), "(no error)");
}

TEST(Flags, AnEmptyVariableIsUnset) {
  ScopedEnv env({{kPrefix + "MAX_TOKENS", ""}, {kPrefix + "IGNORE_EOS", ""}});
  Flags flags(kSpecs, {}, kPrefix);
  EXPECT_FALSE(flags.has("max-tokens"));
  EXPECT_FALSE(flags.has("ignore-eos"));
}

TEST(Flags, SwitchesFromTheEnvironmentAreOnForAnyValueBut0OrFalse) {
  for (const char* on : {"1", "true", "yes", "on", "TRUE", "False", "no", "off", "2"}) {
    ScopedEnv env({{kPrefix + "IGNORE_EOS", on}});
    Flags flags(kSpecs, {}, kPrefix);
    EXPECT_TRUE(flags.has("ignore-eos")) << on;
    EXPECT_EQ(flags.get("ignore-eos"), "1") << on;
  }
  for (const char* off : {"0", "false"}) {
    ScopedEnv env({{kPrefix + "IGNORE_EOS", off}});
    EXPECT_FALSE(Flags(kSpecs, {}, kPrefix).has("ignore-eos")) << off;
    // ... and the command line still turns it on.
    EXPECT_TRUE(Flags(kSpecs, {"--ignore-eos"}, kPrefix).has("ignore-eos")) << off;
  }
}

TEST(Flags, MalformedNumbersNameTheFlag) {
  EXPECT_THROW(Flags(kSpecs, {"--max-tokens", "abc"}).get_int("max-tokens", 0), Error);
  try {
    Flags(kSpecs, {"--max-tokens", "12x"}).get_int("max-tokens", 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--max-tokens: '12x' is not a valid number");
  }
  ScopedEnv env({{kPrefix + "MAX_TOKENS", "1.5"}});
  EXPECT_THROW(Flags(kSpecs, {}, kPrefix).get_int("max-tokens", 0), Error);
}

TEST(Flags, ErrorsNameTheFlag) {
  EXPECT_EQ(error_of({"--bogus"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(error_of({"--bogus=1"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(error_of({"--prompt", "a", "--bogus", "x"}), "unknown flag --bogus (see --help)");
  EXPECT_EQ(error_of({"--help"}), "unknown flag --help (see --help)");  // the callers' job
  EXPECT_EQ(error_of({"--"}), "unknown flag -- (see --help)");
  EXPECT_EQ(error_of({"---x"}), "unknown flag ---x (see --help)");
  EXPECT_EQ(error_of({"stray"}), "unexpected argument 'stray' (see --help)");
  EXPECT_EQ(error_of({"--prompt", "a", "b"}), "unexpected argument 'b' (see --help)");
  EXPECT_EQ(error_of({"-h"}), "unexpected argument '-h' (see --help)");
  EXPECT_EQ(error_of({"-max-tokens", "1"}), "unexpected argument '-max-tokens' (see --help)");
  EXPECT_EQ(error_of({"-5"}), "unexpected argument '-5' (see --help)");
  EXPECT_EQ(error_of({"--max-tokens"}), "flag --max-tokens needs a value (N)");
  EXPECT_EQ(error_of({"--prompt", "a", "--stop"}), "flag --stop needs a value (TEXT)");
  EXPECT_EQ(error_of({"--max-tokens", "1", "--max-tokens", "2"}), "flag --max-tokens given twice");
  EXPECT_EQ(error_of({"--ignore-eos", "--ignore-eos"}), "flag --ignore-eos given twice");
  EXPECT_EQ(error_of({"--max-tokens", "1", "--max-tokens"}), "flag --max-tokens given twice");
  EXPECT_EQ(error_of({"--stop", "a", "--stop"}), "flag --stop needs a value (TEXT)");
  EXPECT_EQ(error_of({"--ignore-eos=1"}), "flag --ignore-eos takes no value");
  EXPECT_EQ(error_of({"--ignore-eos=true"}), "flag --ignore-eos takes no value");
  EXPECT_EQ(error_of({"--ignore-eos="}), "flag --ignore-eos takes no value");
  // Case and underscores matter.
  EXPECT_EQ(error_of({"--Max-Tokens", "1"}), "unknown flag --Max-Tokens (see --help)");
  EXPECT_EQ(error_of({"--max_tokens", "1"}), "unknown flag --max_tokens (see --help)");
  // No prefix matching.
  EXPECT_EQ(error_of({"--max", "1"}), "unknown flag --max (see --help)");
  // An error before a missing value is the one reported, as it comes first.
  EXPECT_EQ(error_of({"--bogus", "--max-tokens"}), "unknown flag --bogus (see --help)");
}

TEST(Flags, UsageListsEveryFlag) {
  EXPECT_EQ(Flags::usage("demo", "Does things.", kSpecs),
            "usage: attnres demo [flags]\n\nDoes things.\n\nflags:\n"
            "  --max-tokens N                tokens to generate at most\n"
            "  --prompt TEXT                 the prompt\n"
            "  --stop TEXT                   stop text (repeatable)\n"
            "  --ignore-eos                  keep going\n"
            "  --verbose                     say more (repeatable)\n");
  EXPECT_EQ(Flags::usage("x", "S.", {{"a-very-long-flag-name-indeed", "VALUE", "h"}}, "prog"),
            "usage: prog x [flags]\n\nS.\n\nflags:\n"
            "  --a-very-long-flag-name-indeed VALUE h\n");
}

}  // namespace
}  // namespace attnres::cli
