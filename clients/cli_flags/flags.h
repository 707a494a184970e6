// Command-line flags: each command declares its flags (name, whether it takes a value,
// help text); parsing rejects unknown flags and missing values with a message naming them,
// and --help is generated from the same table. Its own library (attnres_cli_flags) because both
// the attnres and the attnres-client commands parse with it; CLI11 (libcli11-dev) does the
// parsing inside flags.cpp, out of this header, and the messages and --help text are ours.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace attnres::cli {

struct FlagSpec {
  std::string name;        // without the leading "--"
  std::string value_name;  // "" for a boolean switch
  std::string help;
  bool repeatable = false;
};

class Flags {
 public:
  // Throws attnres::Error for an unknown flag, a missing value or a stray positional.
  // With an env_prefix, a flag absent from args is read from the environment variable
  // <prefix><NAME> (upper case, '-' as '_'), e.g. ATTNRES_MAX_MODEL_LEN for --max-model-len:
  // how containers configure the server.
  Flags(const std::vector<FlagSpec>& specs, const std::vector<std::string>& args,
        const std::string& env_prefix = "");
  // The environment variable that can set a flag under env_prefix.
  static std::string env_name(const std::string& env_prefix, const std::string& flag);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> get_all(const std::string& name) const;
  // Typed getters: a malformed number is an Error naming the flag.
  int get_int(const std::string& name, int fallback) const;
  std::optional<int> get_optional_int(const std::string& name) const;
  double get_double(const std::string& name, double fallback) const;
  std::optional<double> get_optional_double(const std::string& name) const;
  // A comma-separated list of integers ("1,2,3").
  std::vector<int32_t> get_int_list(const std::string& name) const;

  // "usage: <program> <command> [flags]", the summary, then one line per flag.
  static std::string usage(const std::string& command, const std::string& summary,
                           const std::vector<FlagSpec>& specs,
                           const std::string& program = "attnres");

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

}  // namespace attnres::cli
