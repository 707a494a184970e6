#include "engine/model/quantize_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"

namespace attnres {
namespace {

struct MatrixSlot {
  Tensor* tensor;
  MatrixRole role;
};

// Every matrix slot of the model that --quantization quantizes, with its role
// (matrix_role of its checkpoint name).
std::vector<MatrixSlot> matrix_slots(ModelWeights& w) {
  std::vector<MatrixSlot> slots = {{&w.embed_tokens, MatrixRole::EmbeddingOrHead},
                                   {&w.lm_head, MatrixRole::EmbeddingOrHead}};
  const int n = static_cast<int>(w.layers.size());
  for (int i = 0; i < n; ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const auto& [t, name] : {std::pair{&l.q_proj, "self_attn.q_proj.weight"},
                                  {&l.k_proj, "self_attn.k_proj.weight"},
                                  {&l.v_proj, "self_attn.v_proj.weight"},
                                  {&l.o_proj, "self_attn.o_proj.weight"},
                                  {&l.gate_proj, "mlp.gate_proj.weight"},
                                  {&l.up_proj, "mlp.up_proj.weight"},
                                  {&l.down_proj, "mlp.down_proj.weight"}}) {
      slots.push_back({t, matrix_role(p + name, n)});
    }
  }
  return slots;
}

// The bits per weight of the model's quantized matrices (a tied pair once), as stored.
double quantized_bits_per_weight(ModelWeights& w) {
  std::set<const void*> seen;
  double bits = 0, weights = 0;
  for (const MatrixSlot& slot : matrix_slots(w)) {
    const Tensor& t = *slot.tensor;
    if (!t.defined() || !is_block_quantized(t.dtype) || !seen.insert(t.data).second) continue;
    bits += 8.0 * static_cast<double>(t.nbytes());
    weights += static_cast<double>(t.numel());
  }
  return weights > 0 ? bits / weights : 0.0;
}

std::string mb(size_t bytes) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << static_cast<double>(bytes) / 1e6 << " MB";
  return s.str();
}

// Rows [begin, end) of the float matrix `src` quantized into the same rows of `dst`.
void quantize_rows(const Tensor& src, Tensor& dst, int64_t begin, int64_t end) {
  const int64_t cols = src.dim(1);
  const size_t row_bytes = quant_row_bytes(dst.dtype, cols);
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t r = begin; r < end; ++r) {
    if (src.dtype == DType::BF16) {  // the common case, widened without a per-element switch
      const uint16_t* row = src.ptr<const uint16_t>() + r * cols;
      for (int64_t k = 0; k < cols; ++k) x[k] = bf16_to_f32(row[k]);
    } else {
      for (int64_t k = 0; k < cols; ++k) x[k] = element_as_float(src, r * cols + k);
    }
    quantize_row(dst.dtype, x.data(), cols, dst.ptr<uint8_t>() + r * row_bytes);
  }
}

}  // namespace

std::string QuantizeSummary::line() const {
  std::ostringstream s;
  s.precision(2);
  s << std::fixed << "quantized " << matrices << " matrices to " << quant_format_name(format);
  if (formats.size() > 1 || (formats.size() == 1 && formats.begin()->first != format)) {
    std::string sep = " (";
    for (const auto& [f, count] : formats) {
      s << sep << quant_format_name(f) << " " << count;
      sep = ", ";
    }
    s << ")";
  }
  s << ", " << bits_per_weight << " bits per weight, in " << seconds << " s on " << threads
    << " thread" << (threads == 1 ? "" : "s") << ": weights " << mb(bytes_before) << " -> "
    << mb(bytes_after);
  return s.str();
}

std::optional<DType> quantization_for(const std::string& flag_value, const ModelConfig& cfg) {
  if (flag_value.empty() || flag_value == "none") return std::nullopt;
  const DType format = quant_format_from_name(flag_value, "--quantization");
  if (cfg.quantization && cfg.quantization->format != format) {
    throw Error("--quantization " + flag_value + ": the checkpoint is already quantized to " +
                cfg.quantization->description() + "; load it without --quantization");
  }
  const struct {
    const char* field;
    int64_t cols;
  } widths[] = {{"hidden_size", cfg.hidden_size},
                {"intermediate_size", cfg.intermediate_size},
                {"num_attention_heads x head_dim", int64_t{cfg.num_heads} * cfg.head_dim}};
  for (const auto& w : widths) {
    if (w.cols % kQuantBlock != 0) {
      throw Error("--quantization " + flag_value + ": " + w.field + " " + std::to_string(w.cols) +
                  " is not a multiple of " + std::to_string(kQuantBlock) +
                  " (weights are quantized in blocks of 32 along a row)");
    }
  }
  return format;
}

QuantizeSummary quantize_model_weights(ModelWeights& w, DType format, int threads,
                                       const std::function<void(const Tensor&)>& release) {
  const auto start = std::chrono::steady_clock::now();
  QuantizeSummary summary;
  summary.format = format;
  summary.bytes_before = w.total_bytes();
  if (w.quant_format && *w.quant_format != format) {
    throw Error("quantize: the weights are already " + quant_format_name(*w.quant_format));
  }
  const bool tied = w.lm_head.data == w.embed_tokens.data;
  // The distinct float matrices, each with its new tensor.
  struct Job {
    Tensor* slot;
    Tensor src, dst;
  };
  std::vector<Job> jobs;
  for (const auto [slot, role] : matrix_slots(w)) {
    if (!slot->defined() || is_block_quantized(slot->dtype)) continue;
    if (tied && slot == &w.lm_head) continue;  // the embedding's job covers it
    const DType f = recipe_matrix_format(format, role, slot->dim(1));
    jobs.push_back({slot, *slot, Tensor::empty(slot->shape, f)});
    ++summary.formats[f];
  }
  // Work in chunks of rows so that a few large matrices (the LM head) spread over threads.
  constexpr int64_t kRowsPerChunk = 256;
  struct Chunk {
    size_t job;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int64_t rows = jobs[j].src.dim(0);
    for (int64_t r = 0; r < rows; r += kRowsPerChunk)
      chunks.push_back({j, r, std::min(rows, r + kRowsPerChunk)});
  }
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int n = std::max(1, std::min(threads > 0 ? threads : hw, static_cast<int>(chunks.size())));
  std::atomic<size_t> next{0};
  std::vector<std::string> errors(static_cast<size_t>(n));
  auto work = [&](int t) {
    try {
      for (size_t c = next++; c < chunks.size(); c = next++) {
        Job& job = jobs[chunks[c].job];
        quantize_rows(job.src, job.dst, chunks[c].begin, chunks[c].end);
      }
    } catch (const std::exception& e) {
      errors[t] = e.what();
      next = chunks.size();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::string& e : errors) {
    if (!e.empty()) throw Error("--quantization " + quant_format_name(format) + ": " + e);
  }
  for (Job& job : jobs) {
    *job.slot = job.dst;
    if (tied && job.slot == &w.embed_tokens) w.lm_head = job.dst;
    if (release) release(job.src);
    job.src = Tensor{};
  }
  w.quant_format = format;
  summary.matrices = static_cast<int>(jobs.size());
  summary.threads = n;
  summary.bytes_after = w.total_bytes();
  summary.bits_per_weight = quantized_bits_per_weight(w);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

void drop_resident_pages(const Tensor& t) {
  if (!t.defined() || t.device != Device::CPU) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + t.nbytes()) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

size_t resident_memory_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

}  // namespace attnres
