#include "engine/sample/truncated_distribution.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/core/error.h"
#include "engine/sample/select_top_k.h"

namespace attnres {
namespace {

// Top-p first tries gathering only tokens within this factor of the most likely one: on real
// LLM logits that set is small and usually already holds top_p of the mass.
constexpr double kOptimisticFloor = 1e-4;

}  // namespace

void TruncatedDistribution::build(std::span<float> logits, const TruncationParams& params) {
  weights_ = logits;
  ids_.clear();
  const size_t vocab = logits.size();
  ATTNRES_CHECK(vocab > 0, "sampling from an empty vocabulary");

  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab) {
    select_top_k(logits, params.top_k, ids_);
    const float max_logit = logits[ids_.front()];
    ATTNRES_CHECK(max_logit > -std::numeric_limits<float>::infinity(), "every logit is -inf");
    total_ = 0.0;
    // Only the candidates become weights; the rest of the span is left as logits, unread.
    for (int32_t id : ids_) {
      weights_[id] = std::exp(logits[id] - max_logit);
      total_ += weights_[id];
    }
    all_vocab_ = false;
  } else {
    const float max_logit = *std::max_element(logits.begin(), logits.end());
    ATTNRES_CHECK(max_logit > -std::numeric_limits<float>::infinity(), "every logit is -inf");
    total_ = 0.0;
    for (float& w : weights_) {
      w = std::exp(w - max_logit);
      total_ += w;
    }
    all_vocab_ = true;
  }
  if (params.top_p < 1.0f) keep_top_p(params.top_p);
  if (params.min_p > 0.0f) keep_min_p(params.min_p);
}

void TruncatedDistribution::keep_top_p(float top_p) {
  const double target = static_cast<double>(top_p) * total_;
  auto ranks_before = [&](int32_t a, int32_t b) {
    return weights_[a] > weights_[b] || (weights_[a] == weights_[b] && a < b);
  };
  if (all_vocab_) {
    // Every token below `floor` together weighs less than vocab * floor, so with
    // floor <= (1 - top_p) * total / vocab the tokens at or above it already hold top_p of the
    // mass and the top-p set lies among them: only those need sorting. Try a tighter floor
    // first; fall back to the guaranteed one, then (rounding) to everything.
    const double guaranteed = (1.0 - top_p) * total_ / static_cast<double>(weights_.size());
    for (double floor : {std::max(guaranteed, kOptimisticFloor), guaranteed, 0.0}) {
      ids_.clear();
      double gathered = 0.0;
      for (size_t i = 0; i < weights_.size(); ++i) {
        if (weights_[i] >= floor) {
          ids_.push_back(static_cast<int32_t>(i));
          gathered += weights_[i];
        }
      }
      if (gathered >= target || floor == 0.0) break;
    }
    std::sort(ids_.begin(), ids_.end(), ranks_before);
    all_vocab_ = false;
  }
  // Smallest prefix whose mass reaches top_p: keep a token while the mass before it is short.
  double before = 0.0;
  size_t keep = 0;
  while (keep < ids_.size() && (keep == 0 || before < target)) before += weight(ids_[keep++]);
  ids_.resize(keep);
  total_ = before;
}

void TruncatedDistribution::keep_min_p(float min_p) {
  // The most likely token always has weight exp(0) = 1, so the threshold min_p * max_prob
  // is min_p in weight units; the ratio is unchanged by top-k / top-p renormalisation.
  const float threshold = min_p;
  if (all_vocab_) {
    total_ = 0.0;
    for (float& w : weights_) {
      if (w < threshold) w = 0.0f;
      total_ += w;
    }
    return;
  }
  size_t keep = 1;  // the best token always survives
  while (keep < ids_.size() && weights_[ids_[keep]] >= threshold) ++keep;
  ids_.resize(keep);
  total_ = 0.0;
  for (int32_t id : ids_) total_ += weight(id);
}

int32_t TruncatedDistribution::sample(double u) const {
  const double target = u * total_;
  double cumulative = 0.0;
  int32_t last_positive = -1;
  auto visit = [&](int32_t id) {
    const double w = weight(id);
    if (w <= 0.0) return false;
    last_positive = id;
    cumulative += w;
    return cumulative > target;
  };
  if (all_vocab_) {
    for (int32_t id = 0; id < static_cast<int32_t>(weights_.size()); ++id) {
      if (visit(id)) return id;
    }
  } else {
    for (int32_t id : ids_) {
      if (visit(id)) return id;
    }
  }
  // Only reachable when rounding left the running sum just short of u * total.
  ATTNRES_CHECK(last_positive >= 0, "no token has positive probability");
  return last_positive;
}

std::vector<std::pair<int32_t, double>> TruncatedDistribution::probabilities() const {
  std::vector<std::pair<int32_t, double>> out;
  auto add = [&](int32_t id) {
    if (weight(id) > 0.0) out.emplace_back(id, weight(id) / total_);
  };
  if (all_vocab_) {
    for (int32_t id = 0; id < static_cast<int32_t>(weights_.size()); ++id) add(id);
  } else {
    for (int32_t id : ids_) add(id);
  }
  return out;
}

}  // namespace attnres
