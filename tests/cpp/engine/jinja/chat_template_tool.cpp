// JSON-lines driver for the parity test (tests/python/test_chat_template_parity.py).
// Each input line is one request:
//   {"template": "...", "context": {...}}                       → ChatTemplate::render
//   {"template": "..." | "config_path": "...", "messages": [...], "add_generation_prompt": b,
//    "tools": ..., "extra": {...}, "config": {...}}              → ChatTemplate::apply
// and gets one output line: {"ok": true, "output": "..."} or {"ok": false, "error": "..."}.
#include <iostream>
#include <string>

#include "engine/core/error.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer_config.h"

namespace {

using ordered_json = nlohmann::ordered_json;

std::string handle(const ordered_json& req) {
  attnres::TokenizerConfig cfg;
  if (req.contains("config_path")) {
    cfg = attnres::TokenizerConfig::load(req["config_path"].get<std::string>());
  } else if (req.contains("config")) {
    cfg = attnres::TokenizerConfig::from_json(nlohmann::json::parse(req["config"].dump()),
                                              "request config");
  }
  std::string source;
  if (req.contains("template")) {
    source = req["template"].get<std::string>();
  } else if (cfg.chat_template) {
    source = *cfg.chat_template;
  } else {
    throw attnres::Error("no chat template in request or config");
  }
  attnres::ChatTemplate tmpl = attnres::ChatTemplate::parse(source);
  if (req.contains("context")) return tmpl.render_ordered(req["context"]);
  ordered_json tools = req.value("tools", ordered_json());
  ordered_json extra = req.value("extra", ordered_json::object());
  return tmpl.apply_ordered(req.at("messages"), req.value("add_generation_prompt", false), cfg,
                            tools, extra);
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    ordered_json reply;
    try {
      reply["ok"] = true;
      reply["output"] = handle(ordered_json::parse(line));
    } catch (const attnres::Error& e) {
      reply = {{"ok", false}, {"error", e.what()}};
    } catch (const std::exception& e) {
      reply = {{"ok", false}, {"error", std::string("bad request: ") + e.what()}};
    }
    std::cout << reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n"
              << std::flush;
  }
  return 0;
}
