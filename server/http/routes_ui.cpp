// The web playground (server/http/ui/): its page and files, compiled into the binary, and the
// one route it needs beyond the OpenAI API, the model's card. --no-ui answers 404 on all of them.
#include <string>
#include <string_view>

#include "engine/core/dtype.h"
#include "server/http/api_error.h"
#include "server/http/routes.h"
#include "server/http/ui_assets.h"

namespace attnres::server::http {
namespace {

// Same origin only, no inline script or style: the page loads nothing from the network, and a
// token's text (model output) can never run as script.
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

void require_ui(const ServerState& state, const HttpRequest& req) {
  if (!state.options().ui) {
    throw ApiError(404,
                   "no route " + req.method + " " + req.path + " (the web page is off: --no-ui)",
                   "", "not_found");
  }
}

}  // namespace

void handle_ui_file(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  require_ui(state, req);
  constexpr std::string_view kPrefix = "/ui/";
  const std::string_view name = req.path == "/" ? std::string_view("index.html")
                                                : std::string_view(req.path).substr(kPrefix.size());
  for (const UiAsset& asset : ui_assets()) {
    if (asset.name != name) continue;
    res.status = 200;
    res.set_content(std::string(asset.body), std::string(asset.content_type));
    res.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
    res.headers.emplace_back("X-Content-Type-Options", "nosniff");
    res.headers.emplace_back("Referrer-Policy", "no-referrer");
    // Served by this binary: a new binary may bring a new page, so the browser revalidates.
    res.headers.emplace_back("Cache-Control", "no-cache");
    return;
  }
  throw ApiError(404, "no route " + req.method + " " + req.path, "", "not_found");
}

void handle_ui_model_info(ServerState& state, const HttpRequest& req, HttpResponse& res) {
  require_ui(state, req);
  const LoadedModel& model = state.model();
  const ModelConfig& c = model.config;
  nlohmann::ordered_json j;
  j["id"] = state.options().served_model_name;
  j["source"] = model.source;
  j["model_type"] = c.model_type;
  j["architecture"] = std::string(architecture_name(c.arch));
  j["num_layers"] = c.num_layers;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_heads"] = c.num_heads;
  j["num_kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_model_len"] = state.options().max_model_len;
  j["attnres_mode"] = std::string(attnres_mode_name(c.attnres_mode));
  if (c.attnres_mode != AttnResMode::None) {
    j["attnres_num_blocks"] = c.attnres_num_blocks;
    j["attnres_gate"] = std::string(attnres_gate_name(c.attnres_gate));
  }
  // The same test the completions routes apply before they accept return_depth_attention.
  j["depth_attention"] = !state.engine().depth_attention_layout().empty();
  j["dtype"] = std::string(dtype_name(model.weights.dtype));
  j["device"] = state.options().device;
  j["chat_template"] = model.chat_template.has_value();
  send_json(res, 200, j);
}

}  // namespace attnres::server::http
