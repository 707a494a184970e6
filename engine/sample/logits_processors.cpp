#include "engine/sample/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/core/error.h"

namespace attnres {
namespace {

void check_id(int32_t id, size_t vocab) {
  ATTNRES_CHECK(id >= 0 && static_cast<size_t>(id) < vocab,
                "token id " + std::to_string(id) + " outside vocab " + std::to_string(vocab));
}

}  // namespace

void apply_logit_bias(std::span<float> logits,
                      const std::vector<std::pair<int32_t, float>>& logit_bias) {
  for (const auto& [id, bias] : logit_bias) {
    check_id(id, logits.size());
    logits[id] += bias;
  }
}

void block_tokens(std::span<float> logits, std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    check_id(id, logits.size());
    logits[id] = -std::numeric_limits<float>::infinity();
  }
}

void allow_only(std::span<float> logits, std::span<const int32_t> ids, std::vector<float>& kept) {
  if (ids.empty()) return;
  kept.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], logits.size());
    kept[i] = logits[ids[i]];
  }
  std::fill(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < ids.size(); ++i) logits[ids[i]] = kept[i];
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt_ids,
                     std::span<const int32_t> output_ids, const PenaltyParams& penalties,
                     PenaltyScratch& scratch) {
  if (!penalties.active()) return;
  const size_t vocab = logits.size();
  for (int32_t id : prompt_ids) check_id(id, vocab);
  for (int32_t id : output_ids) check_id(id, vocab);

  if (penalties.repetition != 1.0f) {
    scratch.seen.resize(vocab, 0);
    // Each distinct token is penalised once; the mark is cleared as it is applied, which
    // leaves the scratch all-zero for the next call.
    auto mark = [&](int32_t id) { scratch.seen[id] = 1; };
    auto penalise = [&](int32_t id) {
      if (!scratch.seen[id]) return;
      scratch.seen[id] = 0;
      float& l = logits[id];
      l = l > 0.0f ? l / penalties.repetition : l * penalties.repetition;
    };
    for (int32_t id : prompt_ids) mark(id);
    for (int32_t id : output_ids) mark(id);
    for (int32_t id : prompt_ids) penalise(id);
    for (int32_t id : output_ids) penalise(id);
  }

  if (penalties.presence != 0.0f || penalties.frequency != 0.0f) {
    scratch.output_counts.resize(vocab, 0);
    for (int32_t id : output_ids) ++scratch.output_counts[id];
    for (int32_t id : output_ids) {
      int32_t& count = scratch.output_counts[id];
      if (count == 0) continue;  // already applied for an earlier occurrence
      logits[id] -= penalties.frequency * static_cast<float>(count);
      logits[id] -= penalties.presence;
      count = 0;
    }
  }
}

void apply_temperature(std::span<float> logits, float temperature) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (float& l : logits) l = std::isnan(l) ? kNegInf : l / temperature;
}

int32_t argmax(std::span<const float> logits) {
  ATTNRES_CHECK(!logits.empty(), "argmax of an empty vocabulary");
  size_t best = 0;
  // Start from the first non-NaN so a leading NaN cannot block every later comparison.
  while (best + 1 < logits.size() && std::isnan(logits[best])) ++best;
  for (size_t i = best + 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lowest id
  }
  return static_cast<int32_t>(best);
}

}  // namespace attnres
