// A serving-like workload for the caching allocator (kernels/cuda/cuda_allocator.h): prefill
// chunks of a random token count T in 1..8192 at the 0.6B shapes (d 1024, q 2048, kv 1024,
// MLP 3072, vocab 151936), each step allocating and freeing what a forward does in the
// order it does (f32 activations, bf16 copies for cuBLAS, attention statistics, the logits
// of R sequences), with long-lived allocations interleaved mid-step: a depth workspace
// regrown when T beats its capacity, KV-like chunks and small staging buffers that live for
// many steps. It checks as it goes that no two live allocations overlap, and records the
// peak of requested bytes live at once (the bound's yardstick).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attnres::cuda::testing {

// splitmix64: the same sequence with every standard library (std::uniform_int_distribution
// is not), so a seed's figures in NOTES.md hold everywhere.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t uniform(size_t lo, size_t hi) { return lo + next() % (hi - lo + 1); }  // [lo, hi]
  double unit() { return double(next() >> 11) / double(uint64_t{1} << 53); }    // [0, 1)

 private:
  uint64_t state_;
};

class PrefillWorkload {
 public:
  using Allocate = std::function<std::shared_ptr<void>(size_t bytes)>;
  // after_each runs after every allocation and every free (the invariant checks); a non-empty
  // return is a failure message, and the run stops with it.
  PrefillWorkload(Allocate allocate, std::function<std::string()> after_each)
      : allocate_(std::move(allocate)), after_each_(std::move(after_each)) {}

  // Runs `steps` steps; returns the first failure, or an empty string.
  std::string run(uint64_t seed, int steps) {
    Random rng(seed);
    for (int i = 0; i < steps && failure_.empty(); ++i) step(rng);
    long_lived_.clear();
    workspace_ = {};
    return failure_;
  }
  size_t peak_requested() const { return peak_; }
  size_t allocations() const { return allocations_; }

 private:
  struct Tensor {
    std::shared_ptr<void> memory;
    size_t bytes = 0;
  };
  static constexpr size_t kD = 1024, kQ = 2048, kKv = 1024, kMlp = 3072, kVocab = 151936;
  static constexpr size_t kHeads = 16, kF32 = 4, kBf16 = 2;

  Tensor alloc(size_t bytes) {
    Tensor t{allocate_(bytes), bytes};
    ++allocations_;
    const auto begin = reinterpret_cast<uintptr_t>(t.memory.get());
    auto next = live_.lower_bound(begin);
    if (next != live_.end() && next->first < begin + bytes)
      fail("overlaps the next live one", begin);
    if (next != live_.begin() && std::prev(next)->first + std::prev(next)->second > begin)
      fail("overlaps the previous live one", begin);
    live_[begin] = bytes;
    live_bytes_ += bytes;
    peak_ = std::max(peak_, live_bytes_);
    check();
    return t;
  }
  void drop(Tensor& t) {
    if (!t.memory) return;
    live_.erase(reinterpret_cast<uintptr_t>(t.memory.get()));
    live_bytes_ -= t.bytes;
    t = {};
    check();
  }
  template <class... Ts>
  void drop(Tensor& first, Ts&... rest) {
    drop(first);
    (drop(rest), ...);
  }
  void check() {
    if (!failure_.empty()) return;
    std::string message = after_each_();
    if (!message.empty()) failure_ = message;
  }
  void fail(const std::string& what, uintptr_t at) {
    if (failure_.empty()) failure_ = "allocation at " + std::to_string(at) + " " + what;
  }

  // The long-lived allocations, made at a random point inside a step.
  void maybe_touch_long_lived(Random& rng, int tokens) {
    if (tokens > workspace_tokens_) {  // the depth workspace regrows: new one first
      Tensor grown = alloc(size_t(tokens) * kD * kF32 * 4);
      drop(workspace_);
      workspace_ = std::move(grown);
      workspace_tokens_ = tokens;
    }
    if (rng.unit() < 0.02 && long_lived_.size() < 8) {  // a KV-like chunk
      long_lived_.push_back(alloc(rng.uniform(1, 32) << 20));
    }
    if (rng.unit() < 0.02) {  // a staging buffer regrown
      long_lived_.push_back(alloc(rng.uniform(4096, 256 << 10)));
    }
    if (rng.unit() < 0.03 && !long_lived_.empty()) {
      size_t i = rng.uniform(0, long_lived_.size() - 1);
      drop(long_lived_[i]);
      long_lived_.erase(long_lived_.begin() + i);
    }
  }

  void step(Random& rng) {
    const int T = int(rng.uniform(1, 8192));
    const int R = int(rng.uniform(1, size_t(std::min(T, 32))));
    const int long_lived_at = int(rng.uniform(0, 2));
    const size_t t = size_t(T), r = size_t(R);
    if (long_lived_at == 0) maybe_touch_long_lived(rng, T);
    Tensor ids = alloc(t * 4), positions = alloc(t * 4), slots = alloc(t * 4);
    Tensor tables = alloc(r * 64 * 4);
    Tensor hidden = alloc(t * kD * kF32);
    for (int layer = 0; layer < 2; ++layer) {
      Tensor normed = alloc(t * kD * kF32), normed_bf16 = alloc(t * kD * kBf16);
      Tensor q = alloc(t * kQ * kF32), k = alloc(t * kKv * kF32), v = alloc(t * kKv * kF32);
      drop(normed_bf16, normed);
      Tensor row_max = alloc(t * kHeads * 4 * kF32), row_sum = alloc(t * kHeads * 4 * kF32);
      Tensor attn = alloc(t * kQ * kF32);
      drop(q, k, v, row_max, row_sum);
      Tensor attn_bf16 = alloc(t * kQ * kBf16), o = alloc(t * kD * kF32);
      drop(attn_bf16, attn);
      Tensor residual = alloc(t * kD * kF32);
      drop(hidden, o);
      hidden = std::move(residual);
      if (layer == 0 && long_lived_at == 1) maybe_touch_long_lived(rng, T);
      normed = alloc(t * kD * kF32);
      normed_bf16 = alloc(t * kD * kBf16);
      Tensor gate = alloc(t * kMlp * kF32), up = alloc(t * kMlp * kF32);
      drop(normed_bf16, normed);
      Tensor act = alloc(t * kMlp * kF32);
      drop(gate, up);
      Tensor act_bf16 = alloc(t * kMlp * kBf16), down = alloc(t * kD * kF32);
      drop(act_bf16, act);
      residual = alloc(t * kD * kF32);
      drop(hidden, down);
      hidden = std::move(residual);
    }
    Tensor last = alloc(r * kD * kF32);
    drop(hidden);
    Tensor logits = alloc(r * kVocab * kF32);
    drop(last);
    if (long_lived_at == 2) maybe_touch_long_lived(rng, T);
    Tensor sampled = alloc(r * 4);
    drop(logits, sampled, ids, positions, slots, tables);
  }

  Allocate allocate_;
  std::function<std::string()> after_each_;
  std::map<uintptr_t, size_t> live_;  // address -> requested bytes
  size_t live_bytes_ = 0, peak_ = 0, allocations_ = 0;
  std::vector<Tensor> long_lived_;
  Tensor workspace_;
  int workspace_tokens_ = 0;
  std::string failure_;
};

}  // namespace attnres::cuda::testing
