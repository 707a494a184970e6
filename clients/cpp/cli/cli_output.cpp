#include "clients/cpp/cli/cli_output.h"

#include <sstream>

namespace attnres::client::cli {
namespace {

nlohmann::json to_json(const std::vector<TokenLogprob>& logprobs) {
  nlohmann::json out = nlohmann::json::array();
  for (const TokenLogprob& lp : logprobs) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, value] : lp.top) top.push_back({{"token_id", id}, {"logprob", value}});
    out.push_back(
        {{"token_id", lp.token_id}, {"logprob", lp.logprob}, {"rank", lp.rank}, {"top", top}});
  }
  return out;
}

// vLLM's stop_reason: the stop string or stop token that ended the choice, else null (EOS,
// length, abort).
nlohmann::json stop_reason(const Choice& choice) {
  if (choice.stop_string) return *choice.stop_string;
  if (choice.stop_token_id) return *choice.stop_token_id;
  return nullptr;
}

}  // namespace

nlohmann::json to_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.total_tokens}};
}

nlohmann::json to_json(const GenerateResult& result) {
  nlohmann::json choices = nlohmann::json::array();
  for (const Choice& choice : result.choices) {
    nlohmann::json c = {{"index", choice.index},
                        {"text", choice.text},
                        {"token_ids", choice.token_ids},
                        {"finish_reason", choice.finish_reason},
                        {"stop_reason", stop_reason(choice)},
                        {"usage", to_json(choice.usage)}};
    if (!choice.logprobs.empty()) c["logprobs"] = to_json(choice.logprobs);
    if (!choice.error.empty()) c["error"] = choice.error;
    choices.push_back(std::move(c));
  }
  return {{"request_id", result.request_id},
          {"choices", std::move(choices)},
          {"usage", to_json(result.usage)}};
}

nlohmann::json to_json(const ModelInfo& info) {
  nlohmann::json out = {{"served_model_name", info.served_model_name},
                        {"model_source", info.model_source},
                        {"max_model_len", info.max_model_len},
                        {"vocab_size", info.vocab_size},
                        {"architecture", info.architecture},
                        {"model_type", info.model_type},
                        {"attnres_mode", info.attnres_mode},
                        {"attnres_num_blocks", info.attnres_num_blocks},
                        {"num_layers", info.num_layers},
                        {"eos_token_ids", info.eos_token_ids},
                        {"bos_token_id", nullptr}};
  if (info.bos_token_id) out["bos_token_id"] = *info.bos_token_id;
  return out;
}

nlohmann::json to_json(const TokenizeResult& result) {
  return {{"token_ids", result.token_ids},
          {"count", result.token_ids.size()},
          {"max_model_len", result.max_model_len}};
}

std::string summary_line(const GenerateResult& result) {
  std::ostringstream out;
  out << "[request " << result.request_id;
  for (const Choice& choice : result.choices) {
    out << " | ";
    if (result.choices.size() > 1) out << "choice " << choice.index << ": ";
    out << "finish_reason " << choice.finish_reason;
    if (choice.stop_string) out << " (stop " << nlohmann::json(*choice.stop_string).dump() << ")";
    if (choice.stop_token_id) out << " (stop token " << *choice.stop_token_id << ")";
    if (!choice.error.empty()) out << " (error: " << choice.error << ")";
  }
  out << " | usage: prompt " << result.usage.prompt_tokens << ", completion "
      << result.usage.completion_tokens << ", total " << result.usage.total_tokens << "]";
  return out.str();
}

std::string model_info_text(const ModelInfo& info) {
  std::ostringstream out;
  const nlohmann::json fields = to_json(info);  // a named object: items() refers to it
  for (const auto& [name, value] : fields.items()) {
    out << name << ": " << (value.is_string() ? value.get<std::string>() : value.dump()) << "\n";
  }
  return out.str();
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  return out;
}

std::string dump(const nlohmann::json& document) {
  return document.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace attnres::client::cli
