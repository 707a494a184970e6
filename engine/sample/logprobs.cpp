#include "engine/sample/logprobs.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/error.h"
#include "engine/sample/select_top_k.h"

namespace attnres {

TokenLogprob compute_logprobs(std::span<const float> raw_logits, int32_t chosen, int top_k,
                              int candidates) {
  const int32_t vocab = static_cast<int32_t>(raw_logits.size());
  ATTNRES_CHECK(chosen >= 0 && chosen < vocab, "chosen token " + std::to_string(chosen));
  const float max_logit = *std::max_element(raw_logits.begin(), raw_logits.end());
  double sum = 0.0;
  for (float l : raw_logits) sum += std::exp(static_cast<double>(l) - max_logit);
  const double log_normaliser = max_logit + std::log(sum);
  auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(raw_logits[id]) - log_normaliser);
  };

  TokenLogprob out;
  out.token_id = chosen;
  out.logprob = logprob(chosen);
  const float chosen_logit = raw_logits[chosen];
  out.rank = static_cast<int>(std::count_if(raw_logits.begin(), raw_logits.end(),
                                            [&](float l) { return l >= chosen_logit; }));

  std::vector<int32_t> ids;
  const size_t searched =
      candidates < 0 ? raw_logits.size() : std::min(raw_logits.size(), static_cast<size_t>(candidates));
  select_top_k(raw_logits.first(searched), top_k, ids);
  out.top.reserve(ids.size());
  for (int32_t id : ids) out.top.emplace_back(id, logprob(id));
  return out;
}

}  // namespace attnres
