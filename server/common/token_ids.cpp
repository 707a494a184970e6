#include "server/common/token_ids.h"

#include "server/common/request_error.h"

namespace attnres::server {

void check_token_ids(const std::string& field, std::span<const int32_t> ids,
                     const Vocabulary& vocabulary) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (vocabulary.contains(ids[i])) continue;
    try {
      vocabulary.check(field + "[" + std::to_string(i) + "]", ids[i]);
    } catch (const Error& e) {
      throw RequestError(Refusal::InvalidArgument, e.what(), field);
    }
  }
}

}  // namespace attnres::server
