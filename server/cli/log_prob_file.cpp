#include "server/cli/log_prob_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"

namespace attnres::cli {
namespace {

constexpr char kMagic[8] = {'A', 'R', 'L', 'P', 'R', 'O', 'B', '1'};
constexpr float kRangeNats = 16.0f;  // what a row keeps below its largest logit
constexpr float kSteps = 65535.0f;

FILE* open_or_throw(const std::string& path, const char* mode) {
  FILE* f = std::fopen(path.c_str(), mode);
  if (!f) throw Error("cannot open " + path + (mode[0] == 'w' ? " for writing" : ""));
  return f;
}

void read_exact(FILE* f, void* data, size_t bytes, const std::string& path) {
  if (std::fread(data, 1, bytes, f) != bytes) {
    throw Error(path + ": truncated (not a complete attnres perplexity --save-logits file)");
  }
}

// log(sum(exp(x - max))) + max, in double.
double log_sum_exp(std::span<const float> x, float max) {
  double sum = 0.0;
  for (float v : x) sum += std::exp(double(v) - max);
  return std::log(sum) + max;
}

// Linear interpolation between the sorted values around `fraction`, as llama-perplexity does.
double percentile(const std::vector<double>& sorted, double fraction) {
  const double p = fraction * double(sorted.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const double w = p - double(i);
  return (1.0 - w) * sorted[i] + w * sorted[std::min(i + 1, sorted.size() - 1)];
}

}  // namespace

LogProbRow quantize_log_probs(std::span<const float> logits) {
  const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
  const float max_logit = *hi;
  const float min_logit = std::max(*lo, max_logit - kRangeNats);
  LogProbRow row;
  row.min_log_prob = static_cast<float>(min_logit - log_sum_exp(logits, max_logit));
  row.scale = (max_logit - min_logit) / kSteps;
  row.q.assign(logits.size(), 0);
  if (row.scale > 0.0f) {
    const float inv = 1.0f / row.scale;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] > min_logit) {
        row.q[i] = static_cast<uint16_t>(std::lround((logits[i] - min_logit) * inv));
      }
    }
  }
  return row;
}

LogProbWriter::LogProbWriter(const std::string& path, const LogProbHeader& h)
    : path_(path), file_(open_or_throw(path, "wb"), &std::fclose) {
  const int32_t dims[3] = {h.ctx, h.vocab, h.chunks};
  std::fwrite(kMagic, 1, sizeof(kMagic), file_.get());
  std::fwrite(dims, sizeof(int32_t), 3, file_.get());
  std::fwrite(h.tokens.data(), sizeof(int32_t), h.tokens.size(), file_.get());
}

void LogProbWriter::write(const LogProbRow& row) {
  std::fwrite(&row.scale, sizeof(float), 1, file_.get());
  std::fwrite(&row.min_log_prob, sizeof(float), 1, file_.get());
  std::fwrite(row.q.data(), sizeof(uint16_t), row.q.size(), file_.get());
}

void LogProbWriter::close() {
  FILE* f = file_.release();
  const bool failed = std::ferror(f) != 0;
  if (std::fclose(f) != 0 || failed) throw Error("short write to " + path_);
}

LogProbReader::LogProbReader(const std::string& path)
    : path_(path), file_(open_or_throw(path, "rb"), &std::fclose) {
  char magic[sizeof(kMagic)];
  read_exact(file_.get(), magic, sizeof(magic), path_);
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    throw Error(path_ + ": not an attnres perplexity --save-logits file");
  }
  int32_t dims[3];
  read_exact(file_.get(), dims, sizeof(dims), path_);
  header_.ctx = dims[0];
  header_.vocab = dims[1];
  header_.chunks = dims[2];
  if (header_.ctx < 4 || header_.vocab < 1 || header_.chunks < 1 ||
      int64_t(header_.ctx) * header_.chunks > (int64_t(1) << 30)) {
    throw Error(path_ + ": implausible header (ctx " + std::to_string(header_.ctx) + ", vocab " +
                std::to_string(header_.vocab) + ", chunks " + std::to_string(header_.chunks) + ")");
  }
  header_.tokens.resize(size_t(header_.ctx) * header_.chunks);
  read_exact(file_.get(), header_.tokens.data(), header_.tokens.size() * sizeof(int32_t), path_);
}

LogProbRow LogProbReader::next() {
  LogProbRow row;
  read_exact(file_.get(), &row.scale, sizeof(float), path_);
  read_exact(file_.get(), &row.min_log_prob, sizeof(float), path_);
  row.q.resize(header_.vocab);
  read_exact(file_.get(), row.q.data(), row.q.size() * sizeof(uint16_t), path_);
  return row;
}

RowScore score_against_base(std::span<const float> logits, const LogProbRow& base, int32_t token) {
  const auto top = std::max_element(logits.begin(), logits.end());
  const double lse = log_sum_exp(logits, *top);
  RowScore s;
  s.nll = lse - logits[token];
  s.nll_base = -base.log_prob(token);
  size_t base_top = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (base.q[i] > base.q[base_top]) base_top = i;
    // Entries below e^-16 are left out, as in llama-perplexity (the file does not hold them).
    const double lp_base = base.log_prob(static_cast<int32_t>(i));
    if (lp_base > -double(kRangeNats)) s.kl += std::exp(lp_base) * (lp_base - (logits[i] - lse));
  }
  s.same_top = base_top == static_cast<size_t>(top - logits.begin());
  return s;
}

KlSummary summarize_scores(const std::vector<RowScore>& scores) {
  KlSummary out;
  out.count = scores.size();
  if (scores.empty()) return out;
  double nll = 0.0, nll_base = 0.0, kl = 0.0;
  size_t same = 0;
  std::vector<double> kls;
  kls.reserve(scores.size());
  for (const RowScore& s : scores) {
    nll += s.nll;
    nll_base += s.nll_base;
    kl += s.kl;
    same += s.same_top ? 1 : 0;
    kls.push_back(s.kl);
  }
  std::sort(kls.begin(), kls.end());
  const double n = double(scores.size());
  out.ppl = std::exp(nll / n);
  out.ppl_base = std::exp(nll_base / n);
  out.kl_mean = kl / n;
  out.kl_max = kls.back();
  out.kl_median = percentile(kls, 0.5);
  out.kl_p99 = percentile(kls, 0.99);
  out.kl_p999 = percentile(kls, 0.999);
  out.same_top_fraction = double(same) / n;
  return out;
}

}  // namespace attnres::cli
