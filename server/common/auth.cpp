#include "server/common/auth.h"

#include <algorithm>
#include <cctype>

namespace attnres::server {

AuthResult authenticate(const ServerState& state, std::optional<std::string_view> authorization) {
  if (state.options().api_keys.empty()) return AuthResult::Ok;
  if (!authorization) return AuthResult::Missing;
  constexpr std::string_view kBearer = "Bearer ";
  const std::string_view value = *authorization;
  const bool has_bearer =
      value.size() >= kBearer.size() && std::equal(kBearer.begin(), kBearer.end(), value.begin(),
                                                   [](unsigned char a, unsigned char b) {
                                                     return std::tolower(a) == std::tolower(b);
                                                   });
  if (!has_bearer) return AuthResult::Missing;
  return state.check_api_key(value.substr(kBearer.size())) ? AuthResult::Ok : AuthResult::Invalid;
}

}  // namespace attnres::server
