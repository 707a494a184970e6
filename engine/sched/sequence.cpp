#include "engine/sched/sequence.h"

#include <utility>

namespace attnres {

Sequence::Sequence(std::string request_id, int choice_index, std::span<const int32_t> prompt_ids,
                   SamplingParams params, uint64_t arrival_order,
                   EngineClock::time_point arrival_time)
    : request_id(std::move(request_id)),
      choice_index(choice_index),
      params(std::move(params)),
      token_ids(prompt_ids.begin(), prompt_ids.end()),
      num_prompt_tokens(static_cast<int>(prompt_ids.size())),
      arrival_order(arrival_order),
      arrival_time(arrival_time) {}

}  // namespace attnres
