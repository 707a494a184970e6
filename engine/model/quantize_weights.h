// --quantization int8|int4 at load: the model's weight matrices (every projection, the
// embedding and the LM head; a tied pair once) quantized into the recipe's formats
// (engine/core/quant_format.h: int8 all Q8_B32; int4 the projections Q4_B32, the embedding and
// LM head Q6_B32), on several threads. Norms, biases and the AttnRes depth-mix weights stay as
// they are.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace attnres {

struct QuantizeSummary {
  DType format = DType::Q8_B32;  // the recipe (quant_format_from_name)
  int matrices = 0;              // quantized now (already-quantized ones not counted)
  std::map<DType, int> formats;  // how many of them each stored format got
  size_t bytes_before = 0;       // ModelWeights::total_bytes before and after
  size_t bytes_after = 0;
  double bits_per_weight = 0;  // of every quantized matrix afterwards, as stored
  double seconds = 0;
  int threads = 1;
  // One line for logs: "quantized 197 matrices to int4 (int4k 168, int6k 29), 5.22 bits per
  // weight, in 2.1 s on 2 threads: weights 1192 MB -> 634 MB" (the stored formats and their
  // counts only where they are not just the recipe's own).
  std::string line() const;
};

// The format named by --quantization ("" = none), checked against the model: every matrix's
// columns a multiple of 32, and no checkpoint quantized in another format. Throws
// attnres::Error naming the flag.
std::optional<DType> quantization_for(const std::string& flag_value, const ModelConfig& cfg);

// Quantizes every float weight matrix of `w` into its format under the recipe `format`
// (recipe_matrix_format) on `threads` threads (0 = all cores), and sets w.quant_format.
// `release(old)` is called with each float matrix once it is replaced (to drop its mapped pages).
// Matrices already quantized are kept.
QuantizeSummary quantize_model_weights(ModelWeights& w, DType format, int threads,
                                       const std::function<void(const Tensor&)>& release = {});

// Gives the pages wholly inside `t`'s memory back to the system (madvise MADV_DONTNEED):
// for a float matrix that was quantized, whose memory is about to be released but shares
// its allocation (a HugePageArena chunk) with tensors that stay. Its contents are gone (reads
// see zeros, or a file mapping's bytes again): call it only on memory nothing reads again.
void drop_resident_pages(const Tensor& t);

// This process's resident memory (VmRSS) in bytes; 0 where /proc is not there.
size_t resident_memory_bytes();

}  // namespace attnres
