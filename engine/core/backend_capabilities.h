// What a backend can do, stated once per backend: one BackendCapabilities object that the
// registry hands out before a backend exists (BackendTraits::capabilities: sizing the KV cache,
// resolving the "auto" dtypes) and the instance answers with (Backend::capabilities()). Each
// backend defines its object once (kernels/cpu: cpu_backend_capabilities(), kernels/cuda:
// cuda_backend_capabilities()) and passes that same object to both.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "engine/core/dtype.h"

namespace attnres {

// A set of dtypes (one bit per DType).
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DType> dtypes) {
    for (DType dtype : dtypes) bits_ |= bit(dtype);
  }
  constexpr bool contains(DType dtype) const { return (bits_ & bit(dtype)) != 0; }
  constexpr bool operator==(const DTypeSet&) const = default;

 private:
  static constexpr uint32_t bit(DType dtype) { return uint32_t{1} << static_cast<unsigned>(dtype); }
  uint32_t bits_ = 0;
};

// The defaults are what every backend does (f32 everywhere, the plain composed ops).
struct BackendCapabilities {
  // The KV cache dtypes store_kv / attention take (BF16: K/V rounded to nearest even when
  // stored, widened in registers when read).
  DTypeSet kv_cache_dtypes{DType::F32};
  // The depth bank dtypes the depth ops (depth_phase1, the newer entries of
  // depth_phase2_prenorm, depth_weights) read and copy() converts f32 into.
  DTypeSet depth_bank_dtypes{DType::F32};
  // The weight dtypes linear (and the ops built on it) and embedding read as stored. The
  // block-quantized formats (quant_format.h) only where a backend lists them (the loader asks
  // before it quantizes).
  DTypeSet weight_dtypes{DType::F32, DType::BF16, DType::F16};
  // Whether Backend::set_bf16_linear_inputs(true) can be honoured (--linear-input-dtype
  // bfloat16), and whether it is the faster choice for bf16 weights (which auto takes).
  bool bf16_linear_inputs = false;
  bool prefers_bf16_linear_inputs = false;
  // Whether capture_step_graph records steps (CUDA graphs).
  bool step_graphs = false;
  // Whether linear_residual saves work over linear + add_inplace (a fused launch). The forward
  // calls it only then: the default composition needs a scratch the forward would allocate per
  // sublayer.
  bool fuses_linear_residual = false;
  // Whether depth_phase2_prenorm takes a mix without a Phase-1 state (m, s, o null, every bank
  // source a newer entry): the forward then skips Phase 1 for a group whose shared prefix is
  // one entry.
  bool mixes_without_phase1 = false;
  // Whether sample_async may return before the ids exist (something to overlap).
  bool samples_asynchronously = false;
};

}  // namespace attnres
