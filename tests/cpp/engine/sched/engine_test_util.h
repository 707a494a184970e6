// Shared helpers for the EngineCore tests: an engine over FakeRunner and a stream reader.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/sched/engine_core.h"
#include "fake_model.h"

namespace attnres::testing {

struct EngineSetup {
  int num_blocks = 64;
  int block_size = 4;
  int max_num_seqs = 8;
  int max_num_batched_tokens = 32;
  int max_model_len = 128;
  int max_queued_requests = 64;
};

inline EngineConfig engine_config(const EngineSetup& setup) {
  EngineConfig config;
  config.scheduler.max_num_seqs = setup.max_num_seqs;
  config.scheduler.max_num_batched_tokens = setup.max_num_batched_tokens;
  config.scheduler.max_model_len = setup.max_model_len;
  config.num_kv_blocks = setup.num_blocks;
  config.block_size = setup.block_size;
  config.max_queued_requests = setup.max_queued_requests;
  config.eos_ids = {kEos};
  return config;
}

inline EngineRequest greedy_request(const std::string& id, std::vector<int32_t> prompt,
                                    int max_tokens) {
  EngineRequest request;
  request.request_id = id;
  request.prompt_ids = std::move(prompt);
  request.params.temperature = 0.0f;
  request.params.max_tokens = max_tokens;
  return request;
}

// Everything a stream delivered, per choice.
struct Collected {
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::string> text;
  std::map<int, RequestOutput> last;  // each choice's final output
  int num_outputs = 0;
  bool one_token_per_output = true;
  bool nothing_after_finish = true;
};

// Reads the stream to its end with the blocking next(): the engine must end every stream.
inline Collected drain(RequestStream& stream) {
  Collected c;
  while (std::optional<RequestOutput> out = stream.next()) {
    c.num_outputs += 1;
    if (c.last.count(out->choice_index) && c.last[out->choice_index].finished()) {
      c.nothing_after_finish = false;
    }
    if (!out->finished() && out->token_ids.size() != 1) c.one_token_per_output = false;
    auto& tokens = c.tokens[out->choice_index];
    tokens.insert(tokens.end(), out->token_ids.begin(), out->token_ids.end());
    c.text[out->choice_index] += out->text;
    c.last[out->choice_index] = *out;
  }
  return c;
}

// Steps a manually driven engine until it has nothing left to do. An engine that never goes
// idle fails the test and is shut down, so the streams end instead of blocking drain().
inline int run_until_idle(EngineCore& engine, int max_steps = 20000) {
  int steps = 0;
  while (engine.step()) {
    if (++steps == max_steps) {
      ADD_FAILURE() << "the engine did not go idle in " << max_steps << " steps";
      engine.shutdown(std::chrono::milliseconds(0));
      break;
    }
  }
  return steps;
}

// "prefix" + k without GCC 12's false -Wrestrict on operator+(const char*, std::string&&).
inline std::string numbered(const char* prefix, int k) {
  std::string id = prefix;
  id += std::to_string(k);
  return id;
}

}  // namespace attnres::testing
