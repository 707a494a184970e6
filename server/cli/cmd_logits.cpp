// attnres logits: the raw logits of a token sequence, for comparing the engine with an
// independent reference. The first --prefill tokens run as one prefill step (every
// position's logits kept); each later token runs as its own decode step through the KV
// cache, so both paths are checked. With --tensor-parallel-size the same steps run on a
// tensor-parallel group (the prefill step sequence-parallel when long enough).
#include <cstdio>
#include <memory>

#include "engine/core/error.h"
#include "engine/sched/batch_builder.h"
#include "engine/sched/model_execution.h"
#include "server/cli/commands.h"

namespace attnres::cli {
namespace {

// NumPy .npy v1.0 with a float32 C-order array.
void write_npy(const std::string& path, const std::vector<float>& data, int64_t rows,
               int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) + "), }";
  const size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!file) throw Error("cannot write " + path);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  std::fwrite(magic, 1, 8, file.get());
  std::fwrite(&header_len, 2, 1, file.get());
  std::fwrite(header.data(), 1, header.size(), file.get());
  if (std::fwrite(data.data(), sizeof(float), data.size(), file.get()) != data.size()) {
    throw Error("short write to " + path);
  }
}

}  // namespace

int run_logits(const std::vector<std::string>& args) {
  std::vector<FlagSpec> specs = model_flags();
  specs.push_back({"token-ids", "IDS", "comma-separated token ids (required)"});
  specs.push_back({"prefill", "N", "how many leading tokens form the prefill step (default: all)"});
  specs.push_back({"out", "FILE", "output .npy path (required): float32 [positions, vocab]"});
  specs.push_back({"stride", "N",
                   "keep the logits of every N-th position (0, N, 2N, ...) and of the last "
                   "(default 1: all); for long prompts"});
  if (print_help_if_asked(args, "logits", "Write the logits of every position to a .npy file.",
                          specs)) {
    return 0;
  }
  Flags flags(specs, args);
  if (!flags.has("token-ids") || !flags.has("out"))
    throw Error("--token-ids and --out are required");
  LoadedModel model = load_model_from_flags(flags);
  const std::vector<int32_t> ids = flags.get_int_list("token-ids");
  const int n = static_cast<int>(ids.size());
  const int prefill = flags.get_int("prefill", n);
  if (n == 0 || prefill < 1 || prefill > n) {
    throw Error("--prefill must be in [1, " + std::to_string(n) + "] for " + std::to_string(n) +
                " tokens");
  }
  const int stride = flags.get_int("stride", 1);
  if (stride < 1) throw Error("--stride must be >= 1");
  for (int32_t id : ids) {
    if (id < 0 || id >= model.config.vocab_size) {
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
    }
  }

  const int block_size = 16;
  BlockManager blocks((n + block_size - 1) / block_size, block_size);
  auto exec =
      make_model_execution(engine_args_from_flags(flags), model, blocks.num_blocks(), block_size);
  SequenceBlocks seq;
  blocks.append(seq, n);

  const int64_t vocab = model.config.vocab_size;
  std::vector<float> kept;
  int64_t kept_rows = 0;
  StepResult step;
  int done = 0;
  while (done < n) {
    const int count = done == 0 ? prefill : 1;
    StepBatch batch;
    add_to_batch(batch.meta, seq, std::span(ids).subspan(done, count), block_size);
    for (int i = 0; i < count; ++i) {
      const int position = done + i;
      if (position % stride == 0 || position == n - 1) batch.logit_rows.push_back(i);
    }
    exec->runner->execute(batch, step);
    kept.insert(kept.end(), step.logits.begin(), step.logits.end());
    kept_rows += static_cast<int64_t>(batch.logit_rows.size());
    done += count;
  }
  write_npy(flags.get("out"), kept, kept_rows, vocab);
  return 0;
}

}  // namespace attnres::cli
