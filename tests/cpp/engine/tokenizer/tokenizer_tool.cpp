// JSON-lines driver for tests/python/test_tokenizer_parity.py.
//   tokenizer_tool <tokenizer.json>
// Each stdin line is one request; each gets exactly one stdout line:
//   {"encode": "<text>", "add_special_tokens": true}  -> {"ids": [...]}
//   {"decode": [ids], "skip_special_tokens": false}   -> {"text": "...", "incremental": "..."}
// "incremental" is the concatenation of IncrementalDecoder::push() outputs plus flush().
// Errors become {"error": "..."} so the test can report them per input.
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/error.h"
#include "engine/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenizer_tool <tokenizer.json>\n";
    return 2;
  }
  std::shared_ptr<const attnres::Tokenizer> tok;
  try {
    tok = attnres::Tokenizer::load(argv[1]);
  } catch (const attnres::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json reply;
    try {
      const auto req = nlohmann::json::parse(line);
      if (req.contains("encode")) {
        reply["ids"] =
            tok->encode(req["encode"].get<std::string>(), req.value("add_special_tokens", true));
      } else {
        const auto ids = req.at("decode").get<std::vector<int32_t>>();
        const bool skip = req.value("skip_special_tokens", false);
        reply["text"] = tok->decode(ids, skip);
        attnres::IncrementalDecoder inc(tok, skip);
        std::string streamed;
        for (int32_t id : ids) streamed += inc.push(id);
        streamed += inc.flush();
        reply["incremental"] = streamed;
      }
    } catch (const std::exception& e) {
      reply = nlohmann::json{{"error", e.what()}};
    }
    std::cout << reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    std::cout.flush();
  }
  return 0;
}
