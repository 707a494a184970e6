#include "engine/runner/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/error.h"

namespace attnres {
namespace {

std::string n(int64_t v) { return std::to_string(v); }

// Columns [begin, begin + count) of a host matrix [rows, cols], as a new host tensor.
Tensor column_slice(const Tensor& m, int64_t begin, int64_t count) {
  ATTNRES_CHECK(m.rank() == 2 && begin >= 0 && begin + count <= m.dim(1), "column slice");
  const int64_t rows = m.dim(0), cols = m.dim(1);
  const size_t elem = dtype_size(m.dtype);
  Tensor out = Tensor::empty({rows, count}, m.dtype);
  const auto* src = static_cast<const char*>(m.data);
  auto* dst = static_cast<char*>(out.data);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * count * elem, src + (r * cols + begin) * elem, count * elem);
  }
  return out;
}

// Rows [begin, end) of m, padded with zero rows to `rows_out` rows. A view when no padding
// is needed.
Tensor padded_rows(const Tensor& m, int64_t begin, int64_t end, int64_t rows_out) {
  if (end - begin == rows_out) return m.rows(begin, end);
  Shape shape = m.shape;
  shape[0] = rows_out;
  Tensor out = Tensor::empty(shape, m.dtype);  // zero-filled
  if (end > begin) {
    const Tensor real = m.rows(begin, end);
    std::memcpy(out.data, real.data, real.nbytes());
  }
  return out;
}

Tensor rows_if(const Tensor& t, int64_t begin, int64_t end) {
  return t.defined() ? t.rows(begin, end) : t;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int size) {
  if (size < 1) throw Error("--tensor-parallel-size must be >= 1, got " + n(size));
  if (size == 1) return;
  const std::string model = c.model_dir.empty() ? "the model" : c.model_dir;
  auto fail = [&](const std::string& why) {
    throw Error("--tensor-parallel-size " + n(size) + " cannot split " + model + ": " + why);
  };
  if (c.num_heads % size != 0) {
    fail("num_attention_heads " + n(c.num_heads) + " is not divisible by " + n(size));
  }
  if (c.num_kv_heads % size != 0 && size % c.num_kv_heads != 0) {
    fail("num_key_value_heads " + n(c.num_kv_heads) + " must be divisible by " + n(size) + ", or " +
         n(size) + " by it (KV heads are then replicated)");
  }
  if (c.intermediate_size % size != 0) {
    fail("intermediate_size " + n(c.intermediate_size) + " is not divisible by " + n(size));
  }
}

TensorParallelShard shard_of(const ModelConfig& c, int rank, int size) {
  check_tensor_parallel(c, size);
  ATTNRES_CHECK(rank >= 0 && rank < size, "rank out of range");
  TensorParallelShard s;
  s.rank = rank;
  s.size = size;
  s.num_heads = c.num_heads / size;
  s.first_head = rank * s.num_heads;
  if (c.num_kv_heads >= size) {
    s.num_kv_heads = c.num_kv_heads / size;
    s.first_kv_head = rank * s.num_kv_heads;
  } else {
    // Query heads of one KV group span size / Hkv ranks, which all hold that KV head.
    s.num_kv_heads = 1;
    s.first_kv_head = s.first_head / (c.num_heads / c.num_kv_heads);
  }
  s.intermediate = c.intermediate_size / size;
  s.first_intermediate = rank * s.intermediate;
  s.vocab_slice = (c.vocab_size + size - 1) / size;
  s.vocab_begin = std::min(c.vocab_size, rank * s.vocab_slice);
  s.vocab_end = std::min(c.vocab_size, (rank + 1) * s.vocab_slice);
  return s;
}

ModelConfig local_config(const ModelConfig& c, const TensorParallelShard& s) {
  ModelConfig local = c;
  local.num_heads = s.num_heads;
  local.num_kv_heads = s.num_kv_heads;
  local.intermediate_size = s.intermediate;
  local.vocab_size = s.vocab_slice;
  return local;
}

ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& c,
                           const TensorParallelShard& s) {
  const int64_t hd = c.head_dim;
  const int64_t q_begin = s.first_head * hd, q_end = q_begin + s.num_heads * hd;
  const int64_t kv_begin = s.first_kv_head * hd, kv_end = kv_begin + s.num_kv_heads * hd;
  const int64_t f_begin = s.first_intermediate, f_end = f_begin + s.intermediate;
  const bool first_rank = s.rank == 0;

  ModelWeights w;
  w.dtype = full.dtype;
  w.embed_tokens = full.embed_tokens;  // replicated (a view: the mapping is shared)
  w.final_norm = full.final_norm;
  w.final_res = full.final_res;
  w.lm_head = padded_rows(full.lm_head, s.vocab_begin, s.vocab_end, s.vocab_slice);
  for (const LayerWeights& l : full.layers) {
    LayerWeights o;
    o.input_norm = l.input_norm;
    o.post_attention_norm = l.post_attention_norm;
    o.q_norm = l.q_norm;
    o.k_norm = l.k_norm;
    o.attn_res = l.attn_res;
    o.mlp_res = l.mlp_res;
    o.v_res = l.v_res;  // depth weights are replicated, never sharded
    o.q_proj = l.q_proj.rows(q_begin, q_end);
    o.k_proj = l.k_proj.rows(kv_begin, kv_end);
    o.v_proj = l.v_proj.rows(kv_begin, kv_end);
    o.q_bias = rows_if(l.q_bias, q_begin, q_end);
    o.k_bias = rows_if(l.k_bias, kv_begin, kv_end);
    o.v_bias = rows_if(l.v_bias, kv_begin, kv_end);
    o.o_proj = column_slice(l.o_proj, q_begin, q_end - q_begin);
    if (first_rank) o.o_bias = l.o_bias;
    o.gate_proj = l.gate_proj.rows(f_begin, f_end);
    o.up_proj = l.up_proj.rows(f_begin, f_end);
    o.gate_bias = rows_if(l.gate_bias, f_begin, f_end);
    o.up_bias = rows_if(l.up_bias, f_begin, f_end);
    o.down_proj = column_slice(l.down_proj, f_begin, f_end - f_begin);
    if (first_rank) o.down_bias = l.down_bias;
    w.layers.push_back(std::move(o));
  }
  return w;
}

}  // namespace attnres
