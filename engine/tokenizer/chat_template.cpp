#include "engine/tokenizer/chat_template.h"

#include "engine/core/error.h"
#include "engine/jinja/jinja_interpreter.h"
#include "engine/jinja/jinja_json.h"
#include "engine/jinja/jinja_parser.h"

namespace attnres {
namespace {

template <typename Json>
jinja::DictItems context_items(const Json& context) {
  if (!context.is_object()) throw Error("chat template context must be a JSON object");
  jinja::Value v = jinja::from_json(context);
  return v.dict_items();
}

template <typename Json>
Json apply_context(const Json& messages, bool add_generation_prompt, const TokenizerConfig& cfg,
                   const Json& tools, const Json& extra) {
  if (!messages.is_array()) throw Error("chat messages must be a JSON array");
  if (!extra.is_null() && !extra.is_object()) {
    throw Error("extra chat template variables must be a JSON object");
  }
  Json ctx = Json::object();
  ctx["messages"] = messages;
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  // transformers passes special_tokens_map, which only holds the tokens that are set.
  if (!cfg.bos_token.empty()) ctx["bos_token"] = cfg.bos_token;
  if (!cfg.eos_token.empty()) ctx["eos_token"] = cfg.eos_token;
  if (!cfg.unk_token.empty()) ctx["unk_token"] = cfg.unk_token;
  if (!cfg.pad_token.empty()) ctx["pad_token"] = cfg.pad_token;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  }
  return ctx;
}

}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.tmpl_ = jinja::parse_template(source);
  return t;
}

ChatTemplate ChatTemplate::with_limits(const ChatTemplateLimits& limits) const {
  ChatTemplate t = *this;
  t.limits_ = limits;
  return t;
}

static std::string render_items(const jinja::Template* tmpl, const ChatTemplateLimits& l,
                                const jinja::DictItems& items) {
  if (!tmpl) throw Error("chat template used before ChatTemplate::parse");
  jinja::RenderLimits limits;
  limits.max_output_bytes = l.max_output_bytes;
  limits.max_call_depth = l.max_call_depth;
  limits.max_loop_iterations = l.max_loop_iterations;
  jinja::Interpreter interpreter(*tmpl, limits);
  return interpreter.render(items);
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render_items(tmpl_.get(), limits_, context_items(context));
}

std::string ChatTemplate::render_ordered(const nlohmann::ordered_json& context) const {
  return render_items(tmpl_.get(), limits_, context_items(context));
}

std::string ChatTemplate::apply(const nlohmann::json& messages, bool add_generation_prompt,
                                const TokenizerConfig& cfg, const nlohmann::json& tools,
                                const nlohmann::json& extra) const {
  return render(apply_context(messages, add_generation_prompt, cfg, tools, extra));
}

std::string ChatTemplate::apply_ordered(const nlohmann::ordered_json& messages,
                                        bool add_generation_prompt, const TokenizerConfig& cfg,
                                        const nlohmann::ordered_json& tools,
                                        const nlohmann::ordered_json& extra) const {
  return render_ordered(apply_context(messages, add_generation_prompt, cfg, tools, extra));
}

}  // namespace attnres
