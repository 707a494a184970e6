// API-key authentication, one rule for both front ends: the client sends
// "Authorization: Bearer <key>" (HTTP header or gRPC metadata); the scheme is matched
// case-insensitively (RFC 7235), the key exactly and in constant time.
#pragma once

#include <optional>
#include <string_view>

#include "server/common/server_state.h"

namespace attnres::server {

enum class AuthResult {
  Ok,       // no keys configured, or a configured key was sent
  Missing,  // no Authorization value, or not a Bearer one
  Invalid,  // a Bearer key that is not configured
};

// `authorization`: the Authorization value as received (nullopt when absent).
AuthResult authenticate(const ServerState& state, std::optional<std::string_view> authorization);

}  // namespace attnres::server
