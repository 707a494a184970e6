// Token ids a client sent (a prompt given as ids, ids to detokenize), checked once at the front
// end against the ids that have text, so the refusal names the client's own field. (The engine
// checks a prompt again at submit: that is its contract, docs/ENGINE_CONTRACT.md.)
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/sample/vocabulary.h"

namespace attnres::server {

// Throws RequestError (InvalidArgument, param `field`): "field F[i]: got X, expected a token id
// in [0, N)" and why, for the first id outside the vocabulary's decodable ids.
void check_token_ids(const std::string& field, std::span<const int32_t> ids,
                     const Vocabulary& vocabulary);

}  // namespace attnres::server
