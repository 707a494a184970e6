// attnres-client's flags: the tables behind each subcommand's --help, and their translation
// into the client library's values (ClientOptions, GenerateOptions). Pure functions of the
// parsed flags (and, for the connection, of the environment), unit-tested in
// tests/cpp/clients/cpp. Malformed flags are attnres::Error (the CLI's usage errors, exit 2);
// out-of-range values are left for the server to reject, so the CLI reports exactly the
// server's INVALID_ARGUMENT message.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "clients/cpp/client.h"
#include "clients/cli_flags/flags.h"

namespace attnres::client::cli {

// Reads an environment variable (nullptr when unset); std::getenv in the CLI, a map in tests.
using EnvLookup = std::function<const char*(const char*)>;

inline constexpr const char* kDefaultTarget = "127.0.0.1:50051";
inline constexpr const char* kTargetEnv = "ATTNRES_GRPC_TARGET";
inline constexpr const char* kApiKeyEnv = "ATTNRES_API_KEY";

// --target, --api-key, --timeout, --wait-for-ready: every subcommand takes them.
std::vector<attnres::cli::FlagSpec> connection_flags();

// generate's own flags: prompt, output mode and sampling (the names of `attnres generate`).
std::vector<attnres::cli::FlagSpec> generate_flags();

// --target, else $ATTNRES_GRPC_TARGET, else 127.0.0.1:50051; --api-key, else $ATTNRES_API_KEY;
// --timeout SECONDS (fractions allowed), else default_timeout_seconds (0: no deadline).
ClientOptions client_options_from_flags(const attnres::cli::Flags& flags, const EnvLookup& env,
                                        double default_timeout_seconds = 0);

// The request generate sends: exactly one of --prompt / --prompt-ids, the sampling flags
// (unset ones stay unset: the server's defaults), --request-id, --no-stream.
GenerateOptions generate_options_from_flags(const attnres::cli::Flags& flags);

}  // namespace attnres::client::cli
