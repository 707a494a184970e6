#include "clients/cli_flags/flags.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <sstream>

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
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) throw Error("unexpected argument '" + arg + "' (see --help)");
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = find_spec(specs, name);
    if (!spec) throw Error("unknown flag --" + name + " (see --help)");
    if (has(name) && !spec->repeatable) throw Error("flag --" + name + " given twice");
    if (spec->value_name.empty()) {
      if (inline_value) throw Error("flag --" + name + " takes no value");
      values_[name].push_back("1");
      continue;
    }
    if (inline_value) {
      values_[name].push_back(*inline_value);
    } else if (i + 1 < args.size()) {
      values_[name].push_back(args[++i]);
    } else {
      throw Error("flag --" + name + " needs a value (" + spec->value_name + ")");
    }
  }
  if (env_prefix.empty()) return;
  for (const FlagSpec& spec : specs) {
    if (has(spec.name)) continue;
    const char* value = std::getenv(env_name(env_prefix, spec.name).c_str());
    if (!value || !*value) continue;
    // A boolean switch is on for any value but 0 / false.
    const std::string v = value;
    if (spec.value_name.empty() && (v == "0" || v == "false")) continue;
    values_[spec.name].push_back(spec.value_name.empty() ? "1" : v);
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
