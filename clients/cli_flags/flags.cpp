#include "clients/cli_flags/flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>
#include <sstream>
#include <utility>

#include "engine/core/error.h"

namespace attnres::cli {
namespace {

const FlagSpec* find_spec(const std::vector<FlagSpec>& specs, const std::string& name) {
  for (const FlagSpec& s : specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw Error("--" + flag + ": '" + text + "' is not a valid number");
  }
  return value;
}

}  // namespace

std::string Flags::env_name(const std::string& env_prefix, const std::string& flag) {
  std::string name = env_prefix;
  for (char c : flag) name += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

Flags::Flags(const std::vector<FlagSpec>& specs, const std::vector<std::string>& args,
             const std::string& env_prefix) {
  // CLI11 parses; the messages stay ours (tests and scripts read them), so its exceptions and
  // leftovers are turned into attnres::Error below. --help is not an option here: the commands
  // print Flags::usage() before parsing (CLI11's formatter cannot reproduce that text).
  CLI::App app;
  app.set_help_flag();
  app.allow_extras();  // unknown flags and positionals are left over, reported below
  std::map<const CLI::Option*, const FlagSpec*> spec_of;
  std::vector<std::pair<const FlagSpec*, CLI::Option*>> options;
  for (const FlagSpec& spec : specs) {
    if (app.get_option_no_throw("--" + spec.name) != nullptr) continue;  // the first one wins
    CLI::Option* option =
        spec.value_name.empty() ? app.add_flag("--" + spec.name) : app.add_option("--" + spec.name);
    // Every occurrence is kept; a non-repeatable flag given twice is reported below.
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    // CLI11 reads the variable only when the flag is absent from the command line, and
    // ignores an empty one.
    if (!env_prefix.empty()) option->envname(env_name(env_prefix, spec.name));
    spec_of[option] = &spec;
    options.emplace_back(&spec, option);
  }

  // Two spellings CLI11 reads differently from ours: "--switch=VALUE" (CLI11 sets the switch
  // to VALUE; for us a switch takes no value) and "--flag=" (CLI11 then takes the next
  // argument as the value; for us the value is empty, so it is passed as a separate "").
  std::vector<std::string> reversed;  // CLI11 parses from the back
  reversed.reserve(args.size() + 1);
  for (const std::string& arg : args) {
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      const std::string name = arg.substr(2, eq - 2);
      const FlagSpec* spec = find_spec(specs, name);
      if (spec && spec->value_name.empty()) throw Error("flag --" + name + " takes no value");
      if (spec && eq + 1 == arg.size()) {
        reversed.push_back("--" + name);
        reversed.push_back("");
        continue;
      }
    }
    reversed.push_back(arg);
  }
  std::reverse(reversed.begin(), reversed.end());

  // A value flag takes the next argument whatever it is (CLI11 takes an option's minimum count
  // unconditionally, so "--seed -1" and "--stop --" work as before), so a value can only be
  // missing when the flag is the last argument: that error waits for those of the arguments
  // before it. (With several errors on one command line, the one reported may otherwise differ
  // from the first in argument order, which the hand-written parser reported.)
  std::optional<Error> last_error;
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const std::string& last = args.empty() ? "" : args.back();
    const FlagSpec* spec = last.rfind("--", 0) == 0 ? find_spec(specs, last.substr(2)) : nullptr;
    const CLI::Option* option = spec ? app.get_option_no_throw("--" + spec->name) : nullptr;
    if (!dynamic_cast<const CLI::ArgumentMismatch*>(&e) || !option) {
      throw Error(std::string("bad command line: ") + e.what() + " (see --help)");
    }
    last_error = option->count() > 0 && !spec->repeatable
                     ? Error("flag --" + spec->name + " given twice")
                     : Error("flag --" + spec->name + " needs a value (" + spec->value_name + ")");
  }

  const std::vector<std::string> leftover = app.remaining();
  if (!leftover.empty()) {
    const std::string& arg = leftover.front();
    if (arg.rfind("--", 0) != 0) throw Error("unexpected argument '" + arg + "' (see --help)");
    throw Error("unknown flag --" + arg.substr(2, arg.find('=') - 2) + " (see --help)");
  }
  std::set<const CLI::Option*> seen;
  for (const CLI::Option* option : app.parse_order()) {
    const FlagSpec* spec = spec_of.at(option);
    if (!seen.insert(option).second && !spec->repeatable) {
      throw Error("flag --" + spec->name + " given twice");
    }
  }
  if (last_error) throw *last_error;

  for (const auto& [spec, option] : options) {
    for (const std::string& value : option->results()) {
      if (!spec->value_name.empty()) {
        values_[spec->name].push_back(value);
        continue;
      }
      // A boolean switch is on from the command line (where CLI11's result is "") and, from
      // the environment, for any value but 0 / false.
      if (value != "0" && value != "false") values_[spec->name].push_back("1");
    }
  }
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> Flags::get_all(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

int Flags::get_int(const std::string& name, int fallback) const {
  return get_optional_int(name).value_or(fallback);
}

std::optional<int> Flags::get_optional_int(const std::string& name) const {
  if (!has(name)) return std::nullopt;
  return parse_number<int>(name, get(name));
}

double Flags::get_double(const std::string& name, double fallback) const {
  return get_optional_double(name).value_or(fallback);
}

std::optional<double> Flags::get_optional_double(const std::string& name) const {
  if (!has(name)) return std::nullopt;
  return parse_number<double>(name, get(name));
}

std::vector<int32_t> Flags::get_int_list(const std::string& name) const {
  std::vector<int32_t> out;
  std::string text = get(name);
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (item.empty()) continue;
    out.push_back(parse_number<int32_t>(name, item));
  }
  return out;
}

std::string Flags::usage(const std::string& command, const std::string& summary,
                         const std::vector<FlagSpec>& specs, const std::string& program) {
  std::ostringstream out;
  out << "usage: " << program << " " << command << " [flags]\n\n" << summary << "\n\nflags:\n";
  for (const FlagSpec& s : specs) {
    std::string left = "--" + s.name + (s.value_name.empty() ? "" : " " + s.value_name);
    out << "  " << left;
    out << std::string(left.size() < 30 ? 30 - left.size() : 1, ' ') << s.help
        << (s.repeatable ? " (repeatable)" : "") << "\n";
  }
  return out.str();
}

}  // namespace attnres::cli
