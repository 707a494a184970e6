// The distribution random sampling draws from: the tokens that survive top-k, then top-p, then
// min-p (vLLM v0 order), each weighted by its unnormalised probability exp(logit - max_logit).
//
// Cost, for a vocabulary of V: with no truncation (or min-p only) two passes over V and no
// index array at all; top-k one pass with a k-sized heap; top-p one exp pass, then sorting only
// the tokens above a probability floor chosen so the top-p set is guaranteed to lie above it.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace attnres {

struct TruncationParams {
  int top_k = 0;  // <= 0 or >= vocab: off
  float top_p = 1.0f;
  float min_p = 0.0f;
};

class TruncatedDistribution {
 public:
  // logits: temperature-scaled, NaN-free, at least one finite. Overwritten: afterwards it holds
  // the weights (the span must outlive this object's use).
  void build(std::span<float> logits, const TruncationParams& params);

  // Inverse CDF: the kept token at quantile u in [0, 1), walking a fixed order (descending
  // probability when a candidate list exists, token id otherwise) so a draw is reproducible.
  int32_t sample(double u) const;

  // The kept tokens with normalised probabilities, in walking order (tests, debugging).
  std::vector<std::pair<int32_t, double>> probabilities() const;

 private:
  void keep_top_p(float top_p);
  void keep_min_p(float min_p);
  double weight(int32_t id) const { return weights_[id]; }

  std::span<float> weights_;  // indexed by token id
  bool all_vocab_ = true;     // true: every token with weight > 0 is kept; ids_ unused
  std::vector<int32_t> ids_;  // kept tokens, descending probability, ties by lowest id
  double total_ = 0.0;        // sum of kept weights
};

}  // namespace attnres
