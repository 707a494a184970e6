#include "server/common/request_error.h"

#include <string_view>

namespace attnres::server {

std::string field_named_in(const std::string& message) {
  // "field top_p: got 0, ..." (SamplingParams) or "n: got 0, ..." (EngineCore).
  std::string_view text = message;
  if (text.rfind("field ", 0) == 0) text.remove_prefix(6);
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0) return "";
  std::string_view name = text.substr(0, colon);
  if (name.find(' ') != std::string_view::npos) return "";
  const size_t bracket = name.find('[');  // logit_bias[5] -> logit_bias
  return std::string(name.substr(0, bracket));
}

}  // namespace attnres::server
