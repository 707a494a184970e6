// `attnres quantize`: writes a quantized checkpoint (engine/model/quantized_checkpoint.h) that
// `--model OUT` then loads as it is, with no quantizing at load.
#include <iostream>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "engine/model/quantized_checkpoint.h"
#include "server/cli/commands.h"

namespace attnres::cli {

int run_quantize(const std::vector<std::string>& args) {
  const std::vector<FlagSpec> specs = {
      {"model", "DIR", "the model to quantize: a directory or builtin:NAME (default: the demo)"},
      {"quantization", "int8|int4",
       "the format: int8 = 8.5 bits per weight; int4 = 4.5 for the projections (int4k), 6.56 "
       "(int6k) for the embedding, LM head and Q4_K_M's 6-bit layers (quant_format.h); "
       "may be left out for a compressed-tensors checkpoint, which converts into its own"},
      {"output", "DIR", "where to write the checkpoint (created; required)"},
      {"threads", "N", "threads quantizing (default: all cores)"},
  };
  if (print_help_if_asked(args, "quantize",
                          "Write a checkpoint whose weight matrices are stored quantized.",
                          specs)) {
    return 0;
  }
  Flags flags(specs, args);
  if (!flags.has("output")) throw Error("--output is required");
  const int threads = flags.get_int("threads", 0);
  if (threads < 0) throw Error("--threads: must be >= 0");
  const LoadedModel model =
      load_model_arg(flags.get("model"), {flags.get("quantization", ""), threads});
  report_quantization(model);
  write_quantized_checkpoint(model, flags.get("output"));
  std::cerr << "attnres quantize: wrote " << flags.get("output") << " ("
            << quant_format_name(*model.weights.quant_format) << ")\n";
  return 0;
}

}  // namespace attnres::cli
