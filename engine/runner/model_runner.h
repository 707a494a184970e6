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

// One forward step: the batch (token ids, positions, slot mapping, block tables) and which of
// its rows come back to the host.
struct StepBatch {
  BatchMeta meta;
  // Rows of meta whose next-token logits come back to the host (sampling rows the host
  // samples, then prompt-logprob rows).
  std::vector<int32_t> logit_rows;
  // Rows of meta the runner samples itself (only when its samples_on_device()), with their
  // parameters: sampling.rows[i] is sample_rows[i]'s. Their logits never leave the device.
  std::vector<int32_t> sample_rows;
  SampleBatch sampling;
  // Rows of meta whose depth-mix weights are needed (any order, repeats allowed). Empty (the
  // usual case) means no depth weights this step; the engine fills it only for a step where
  // some sequence asked, and only when the runner's depth_attention_layout() is not empty.
  std::vector<int32_t> depth_rows;

  bool wants_depth_weights() const { return !depth_rows.empty(); }
};

// What a forward step returns, on the host.
struct StepResult {
  // Row-major [logit_rows.size(), vocab_size()].
  std::vector<float> logits;
  // Row-major [depth_rows.size(), layout rows, layout cols], NaN in the cells a sublayer does
  // not have; empty when the batch asked for none.
  std::vector<float> depth_weights;
  // One per batch.sample_rows: the token the runner sampled on the device (Backend::sample),
  // or a kSample* code (engine/core/backend.h) for a row the host path would have refused.
  std::vector<int32_t> sampled_ids;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int vocab_size() const = 0;
  // One forward step over `batch`, writing its K/V into the runner's paged cache (the
  // engine's BlockManager hands out that cache's block ids). Fills `result` (its buffers are
  // reused across steps, so a caller keeps one StepResult: a step's logits can be hundreds of
  // MB). Called on the engine thread only. A runner without depth weights throws when
  // batch.wants_depth_weights().
  virtual void execute(const StepBatch& batch, StepResult& result) = 0;

  // The same step split in two, for async scheduling (docs/ENGINE_CONTRACT.md, "One step, in
  // order"): launch() queues the step and may return before it has run; collect() waits for
  // it, after which `result` (the one given to launch) holds what execute() would have put
  // there. In between the engine neither changes `batch` nor reads or writes `result`, and it
  // calls collect() exactly once per launch(), before the next launch(); either may throw what
  // the step threw. The defaults run execute() inside launch(): synchronous.
  virtual void launch(const StepBatch& batch, StepResult& result) { execute(batch, result); }
  virtual void collect(StepResult& result) { (void)result; }
  // Whether launch() returns while the step still runs, so that the engine has a gap to fill
  // (EngineConfig::async_scheduling is on only then). False by default.
  virtual bool launches_asynchronously() const { return false; }

  // Depth-attention introspection (docs/ATTNRES.md §5), optional. The rows and columns of the
  // depth-mix weight matrices; empty (the default) when the runner's model has no depth mixes
  // or the runner cannot report them, and then the engine refuses requests that ask.
  virtual DepthAttentionLayout depth_attention_layout() const { return {}; }

  // Whether execute() samples batch.sample_rows on the device (docs/ENGINE_CONTRACT.md, "Where
  // sampling happens"). False (the default): the engine never fills sample_rows and samples
  // every row on the host from `logits`.
  virtual bool samples_on_device() const { return false; }
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
