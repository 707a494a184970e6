#include "server/http/openai_responses.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/sample/stop_checker.h"

namespace attnres::server::http {
namespace {

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
  const int32_t one[1] = {id};
  return tokenizer.decode(one, /*skip_special_tokens=*/false);
}

// A weight as JSON: null for an unused (NaN) cell; else rounded to 7 significant digits (what
// an f32 holds), so the wire carries 0.4136735 rather than 0.41367349028587341.
Json weight_json(float v) {
  if (!std::isfinite(v)) return nullptr;
  char text[32];
  std::snprintf(text, sizeof(text), "%.7g", static_cast<double>(v));
  return std::strtod(text, nullptr);
}

Json matrix_json(const DepthAttentionMatrix& m) {
  Json rows = Json::array();
  for (int r = 0; r < m.rows; ++r) {
    Json row = Json::array();
    for (int c = 0; c < m.cols; ++c) row.push_back(weight_json(m.at(r, c)));
    rows.push_back(std::move(row));
  }
  return rows;
}

Json utf8_bytes(const std::string& text) {
  Json bytes = Json::array();
  for (unsigned char c : text) bytes.push_back(int{c});
  return bytes;
}

}  // namespace

Json head_json(const ResponseHead& head) {
  Json j;
  j["id"] = head.id;
  j["object"] = head.object;
  j["created"] = head.created;
  j["model"] = head.model;
  return j;
}

Json usage_json(const Usage& usage) {
  Json j;
  j["prompt_tokens"] = usage.prompt_tokens;
  j["completion_tokens"] = usage.completion_tokens;
  j["total_tokens"] = usage.total_tokens();
  // OpenAI's shape: prompt tokens whose KV came from the prefix cache.
  j["prompt_tokens_details"] = {{"cached_tokens", usage.cached_tokens}};
  return j;
}

Json finish_reason_json(FinishReason reason) {
  if (reason == FinishReason::None) return nullptr;
  return finish_reason_name(reason);
}

Json stop_reason_json(const std::optional<std::string>& stop_string,
                      const std::optional<int32_t>& stop_token) {
  if (stop_string) return *stop_string;
  if (stop_token) return *stop_token;
  return nullptr;
}

Json completion_logprobs_json(const Tokenizer& tokenizer, std::span<const TokenLogprob> logprobs,
                              size_t& text_offset) {
  return completion_logprobs_json(tokenizer, {}, {}, logprobs, text_offset);
}

Json completion_logprobs_json(const Tokenizer& tokenizer, std::span<const int32_t> prompt_ids,
                              std::span<const std::optional<TokenLogprob>> prompt_logprobs,
                              std::span<const TokenLogprob> logprobs, size_t& text_offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  auto add = [&](int32_t token_id, const TokenLogprob* lp) {
    const std::string text = token_text(tokenizer, token_id);
    tokens.push_back(text);
    offsets.push_back(text_offset);
    text_offset += text.size();
    if (!lp) {  // the first prompt token: nothing to condition on
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      return;
    }
    token_logprobs.push_back(lp->logprob);
    // As vLLM: the top k plus the chosen token, keyed by token text.
    Json alternatives = Json::object();
    for (const auto& [id, logprob] : lp->top) alternatives[token_text(tokenizer, id)] = logprob;
    if (!alternatives.contains(text)) alternatives[text] = lp->logprob;
    top.push_back(std::move(alternatives));
  };
  for (size_t i = 0; i < prompt_logprobs.size() && i < prompt_ids.size(); ++i) {
    add(prompt_ids[i], prompt_logprobs[i] ? &*prompt_logprobs[i] : nullptr);
  }
  for (const TokenLogprob& lp : logprobs) add(lp.token_id, &lp);
  Json j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(token_logprobs);
  j["top_logprobs"] = std::move(top);
  j["text_offset"] = std::move(offsets);
  return j;
}

Json prompt_logprobs_json(const Tokenizer& tokenizer, std::span<const int32_t> prompt_ids,
                          std::span<const std::optional<TokenLogprob>> prompt_logprobs) {
  Json out = Json::array();
  auto entry = [&](int32_t id, float logprob, int rank) {
    Json e;
    e["logprob"] = logprob;
    e["rank"] = rank;
    e["decoded_token"] = token_text(tokenizer, id);
    return e;
  };
  for (size_t i = 0; i < prompt_logprobs.size() && i < prompt_ids.size(); ++i) {
    if (!prompt_logprobs[i]) {
      out.push_back(nullptr);
      continue;
    }
    const TokenLogprob& lp = *prompt_logprobs[i];
    Json position = Json::object();
    position[std::to_string(prompt_ids[i])] = entry(prompt_ids[i], lp.logprob, lp.rank);
    for (size_t k = 0; k < lp.top.size(); ++k) {
      const auto& [id, logprob] = lp.top[k];
      position[std::to_string(id)] = entry(id, logprob, static_cast<int>(k) + 1);
    }
    out.push_back(std::move(position));
  }
  return out;
}

Json depth_attention_json(const DepthAttentionLayout& layout,
                          const DepthAttentionMatrix* prompt_mean,
                          const std::vector<DepthAttentionMatrix>* per_token) {
  Json j = Json::object();
  if (prompt_mean) {
    j["sublayers"] = layout.sublayers;
    j["sources"] = layout.sources;
    j["prompt_mean"] = matrix_json(*prompt_mean);
  }
  if (per_token) {
    Json tokens = Json::array();
    for (const DepthAttentionMatrix& m : *per_token) tokens.push_back(matrix_json(m));
    j["per_token"] = std::move(tokens);
  }
  return j;
}

bool has_depth_attention(const RequestOutput& out) {
  return out.depth_prompt_mean.has_value() || !out.depth_per_token.empty();
}

Json chat_logprobs_json(const Tokenizer& tokenizer, std::span<const TokenLogprob> logprobs) {
  Json content = Json::array();
  for (const TokenLogprob& lp : logprobs) {
    const std::string text = token_text(tokenizer, lp.token_id);
    Json entry;
    entry["token"] = text;
    entry["logprob"] = lp.logprob;
    entry["bytes"] = utf8_bytes(text);
    Json top = Json::array();
    for (const auto& [id, logprob] : lp.top) {
      const std::string alt = token_text(tokenizer, id);
      Json item;
      item["token"] = alt;
      item["logprob"] = logprob;
      item["bytes"] = utf8_bytes(alt);
      top.push_back(std::move(item));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  Json j;
  j["content"] = std::move(content);
  return j;
}

}  // namespace attnres::server::http
