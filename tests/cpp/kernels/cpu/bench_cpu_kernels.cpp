// Microbenchmark (not a test): bf16 linear throughput of the CPU backend on the 100M and 0.6B
// models' shapes, against the machine's measured copy bandwidth.
// - GEMV (R = 1 and 8; the MLP and LM head shapes): GB/s of weight bytes streamed. "cold"
//   cycles through enough weight copies (>= 512 MiB) that every call reads DRAM, the
//   decode-step situation; "hot" repeats one matrix, which stays in cache when it fits (an
//   upper bound, not a roofline figure).
// - GEMM (prefill: R = 128 and 512 rows, the 100M and 0.6B shapes' projections): GFLOP/s =
//   2 R K N / time. GEMV and GEMM also with bf16 linear inputs where the build has AVX512_BF16
//   (CpuBackend::set_bf16_linear_inputs).
// - Depth mix (`full`'s ops for one 128-token prefill of the 0.6B shape, 56 mixing sublayers
//   in 7 Phase-1 groups of 8, d 1024, and of the 100M one, 24 in 3, d 512): ms per prefill
//   for Phase 1 (all groups) and Phase 2 (every step, with the newer entries its group's
//   Phase 1 did not read), f32 and bf16 bank; Phase 2 also as `delta` runs it (the partial
//   added, not a source: the general kernel); and the twin's PreNorms Phase 2 stands in for.
//   Then delta_v's attention steps (every other sublayer), whose K and V streams mix the same
//   sources: as two depth_phase2_prenorm calls and as one depth_phase2_prenorm_pair. And
//   `full`'s pushes (add_inplace_push: the residual add that also writes the next bank
//   entry) against the twin's residual adds.
//   The bank (15-30 MB) stays in L3 between calls here; in a forward the GEMMs' weights pass
//   through the cache between them.
// - Sampling (`sample`: batch 64, vocabulary 151936, rows of random temperature / top-k /
//   top-p / min-p / penalties): ms per step for the engine's host path (one Sampler after
//   another, on one thread) and for CpuBackend::sample (the same rows on the worker pool).
// - Attention: a 128-, 512- and 2048-token prefill's attention over a bf16 cache, and a decode
//   step of 8 sequences at context 160 and 2048, the 100M and 0.6B shapes, with f32 and
//   (AVX512_BF16 builds) bf16 inputs (ms per call).
// - `bench_cpu_kernels quant` (only then): linear over int8 / int6 / int4 / int4k weights
//   against bf16 (bench_quant_linear.cpp).
// Best of several repetitions; run it on an idle machine. `bench_cpu_kernels gemm` (or
// `depth`, `attention`, `sample`) runs only that part; `gemv` only the GEMV with bf16 inputs
// (decode's path on a bf16 checkpoint where AVX512_BF16 runs).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/sample/sampler.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/memory_bandwidth.h"
#include "tests/cpp/kernels/cpu/bench_quant_linear.h"

using namespace attnres;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Tensor random_bf16(int64_t rows, int64_t cols, std::mt19937& rng) {
  Tensor t = Tensor::empty({rows, cols}, DType::BF16);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto* p = t.ptr<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(dist(rng));
  return t;
}

// Best seconds per call over `reps` timed sweeps of all weight copies.
double time_linear(Backend& be, const Tensor& x, std::vector<Tensor>& ws, Tensor& out, int reps) {
  double best = 1e30;
  for (auto& w : ws) be.linear(x, w, nullptr, out);  // warm-up
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    for (auto& w : ws) be.linear(x, w, nullptr, out);
    best = std::min(best, (now_s() - t0) / static_cast<double>(ws.size()));
  }
  return best;
}

// The GEMV table: decode-sized rows, cold (DRAM) and hot weights, against the copy bandwidth.
void run_gemv(Backend* be, std::mt19937& rng) {
  const double copy_gbps = measure_copy_bandwidth_gbps();
  std::printf("copy bandwidth (read + write, 2 x 256 MiB): %.1f GB/s\n\n", copy_gbps);
  // in -> out: 100M's gate/up, down and LM head; 0.6B's gate/up, down and LM head.
  const int64_t shapes[][2] = {{512, 1536},  {1536, 512},  {512, 151936},
                               {1024, 3072}, {3072, 1024}, {1024, 151936}};
  std::printf("%-16s %3s %6s %9s %9s %8s\n", "bf16 GEMV", "R", "mode", "us/call", "GB/s",
              "of copy");
  for (auto& s : shapes) {
    const int64_t in = s[0], out_n = s[1];
    const double bytes = 2.0 * in * out_n;
    const int copies = static_cast<int>(std::max(1.0, (512.0 * (1 << 20)) / bytes));
    std::vector<Tensor> cold;
    for (int i = 0; i < copies; ++i) cold.push_back(random_bf16(out_n, in, rng));
    std::vector<Tensor> hot = {cold[0]};
    for (int64_t r : {1, 8}) {
      Tensor x = Tensor::empty({r, in}, DType::F32);
      for (int64_t i = 0; i < x.numel(); ++i)
        x.ptr<float>()[i] = 0.01f * static_cast<float>(i % 97);
      Tensor out = Tensor::empty({r, out_n}, DType::F32);
      for (auto* mode : {"cold", "hot"}) {
        const bool is_cold = mode[0] == 'c';
        const double t = time_linear(*be, x, is_cold ? cold : hot, out, is_cold ? 5 : 200);
        std::printf("%5lld -> %-7lld %3lld %6s %9.1f %9.1f %7.0f%%\n", (long long)in,
                    (long long)out_n, (long long)r, mode, t * 1e6, bytes / t / 1e9,
                    100.0 * bytes / t / 1e9 / copy_gbps);
      }
    }
  }
  std::printf("\n");
}

Tensor random_f32(const Shape& shape, std::mt19937& rng, float scale) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = dist(rng);
  return t;
}

// The depth table for one shape: `full`'s Phase 1 and Phase 2 over one prefill, per bank
// dtype, `delta`'s Phase 2 (its Phase 1 is full's), and the plain twin's PreNorms (rms_norm,
// once per mixing sublayer) that Phase 2 replaces: Phase 1 + Phase 2 - PreNorm is what the
// depth mix adds to a prefill. As in the forward, the first group (a shared prefix of one
// entry) runs no Phase 1 where the backend mixes without it (Backend::mixes_without_phase1).
void run_depth_shape(Backend* be, std::mt19937& rng, const char* name, int64_t d, int groups) {
  constexpr int64_t T = 128;
  constexpr int kSlots = 8;
  const int entries = 1 + groups * kSlots;
  constexpr int kReps = 15;
  const Tensor bank_f32 = random_f32({entries, T, d}, rng, 1.0f);
  const Tensor queries = random_f32({kSlots, d}, rng, 0.05f);
  const Tensor gain = random_f32({d}, rng, 1.0f);
  Tensor partial = random_f32({T, d}, rng, 1.0f);
  Tensor m = Tensor::empty({kSlots, T}, DType::F32), s = Tensor::empty({kSlots, T}, DType::F32);
  Tensor o = Tensor::empty({kSlots, T, d}, DType::F32), out = Tensor::empty({T, d}, DType::F32);
  Tensor out_v = Tensor::empty({T, d}, DType::F32);
  auto prenorms = [&] {
    for (int i = 0; i < groups * kSlots; ++i) be->rms_norm(partial, gain, 1e-6f, out);
  };
  // The twin's residual adds, one per sublayer (a forward's pushes replace them).
  Tensor sublayer_out = random_f32({T, d}, rng, 0.01f);
  auto adds = [&] {
    for (int i = 0; i < groups * kSlots; ++i) be->add_inplace(partial, sublayer_out);
  };
  double best_norm = 1e30, best_adds = 1e30;
  for (int r = 0; r < kReps; ++r) {
    double t0 = now_s();
    prenorms();
    best_norm = std::min(best_norm, now_s() - t0);
    t0 = now_s();
    adds();
    best_adds = std::min(best_adds, now_s() - t0);
  }
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor bank = be->alloc(bank_f32.shape, dtype);
    be->copy(bank_f32, bank);
    const int skipped =
        be->capabilities().mixes_without_phase1 ? 1 : 0;  // groups without a Phase 1
    auto phase1 = [&] {
      for (int g = skipped; g < groups; ++g)
        be->depth_phase1(queries, bank, 1 + kSlots * g, 1e-6f, m, s, o);
    };
    // Calls fn with the mix of `slot` in group g over the entries before `newer_end`: `full`'s
    // (the partial a source, a bias) or `delta`'s (the partial added).
    auto with_mix = [&](int g, int slot, int newer_end, bool delta, auto&& fn) {
      const bool stateless = g < skipped;
      const int first_newer = stateless ? 0 : 1 + kSlots * g;
      const Tensor ms = m.row(slot), ss = s.row(slot), os = o.row(slot), q = queries.row(slot);
      const Tensor newer = bank.rows(first_newer, newer_end);
      Backend::DepthMixArgs mix;
      if (!stateless) {
        mix.m = &ms;
        mix.s = &ss;
        mix.o = &os;
      }
      mix.query = &q;
      mix.newer = newer.dim(0) > 0 ? &newer : nullptr;
      mix.bias = delta ? 0.0f : 0.1f;
      mix.partial_is_source = !delta;
      mix.adds_partial = delta;
      fn(mix);
    };
    auto phase2 = [&](bool delta) {
      for (int g = 0; g < groups; ++g) {
        for (int slot = 0; slot < kSlots; ++slot) {
          with_mix(g, slot, 1 + kSlots * g + slot, delta, [&](const Backend::DepthMixArgs& mix) {
            be->depth_phase2_prenorm(mix, partial, gain, 1e-6f, out);
          });
        }
      }
    };
    // delta_v's attention steps: a K and a V stream (neighbouring query rows) over the same
    // entries, for every other slot, as two calls or as one depth_phase2_prenorm_pair.
    auto phase2_streams = [&](bool pair) {
      for (int g = 0; g < groups; ++g) {
        for (int slot = 0; slot + 1 < kSlots; slot += 2) {
          const int newer_end = 1 + kSlots * g + slot;
          with_mix(g, slot, newer_end, true, [&](const Backend::DepthMixArgs& k_mix) {
            with_mix(g, slot + 1, newer_end, true, [&](const Backend::DepthMixArgs& v_mix) {
              if (pair) {
                be->depth_phase2_prenorm_pair(k_mix, v_mix, partial, gain, 1e-6f, out, out_v);
              } else {
                be->depth_phase2_prenorm(k_mix, partial, gain, 1e-6f, out);
                be->depth_phase2_prenorm(v_mix, partial, gain, 1e-6f, out_v);
              }
            });
          });
        }
      }
    };
    // `full`'s pushes: the residual add that also writes the next bank entry, every sublayer.
    auto pushes = [&] {
      for (int i = 0; i < groups * kSlots; ++i) {
        Tensor entry = bank.row(1 + i);
        be->add_inplace_push(partial, sublayer_out, entry, Backend::PushedRow::Sum);
      }
    };
    double best1 = 1e30, best2 = 1e30, best2_delta = 1e30, best_two = 1e30, best_pair = 1e30;
    double best_push = 1e30;
    phase1();  // warm-up (and the Phase-1 state Phase 2 reads)
    for (int r = 0; r < kReps; ++r) {
      double t0 = now_s();
      phase1();
      best1 = std::min(best1, now_s() - t0);
      t0 = now_s();
      phase2(false);
      best2 = std::min(best2, now_s() - t0);
      t0 = now_s();
      phase2(true);
      best2_delta = std::min(best2_delta, now_s() - t0);
      t0 = now_s();
      phase2_streams(false);
      best_two = std::min(best_two, now_s() - t0);
      t0 = now_s();
      phase2_streams(true);
      best_pair = std::min(best_pair, now_s() - t0);
      t0 = now_s();
      pushes();
      best_push = std::min(best_push, now_s() - t0);
    }
    std::printf(
        "depth (%s shape, d %lld, T %lld, %d groups of %d) %s bank: Phase 1 %.3f ms, Phase 2 "
        "%.3f ms (delta's %.3f), twin's PreNorms %.3f ms per prefill\n",
        name, (long long)d, (long long)T, groups, kSlots, dtype == DType::BF16 ? "bf16" : "f32 ",
        best1 * 1e3, best2 * 1e3, best2_delta * 1e3, best_norm * 1e3);
    std::printf("  delta_v's two streams at %d steps: two calls %.3f ms, one pair %.3f ms\n",
                groups * kSlots / 2, best_two * 1e3, best_pair * 1e3);
    std::printf("  pushes (add + entry) %.3f ms, the twin's adds %.3f ms per prefill\n",
                best_push * 1e3, best_adds * 1e3);
  }
}

// The 0.6B shape (56 mixing sublayers in 7 groups of 8, d 1024) and the 100M one (24 in 3
// groups, d 512).
void run_depth(Backend* be, std::mt19937& rng) {
  run_depth_shape(be, rng, "0.6B", 1024, 7);
  run_depth_shape(be, rng, "100M", 512, 3);
  std::printf("\n");
}

// Host sampling (the engine's path before device sampling) against CpuBackend::sample.
void run_sample(Backend& be, std::mt19937& rng) {
  constexpr int kRows = 64, kVocab = 151936, kReps = 5;
  std::normal_distribution<float> body(0.0f, 2.5f);
  std::vector<float> logits(static_cast<size_t>(kRows) * kVocab);
  for (float& l : logits) l = body(rng);
  std::vector<SamplingParams> params(kRows);
  std::vector<int32_t> prompt(512), output(64);
  for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % kVocab);
  for (int32_t& id : output) id = static_cast<int32_t>(rng() % kVocab);
  for (int r = 0; r < kRows; ++r) {
    SamplingParams& p = params[r];
    p.seed = r;
    p.temperature = r % 8 == 0 ? 0.0f : 0.8f;
    p.top_k = r % 3 == 0 ? 50 : 0;
    p.top_p = r % 2 == 0 ? 0.95f : 1.0f;
    p.min_p = r % 5 == 0 ? 0.05f : 0.0f;
    p.repetition_penalty = r % 4 == 0 ? 1.1f : 1.0f;
    p.frequency_penalty = r % 6 == 0 ? 0.2f : 0.0f;
  }
  const std::vector<int32_t> eos = {151645};
  Tensor t = Tensor::empty({kRows, kVocab}, DType::F32);
  double host_best = 1e30, op_best = 1e30;
  for (int rep = 0; rep < kReps; ++rep) {
    std::vector<float> scratch = logits;
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kRows; ++r) {
      Sampler sampler(params[r], 1);
      sampler.sample(std::span<float>(scratch.data() + static_cast<size_t>(r) * kVocab, kVocab),
                     prompt, output, eos, nullptr);
    }
    host_best = std::min(
        host_best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::copy(logits.begin(), logits.end(), t.ptr<float>());
    SampleBatch batch;
    batch.decodable = kVocab;
    for (int r = 0; r < kRows; ++r)
      Sampler(params[r], 1).add_device_row(prompt, output, eos, batch);
    std::vector<int32_t> ids(kRows);
    start = std::chrono::steady_clock::now();
    be.sample(t, batch, ids);
    op_best = std::min(
        op_best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("sample batch %d vocab %d: host Sampler %.2f ms, CpuBackend::sample %.2f ms\n", kRows,
              kVocab, host_best * 1e3, op_best * 1e3);
}

// A bf16 cache holding `tokens` random K / V rows in consecutive slots (blocks of 16).
KvCacheLayer random_cache(Backend* be, int tokens, int hkv, int hd, std::mt19937& rng) {
  constexpr int kBlockSize = 16;
  const int blocks = (tokens + kBlockSize - 1) / kBlockSize, row = hkv * hd;
  KvCacheLayer cache{be->alloc({blocks, kBlockSize, hkv, hd}, DType::BF16),
                     be->alloc({blocks, kBlockSize, hkv, hd}, DType::BF16)};
  BatchMeta fill;
  fill.num_tokens = tokens;
  fill.query_start = {0, tokens};
  fill.context_len = {tokens};
  fill.block_tables.resize(1);
  for (int b = 0; b < blocks; ++b) fill.block_tables[0].push_back(b);
  for (int t = 0; t < tokens; ++t) {
    fill.positions.push_back(t);
    fill.slot_mapping.push_back(t);
    fill.token_ids.push_back(0);
  }
  const Tensor k = random_f32({tokens, row}, rng, 1.0f), v = random_f32({tokens, row}, rng, 1.0f);
  be->store_kv(k, v, fill, cache);
  return cache;
}

// `seqs` sequences of `ctx` positions each, sequence s in slots [s * ctx, (s + 1) * ctx) (ctx
// a multiple of 16); the query tokens of each: all of them (prefill) or the last (a decode).
BatchMeta attention_batch(int seqs, int ctx, bool prefill) {
  BatchMeta batch;
  batch.query_start.push_back(0);
  for (int s = 0; s < seqs; ++s) {
    for (int p = prefill ? 0 : ctx - 1; p < ctx; ++p) {
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(s * ctx + p);
      batch.token_ids.push_back(0);
    }
    batch.query_start.push_back(static_cast<int32_t>(batch.positions.size()));
    batch.context_len.push_back(ctx);
    std::vector<int32_t> table;
    for (int b = 0; b < ctx / 16; ++b) table.push_back(s * ctx / 16 + b);
    batch.block_tables.push_back(table);
  }
  batch.num_tokens = static_cast<int>(batch.positions.size());
  return batch;
}

// Attention, per shape: a prefill of T tokens of one sequence (its whole causal attention
// over the cache it filled) and a decode step of 8 sequences at context C, each timed with f32
// inputs and, where the build has AVX512_BF16, with bf16 inputs (q and the softmax weights
// rounded: cpu_attention_bf16.h); best of several calls, ms per call.
void run_attention(CpuBackend* be, std::mt19937& rng) {
  struct Shape {
    const char* name;
    int hq, hkv, hd;
  };
  struct Case {
    int seqs, ctx;
    bool prefill;
  };
  for (const Shape& sh : {Shape{"100M", 8, 4, 64}, Shape{"0.6B", 16, 8, 128}}) {
    for (const Case c : {Case{1, 128, true}, Case{1, 512, true}, Case{1, 2048, true},
                         Case{8, 160, false}, Case{8, 2048, false}}) {
      const KvCacheLayer cache = random_cache(be, c.seqs * c.ctx, sh.hkv, sh.hd, rng);
      const BatchMeta batch = attention_batch(c.seqs, c.ctx, c.prefill);
      const Tensor q = random_f32({batch.num_tokens, sh.hq * sh.hd}, rng, 1.0f);
      Tensor out = Tensor::empty({batch.num_tokens, sh.hq * sh.hd}, DType::F32);
      const int reps = c.prefill ? (c.ctx > 512 ? 3 : 8) : 50;
      auto best_ms = [&] {
        double best = 1e30;
        for (int rep = 0; rep < reps; ++rep) {
          const double t0 = now_s();
          be->attention(q, cache, batch, sh.hd, 0.1f, out);
          best = std::min(best, now_s() - t0);
        }
        return best * 1e3;
      };
      if (c.prefill) {
        std::printf("attention %s (Hq %d, Hkv %d, hd %d), %d-token prefill, bf16 cache: %.3f ms",
                    sh.name, sh.hq, sh.hkv, sh.hd, c.ctx, best_ms());
      } else {
        std::printf("attention %s (Hq %d, Hkv %d, hd %d), %d decodes at context %d, bf16 cache: "
                    "%.4f ms", sh.name, sh.hq, sh.hkv, sh.hd, c.seqs, c.ctx, best_ms());
      }
      if (CpuBackend::bf16_linear_inputs_supported()) {
        const bool was = be->bf16_linear_inputs();
        be->set_bf16_linear_inputs(true);
        std::printf(", with bf16 inputs %.4f ms", best_ms());
        be->set_bf16_linear_inputs(was);
      }
      std::printf("\n");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  auto be = std::make_unique<CpuBackend>(0);
  std::printf("backend: %s\n", be->name().c_str());
  std::mt19937 rng(1);
  if (only == "sample") {
    run_sample(*be, rng);
    return 0;
  }
  if (only == "quant") {  // only on request: it allocates and streams ~1.5 GiB per shape
    run_quant_linear(*be);
    return 0;
  }
  if (only.empty()) run_gemv(be.get(), rng);
  if ((only.empty() || only == "gemv") && CpuBackend::bf16_linear_inputs_supported()) {
    std::printf("with bf16 linear inputs:\n");
    be->set_bf16_linear_inputs(true);
    run_gemv(be.get(), rng);
    be->set_bf16_linear_inputs(false);
  }
  if (only == "gemv") {
    if (!CpuBackend::bf16_linear_inputs_supported())
      std::printf("gemv: this build has no AVX512_BF16, so no GEMV with bf16 inputs to time\n");
    return 0;
  }
  if (only.empty() || only == "depth") run_depth(be.get(), rng);
  if (only == "depth") return 0;
  if (only.empty() || only == "attention") run_attention(be.get(), rng);
  if (only == "attention") return 0;
  // {R, K (in), N (out)}: 100M's q/gate/up (512 -> 1536) and down (1536 -> 512); 0.6B's
  // gate/up (1024 -> 3072) and down (3072 -> 1024).
  const int64_t gemms[][3] = {{512, 512, 1536},  {512, 1536, 512},  {128, 1024, 3072},
                              {128, 3072, 1024}, {512, 1024, 3072}, {512, 3072, 1024}};
  for (auto& g : gemms) {
    const int64_t r = g[0], in = g[1], out_n = g[2];
    std::vector<Tensor> w = {random_bf16(out_n, in, rng)};
    Tensor x = Tensor::empty({r, in}, DType::F32);
    for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = 0.01f * static_cast<float>(i % 97);
    Tensor out = Tensor::empty({r, out_n}, DType::F32);
    for (const bool bf16_inputs : {false, true}) {
      if (bf16_inputs && !CpuBackend::bf16_linear_inputs_supported()) continue;
      be->set_bf16_linear_inputs(bf16_inputs);
      const double t = time_linear(*be, x, w, out, 20);
      std::printf("bf16 GEMM R=%lld %lld -> %lld, %s inputs: %.2f ms, %.1f GFLOP/s\n",
                  (long long)r, (long long)in, (long long)out_n, bf16_inputs ? "bf16" : "f32",
                  t * 1e3, 2.0 * r * in * out_n / t / 1e9);
    }
  }
  return 0;
}
