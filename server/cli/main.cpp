// attnres: serve, generate with, inspect and benchmark AttnRes (and plain) language models.
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "kernels/builtin_backends.h"
#include "server/cli/commands.h"
#include "server/cli/process_job.h"

namespace {

constexpr const char* kUsage = R"(usage: attnres <command> [flags]

commands:
  serve      serve the model over the OpenAI-compatible HTTP API and gRPC
  generate   generate text from a prompt (streams to the terminal; --json for ids and logprobs)
  inspect    print a model's configuration, weights and AttnRes depth plan
  logits     write the logits of a token sequence to a .npy file (prefill, then decode steps)
  quantize   write a checkpoint with int8 / int4 weights (loads without re-quantizing)
  perplexity perplexity over a text file; KL divergence against a saved base model's
  bench      benchmarks: `attnres bench latency` (engine only), `attnres bench serve` (a server)

Without --model, commands use the built-in demo model. `attnres <command> --help` lists flags.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  attnres::register_builtin_backends();  // --device cpu / cuda (engine/core/backend_registry.h)
  // Under mpirun with several ranks, rank 0 runs the command and the others serve its shards.
  return attnres::cli::run_in_process_job(command, [&]() -> int {
    try {
      if (command == "serve") return attnres::cli::run_serve(args);
      if (command == "generate") return attnres::cli::run_generate(args);
      if (command == "inspect") return attnres::cli::run_inspect(args);
      if (command == "logits") return attnres::cli::run_logits(args);
      if (command == "perplexity") return attnres::cli::run_perplexity(args);
      if (command == "bench") return attnres::cli::run_bench(args);
      if (command == "quantize") return attnres::cli::run_quantize(args);
      std::cerr << "attnres: unknown command '" << command << "'\n\n" << kUsage;
      return 2;
    } catch (const attnres::Error& e) {
      std::cerr << "attnres " << command << ": error: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "attnres " << command << ": internal error: " << e.what() << "\n";
      return 3;
    }
  });
}
