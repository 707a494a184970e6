// Shared by the tensor-parallel tests (here and tests/cpp/kernels/cuda/cuda_tensor_parallel_test.cpp):
// a small model config, CPU rank options over an in-process group, and a driver that runs a
// prefill step then one decode step per remaining token through any ModelRunner.
#pragma once

#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/parallel/in_process_communicator.h"
#include "engine/runner/tensor_parallel_runner.h"
#include "engine/sched/batch_builder.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres::test {

// d 64, 4 layers, 4 query / 2 KV heads (P = 4 replicates KV heads), ffn 96, vocab 301
// (uneven: padded LM head slices). mode: an attnres_mode, or "" for a plain qwen3; gate and
// null_source: attnres_gate_type and attnres_use_null_source (docs/ATTNRES.md §2d).
inline ModelConfig tp_test_config(const std::string& mode, const std::string& gate = "bias",
                                  bool null_source = false) {
  nlohmann::json j = {{"model_type", mode.empty() ? "qwen3" : "qwen3_attnres"},
                      {"hidden_size", 64},
                      {"num_hidden_layers", 4},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"intermediate_size", 96},
                      {"vocab_size", 301},
                      {"max_position_embeddings", 4096},
                      {"tie_word_embeddings", true},
                      {"rms_norm_eps", 1e-6}};
  if (!mode.empty()) {
    j["attnres_mode"] = mode;
    j["attnres_num_blocks"] = 2;
    j["attnres_gate_type"] = gate;
    j["attnres_use_null_source"] = null_source;
  }
  return ModelConfig::from_json(j, "tensor-parallel test config " + mode);
}

inline std::vector<int32_t> random_ids(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// P CPU ranks of one thread each, talking through an in-process group.
inline TensorParallelOptions cpu_tensor_parallel_options(int P, int blocks, int block_size,
                                                         int sp_min_tokens) {
  TensorParallelOptions o;
  o.size = P;
  o.num_kv_blocks = blocks;
  o.block_size = block_size;
  o.sequence_parallel_min_tokens = sp_min_tokens;
  o.make_backend = [](int) { return make_cpu_backend(1); };
  auto group = InProcessGroup::create(P);
  o.make_communicator = [group](int rank, Backend&) { return group->communicator(rank); };
  return o;
}

// Prefill `prefill` tokens (every position's logits), then one decode step per remaining
// token; returns every step's logits rows, concatenated.
inline std::vector<float> run_prefill_then_decode(ModelRunner& runner,
                                                  const std::vector<int32_t>& ids, int prefill,
                                                  int block_size) {
  BlockManager blocks((static_cast<int>(ids.size()) + block_size - 1) / block_size, block_size);
  SequenceBlocks seq;
  blocks.append(seq, static_cast<int>(ids.size()));
  std::vector<float> all;
  StepResult step;
  for (int done = 0; done < static_cast<int>(ids.size());) {
    const int count = done == 0 ? prefill : 1;
    StepBatch batch;
    add_to_batch(batch.meta, seq, std::span(ids).subspan(done, count), block_size);
    batch.logit_rows.resize(count);
    for (int i = 0; i < count; ++i) batch.logit_rows[i] = i;
    runner.execute(batch, step);
    all.insert(all.end(), step.logits.begin(), step.logits.end());
    done += count;
  }
  return all;
}

// max |got - want| / max |want|.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  return diff / scale;
}

}  // namespace attnres::test
