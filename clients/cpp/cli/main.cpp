// attnres-client: the AttnRes Serve gRPC API from the command line, over the client library
// (clients/cpp/client.h). `generate` streams the text to stdout as it arrives; every command
// has --json for scripts. Exit codes: 0 success, 1 the call failed (the gRPC code and the
// server's message on stderr; `health`: not SERVING), 2 bad command line, 128 + signal when
// interrupted (Ctrl-C cancels the running call, so the server aborts the request).
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "clients/cpp/cli/cli_options.h"
#include "clients/cpp/cli/cli_output.h"
#include "clients/cpp/cli/interrupt.h"
#include "clients/cpp/client.h"
#include "engine/core/error.h"
#include "clients/cli_flags/flags.h"

namespace attnres::client::cli {
namespace {

using attnres::cli::Flags;
using attnres::cli::FlagSpec;

constexpr const char* kProgram = "attnres-client";
// A health probe should not hang on an unreachable host: its deadline unless --timeout.
constexpr double kHealthTimeoutSeconds = 10;

constexpr const char* kUsage = R"(usage: attnres-client <command> [flags]

commands:
  generate     generate from a prompt, streaming the text to stdout (--json for ids and usage)
  tokenize     the token ids of a text
  detokenize   the text of token ids
  model-info   what the server serves (name, context length, vocabulary, AttnRes layout)
  health       grpc.health.v1 check: exit code 0 when SERVING
  abort        abort a running request by its id

Every command takes --target HOST:PORT (default $ATTNRES_GRPC_TARGET, else 127.0.0.1:50051),
--api-key KEY (default $ATTNRES_API_KEY) and --timeout SECONDS. `attnres-client <command>
--help` lists its flags.
)";

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

// The command's flags followed by the connection flags; prints --help when asked.
struct Command {
  std::string name;
  std::string summary;
  std::vector<FlagSpec> specs;

  Command(std::string n, std::string s, std::vector<FlagSpec> own)
      : name(std::move(n)), summary(std::move(s)), specs(std::move(own)) {
    for (const FlagSpec& spec : connection_flags()) specs.push_back(spec);
  }

  bool help_asked(const std::vector<std::string>& args) const {
    for (const std::string& arg : args) {
      if (arg == "--help" || arg == "-h") {
        std::cout << Flags::usage(name, summary, specs, kProgram);
        return true;
      }
    }
    return false;
  }
};

void print_result_text(const GenerateResult& result, bool streamed_live) {
  if (streamed_live) {
    std::cout << "\n";  // the text itself went out chunk by chunk
    return;
  }
  for (const Choice& choice : result.choices) {
    if (result.choices.size() > 1) std::cout << "[choice " << choice.index << "]\n";
    std::cout << choice.text << "\n";
  }
}

int run_generate(const std::vector<std::string>& args, InterruptWatcher& interrupts) {
  const Command command("generate",
                        "Generate from a prompt. The text streams to stdout as it arrives (with "
                        "--n > 1, each choice's text is printed at the end); a summary line goes "
                        "to stderr. Ctrl-C cancels the request.",
                        generate_flags());
  if (command.help_asked(args)) return 0;
  const Flags flags(command.specs, args);
  const ClientOptions client_options = client_options_from_flags(flags, process_env());
  const GenerateOptions options = generate_options_from_flags(flags);
  const bool json = flags.has("json");
  // One choice streams live; several would interleave, so they are printed whole at the end.
  const bool live = !json && options.stream && options.sampling.n <= 1;

  Client client(client_options);
  GenerateStream stream = client.generate_stream(options);
  GenerateResult result;
  {
    const auto cancel_on_interrupt = interrupts.on_interrupt([&stream] { stream.cancel(); });
    while (auto chunk = stream.next()) {
      if (live) std::cout << chunk->text << std::flush;
    }
    result = stream.finish();
  }
  if (json) {
    std::cout << dump(to_json(result)) << "\n";
  } else {
    print_result_text(result, live);
    if (!flags.has("quiet")) std::cerr << summary_line(result) << "\n";
  }
  for (const Choice& choice : result.choices) {
    if (!choice.error.empty()) {
      std::cerr << kProgram << " generate: choice " << choice.index
                << " ended after a server error: " << choice.error << "\n";
      return 1;
    }
  }
  return 0;
}

int run_tokenize(const std::vector<std::string>& args) {
  const Command command("tokenize",
                        "Print the token ids of --text, comma-separated (the form --prompt-ids "
                        "and detokenize --ids take).",
                        {{"text", "TEXT", "the text to tokenize"},
                         {"no-special-tokens", "", "do not add the tokenizer's special tokens"},
                         {"json", "", "print {token_ids, count, max_model_len}"}});
  if (command.help_asked(args)) return 0;
  const Flags flags(command.specs, args);
  if (!flags.has("text")) throw Error("tokenize needs --text TEXT");
  Client client(client_options_from_flags(flags, process_env()));
  const std::optional<bool> add_special =
      flags.has("no-special-tokens") ? std::optional<bool>(false) : std::nullopt;
  const TokenizeResult result = client.tokenize(flags.get("text"), add_special);
  std::cout << (flags.has("json") ? dump(to_json(result)) : join_ids(result.token_ids)) << "\n";
  return 0;
}

int run_detokenize(const std::vector<std::string>& args) {
  const Command command("detokenize", "Print the text of --ids.",
                        {{"ids", "IDS", "comma-separated token ids"},
                         {"skip-special-tokens", "", "leave special tokens out of the text"},
                         {"json", "", "print {text}"}});
  if (command.help_asked(args)) return 0;
  const Flags flags(command.specs, args);
  if (!flags.has("ids")) throw Error("detokenize needs --ids IDS");
  Client client(client_options_from_flags(flags, process_env()));
  const std::string text =
      client.detokenize(flags.get_int_list("ids"), flags.has("skip-special-tokens"));
  std::cout << (flags.has("json") ? dump({{"text", text}}) : text) << "\n";
  return 0;
}

int run_model_info(const std::vector<std::string>& args) {
  const Command command("model-info", "Print what the server serves.",
                        {{"json", "", "print one JSON object"}});
  if (command.help_asked(args)) return 0;
  const Flags flags(command.specs, args);
  Client client(client_options_from_flags(flags, process_env()));
  const ModelInfo info = client.model_info();
  std::cout << (flags.has("json") ? dump(to_json(info)) + "\n" : model_info_text(info));
  return 0;
}

int run_health(const std::vector<std::string>& args) {
  const Command command(
      "health",
      "grpc.health.v1.Health/Check: print the serving status; exit code 0 when SERVING, 1 "
      "otherwise (also when the server cannot be reached). Needs no API key.",
      {{"service", "NAME", "the service to check (default \"\": the whole server)"}});
  if (command.help_asked(args)) return 0;
  const Flags flags(command.specs, args);
  Client client(client_options_from_flags(flags, process_env(), kHealthTimeoutSeconds));
  const HealthStatus status = client.health(flags.get("service"));
  std::cout << health_status_name(status) << "\n";
  return status == HealthStatus::kServing ? 0 : 1;
}

int run_abort(const std::vector<std::string>& args) {
  const Command command("abort",
                        "Abort a request: its unfinished choices end with finish_reason "
                        "\"abort\". An unknown or finished id is not an error.",
                        {{"request-id", "ID", "the request's id"}});
  if (command.help_asked(args)) return 0;
  const Flags flags(command.specs, args);
  if (!flags.has("request-id")) throw Error("abort needs --request-id ID");
  Client client(client_options_from_flags(flags, process_env()));
  client.abort(flags.get("request-id"));
  return 0;
}

int run(const std::string& command, const std::vector<std::string>& args,
        InterruptWatcher& interrupts) {
  if (command == "generate") return run_generate(args, interrupts);
  if (command == "tokenize") return run_tokenize(args);
  if (command == "detokenize") return run_detokenize(args);
  if (command == "model-info") return run_model_info(args);
  if (command == "health") return run_health(args);
  if (command == "abort") return run_abort(args);
  std::cerr << kProgram << ": unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}

}  // namespace
}  // namespace attnres::client::cli

int main(int argc, char** argv) {
  using namespace attnres::client;
  // First, before gRPC starts any thread: the threads inherit the blocked signals.
  cli::InterruptWatcher interrupts;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << cli::kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return cli::run(command, args, interrupts);
  } catch (const ClientError& e) {
    if (const int sig = interrupts.signal_received(); sig != 0) {
      std::cout << std::flush;
      std::cerr << "\n" << cli::kProgram << " " << command << ": interrupted, request cancelled\n";
      return 128 + sig;
    }
    std::cerr << cli::kProgram << " " << command << ": " << status_code_name(e.code()) << ": "
              << e.message() << "\n";
    return 1;
  } catch (const attnres::Error& e) {
    std::cerr << cli::kProgram << " " << command << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << cli::kProgram << " " << command << ": internal error: " << e.what() << "\n";
    return 3;
  }
}
