// The next-token distributions `attnres perplexity --save-logits` writes and `--kl-base` reads
// back, and the statistics of one distribution against another (llama-perplexity's
// --kl-divergence-base / --kl-divergence, in our own file).
//
// File (little-endian): the 8 bytes "ARLPROB1"; int32 ctx, vocab, chunks; the chunks * ctx
// token ids; then for each chunk, for each scored position (ctx / 2 .. ctx - 2, the one
// predicting the next token), one row: float scale, float min_log_prob, uint16 q[vocab], the
// log-probabilities as min_log_prob + scale * q. As in llama.cpp's file, the range kept is the
// top 16 nats below the largest logit (lower entries read as its bottom), quantized to 65535
// steps: a log-probability is off by at most 16 / 65535 / 2 = 1.2e-4.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace attnres::cli {

// The first scored position of a ctx-token chunk: the first half is context only, as in
// llama-perplexity.
inline int first_scored_position(int ctx) { return ctx / 2; }
inline int scored_per_chunk(int ctx) { return ctx - 1 - first_scored_position(ctx); }

struct LogProbHeader {
  int32_t ctx = 0;
  int32_t vocab = 0;
  int32_t chunks = 0;
  std::vector<int32_t> tokens;  // chunks * ctx
};

// One quantized row (see the file comment).
struct LogProbRow {
  float scale = 0.0f;
  float min_log_prob = 0.0f;
  std::vector<uint16_t> q;
  double log_prob(int32_t token) const { return min_log_prob + double(scale) * q[token]; }
};

// Quantizes the row of raw logits `logits` (any scale: normalized here).
LogProbRow quantize_log_probs(std::span<const float> logits);

class LogProbWriter {
 public:
  LogProbWriter(const std::string& path, const LogProbHeader& header);
  void write(const LogProbRow& row);
  void close();  // flushes; throws on a short write

 private:
  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
};

class LogProbReader {
 public:
  explicit LogProbReader(const std::string& path);
  const LogProbHeader& header() const { return header_; }
  LogProbRow next();  // the next row; throws past the end

 private:
  std::string path_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
  LogProbHeader header_;
};

// Negative log-likelihood of `token` under raw logits, and the distribution's statistics
// against a base row: KL(base || this), whether both put the same token on top.
struct RowScore {
  double nll = 0.0;
  double nll_base = 0.0;
  double kl = 0.0;
  bool same_top = false;
};
RowScore score_against_base(std::span<const float> logits, const LogProbRow& base, int32_t token);

// The summary over every scored position.
struct KlSummary {
  size_t count = 0;
  double ppl = 0.0, ppl_base = 0.0;
  double kl_mean = 0.0, kl_max = 0.0, kl_median = 0.0, kl_p99 = 0.0, kl_p999 = 0.0;
  double same_top_fraction = 0.0;
};
KlSummary summarize_scores(const std::vector<RowScore>& scores);

}  // namespace attnres::cli
