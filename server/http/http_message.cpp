#include "server/http/http_message.h"

#include <algorithm>
#include <cctype>

namespace attnres::server::http {

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](unsigned char a, unsigned char b) {
          return std::tolower(a) == std::tolower(b);
        })) {
      return std::string_view(value);
    }
  }
  return std::nullopt;
}

}  // namespace attnres::server::http
