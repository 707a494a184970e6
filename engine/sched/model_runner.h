// The engine loop's two seams to the outside: the forward (ModelRunner) and incremental
// detokenization (TextDecoder). Tests plug a fake forward and no decoder; the server plugs
// TransformerRunner (transformer_runner.h) and an IncrementalDecoder adapter.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/depth_attention.h"
#include "engine/core/error.h"
#include "engine/sample/sampling_params.h"

namespace attnres {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int vocab_size() const = 0;
  // One forward step over `batch`, writing its K/V into the runner's paged cache (the
  // engine's BlockManager hands out that cache's block ids). Fills `logits` on the host,
  // row-major [logit_rows.size(), vocab_size()]. Called on the engine thread only.
  virtual void execute(const BatchMeta& batch, std::span<const int32_t> logit_rows,
                       std::vector<float>& logits) = 0;

  // Depth-attention introspection (ATTNRES.md §5), optional. The rows and columns of the
  // depth-mix weight matrices; empty (the default) when the runner's model has no depth mixes
  // or the runner cannot report them, and then the engine refuses requests that ask.
  virtual DepthAttentionLayout depth_attention_layout() const { return {}; }
  // execute(), plus the depth-mix weights of batch rows `depth_rows` (any order, repeats
  // allowed) into `depth_weights`, on the host, row-major [depth_rows.size(), layout rows,
  // layout cols], NaN in the cells a sublayer does not have. The engine calls it only for a
  // step where some sequence asked, and only when the layout is not empty.
  virtual void execute_with_depth_weights(const BatchMeta& batch,
                                          std::span<const int32_t> logit_rows,
                                          std::vector<float>& logits,
                                          std::span<const int32_t> depth_rows,
                                          std::vector<float>& depth_weights) {
    (void)batch, (void)logit_rows, (void)logits, (void)depth_rows, (void)depth_weights;
    throw Error("this model runner cannot report depth-attention weights");
  }
};

// One per sequence: token ids in, text that became decodable out (UTF-8 completed).
class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  virtual std::string push(int32_t token) = 0;
  virtual std::string flush() = 0;  // whatever is still held back, at the end
};

using TextDecoderFactory = std::function<std::unique_ptr<TextDecoder>(const SamplingParams&)>;

}  // namespace attnres
