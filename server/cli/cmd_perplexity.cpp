// attnres perplexity: the accuracy of a model (or of a quantized copy against its base) over a
// text, as llama-perplexity measures it. The text's tokens (no special tokens added) are cut
// into --ctx-token chunks; each chunk runs as one prefill from an empty cache, and the
// positions of its second half (ctx / 2 .. ctx - 2) are scored on the token after them. Prints
// the perplexity; --save-logits FILE keeps every scored next-token distribution
// (log_prob_file.h); --kl-base FILE scores against such a file instead: KL divergence of
// this model's distribution from the base's (mean, median, 99th / 99.9th percentile, max),
// how often both put the same token on top, and both perplexities.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/sched/batch_builder.h"
#include "engine/sched/model_execution.h"
#include "server/cli/commands.h"
#include "server/cli/log_prob_file.h"

namespace attnres::cli {
namespace {

std::vector<FlagSpec> perplexity_flags() {
  std::vector<FlagSpec> specs = model_flags();
  std::vector<FlagSpec> own = {
      {"file", "TEXT_FILE", "the text to score (required)"},
      {"ctx", "N", "tokens per chunk (default 512); the second half of each is scored"},
      {"chunks", "N", "score at most the first N chunks (default: every whole chunk)"},
      {"save-logits", "FILE", "write every scored next-token distribution to FILE"},
      {"kl-base", "FILE", "score against a --save-logits FILE of the base model: KL divergence"},
      {"json", "", "print one JSON object with the results instead of text"},
  };
  specs.insert(specs.end(), own.begin(), own.end());
  return specs;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read --file " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The tokens of the text, whole chunks only, as the base file has them when there is one.
LogProbHeader chunked_tokens(const Flags& flags, const LoadedModel& model,
                             const std::optional<LogProbHeader>& base) {
  LogProbHeader h;
  h.ctx = flags.get_int("ctx", 512);
  if (h.ctx < 4) throw Error("--ctx must be >= 4");
  h.vocab = model.config.vocab_size;
  const std::vector<int32_t> ids = model.tokenizer->encode(read_text(flags.get("file")), false);
  h.chunks = static_cast<int32_t>(ids.size() / h.ctx);
  if (flags.has("chunks")) {
    const int limit = flags.get_int("chunks", 0);
    if (limit < 1) throw Error("--chunks must be >= 1");
    h.chunks = std::min(h.chunks, limit);
  }
  if (h.chunks == 0) {
    throw Error("--file has " + std::to_string(ids.size()) +
                " tokens, fewer than one --ctx chunk (" + std::to_string(h.ctx) + ")");
  }
  h.tokens.assign(ids.begin(), ids.begin() + int64_t(h.chunks) * h.ctx);
  if (base) {
    if (base->ctx != h.ctx || base->vocab != h.vocab) {
      throw Error("--kl-base was saved with ctx " + std::to_string(base->ctx) + ", vocab " +
                  std::to_string(base->vocab) + "; this run has ctx " + std::to_string(h.ctx) +
                  ", vocab " + std::to_string(h.vocab));
    }
    if (base->chunks < h.chunks) h.chunks = base->chunks;
    h.tokens.resize(size_t(h.chunks) * h.ctx);
    if (!std::equal(h.tokens.begin(), h.tokens.end(), base->tokens.begin())) {
      throw Error(
          "--kl-base holds other tokens than this --file gives (another text or tokenizer)");
    }
  }
  return h;
}

void print_summary(const KlSummary& s, bool kl, bool json) {
  if (json) {
    nlohmann::json j = {{"positions", s.count}, {"ppl", s.ppl}};
    if (kl) {
      j.update({{"ppl_base", s.ppl_base},
                {"kl_mean", s.kl_mean},
                {"kl_median", s.kl_median},
                {"kl_p99", s.kl_p99},
                {"kl_p999", s.kl_p999},
                {"kl_max", s.kl_max},
                {"same_top_fraction", s.same_top_fraction}});
    }
    std::cout << j.dump() << "\n";
    return;
  }
  std::printf("scored positions: %zu\nPPL:            %.6f\n", s.count, s.ppl);
  if (!kl) return;
  std::printf("PPL(base):      %.6f\nln(PPL/base):   %.6f\n", s.ppl_base,
              std::log(s.ppl / s.ppl_base));
  std::printf("Mean KLD:       %.6f\nMedian KLD:     %.6f\n99.0%% KLD:      %.6f\n", s.kl_mean,
              s.kl_median, s.kl_p99);
  std::printf("99.9%% KLD:      %.6f\nMaximum KLD:    %.6f\nSame top:       %.3f%%\n", s.kl_p999,
              s.kl_max, 100.0 * s.same_top_fraction);
}

}  // namespace

int run_perplexity(const std::vector<std::string>& args) {
  const auto specs = perplexity_flags();
  if (print_help_if_asked(args, "perplexity",
                          "Perplexity over a text file; KL divergence against a saved base.",
                          specs)) {
    return 0;
  }
  Flags flags(specs, args);
  if (!flags.has("file")) throw Error("--file is required");
  std::optional<LogProbReader> base;
  if (flags.has("kl-base")) base.emplace(flags.get("kl-base"));
  LoadedModel model = load_model_from_flags(flags);
  const LogProbHeader h =
      chunked_tokens(flags, model, base ? std::optional(base->header()) : std::nullopt);
  std::optional<LogProbWriter> save;
  if (flags.has("save-logits")) save.emplace(flags.get("save-logits"), h);

  const int block_size = 16;
  BlockManager blocks((h.ctx + block_size - 1) / block_size, block_size);
  auto exec =
      make_model_execution(engine_args_from_flags(flags), model, blocks.num_blocks(), block_size);
  const int first = first_scored_position(h.ctx);
  const int64_t vocab = h.vocab;
  std::vector<RowScore> scores;
  StepResult step;
  for (int c = 0; c < h.chunks; ++c) {
    const std::span<const int32_t> chunk(h.tokens.data() + int64_t(c) * h.ctx, h.ctx);
    SequenceBlocks seq;
    blocks.append(seq, h.ctx);
    StepBatch batch;
    add_to_batch(batch.meta, seq, chunk, block_size);
    for (int i = first; i < h.ctx - 1; ++i) batch.logit_rows.push_back(i);
    exec->runner->execute(batch, step);
    blocks.free(seq);
    for (int r = 0; r < scored_per_chunk(h.ctx); ++r) {
      const std::span<const float> row(step.logits.data() + r * vocab, vocab);
      const int32_t next = chunk[first + r + 1];
      if (save) save->write(quantize_log_probs(row));
      if (base) {
        scores.push_back(score_against_base(row, base->next(), next));
      } else {
        const float top = *std::max_element(row.begin(), row.end());
        double sum = 0.0;
        for (float v : row) sum += std::exp(double(v) - top);
        scores.push_back({.nll = std::log(sum) + top - row[next]});
      }
    }
    if (!flags.has("json")) {
      std::fprintf(stderr, "chunk %d/%d\n", c + 1, h.chunks);
    }
  }
  if (save) save->close();
  print_summary(summarize_scores(scores), base.has_value(), flags.has("json"));
  return 0;
}

}  // namespace attnres::cli
