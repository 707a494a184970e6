// Deterministic random weights for a config: the built-in demo model and the benchmark
// shapes (e.g. the 100M open-attnres shape and its no-AttnRes twin) are made with this at
// start-up, so nothing has to be downloaded to run or measure the engine.
#pragma once

#include <cstdint>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace attnres {

struct RandomWeightOptions {
  DType dtype = DType::BF16;
  uint64_t seed = 0;
  bool final_mix = false;  // give the model 2b's final_res_* (block sums with reset)
};

ModelWeights make_random_weights(const ModelConfig& config, const RandomWeightOptions& options);

}  // namespace attnres
