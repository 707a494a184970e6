#include "server/http/vllm_request_fields.h"

#include <algorithm>

#include "engine/core/error.h"
#include "server/http/api_error.h"

namespace attnres::server::http {
namespace {

std::string indexed(const char* field, size_t i) {
  std::string where = field;
  where += '[';
  where += std::to_string(i);
  where += ']';
  return where;
}

std::vector<std::string> read_bad_words(const FieldReader& f) {
  std::vector<std::string> words;
  const auto* list = f.find("bad_words");
  if (!list) return words;
  if (!list->is_array()) {
    throw bad_request("field bad_words: expected a list of strings, got " + json_type_name(*list),
                      "bad_words");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const auto& word = (*list)[i];
    if (!word.is_string()) {
      throw bad_request(
          "field " + indexed("bad_words", i) + ": expected a string, got " + json_type_name(word),
          "bad_words");
    }
    words.push_back(word.get<std::string>());
  }
  return words;
}

}  // namespace

std::vector<std::vector<int32_t>> tokenize_bad_words(const std::vector<std::string>& words,
                                                     const Tokenizer& tokenizer) {
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& word = words[i];
    const size_t start = word.find_first_not_of(" \t\n\r\f\v");
    if (start == std::string::npos) {
      throw bad_request("field " + indexed("bad_words", i) + ": is empty (or only whitespace)",
                        "bad_words");
    }
    const std::string stripped = word.substr(start);
    std::vector<int32_t> plain = tokenizer.encode(stripped, /*add_special_tokens=*/false);
    std::vector<int32_t> spaced = tokenizer.encode(" " + stripped, /*add_special_tokens=*/false);
    if (plain.empty()) {
      throw bad_request("field " + indexed("bad_words", i) + ": has no tokens", "bad_words");
    }
    const bool spaced_is_new_word =
        !spaced.empty() && spaced.front() != plain.front() && spaced.size() == plain.size();
    ids.push_back(std::move(plain));
    if (spaced_is_new_word) ids.push_back(std::move(spaced));
  }
  return ids;
}

void read_vllm_output_fields(const FieldReader& f, GenerationOptions& o,
                             const Tokenizer& tokenizer) {
  SamplingParams& p = o.params;
  if (auto v = f.integer("prompt_logprobs", -1, kMaxLogprobs)) {
    if (*v < 0) {
      throw bad_request(
          "field prompt_logprobs: -1 (the whole vocabulary) is not supported; at "
          "most " +
              std::to_string(kMaxLogprobs) + " per position",
          "prompt_logprobs");
    }
    if (o.stream) {
      throw bad_request(
          "field prompt_logprobs: prompt logprobs are not available when "
          "\"stream\": true",
          "prompt_logprobs");
    }
    p.prompt_logprobs = static_cast<int>(*v);
  }
  if (auto v = f.boolean("include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  p.bad_words = tokenize_bad_words(read_bad_words(f), tokenizer);

  if (const auto* so = f.find("stream_options")) {
    if (!so->is_object()) {
      throw bad_request("field stream_options: expected an object, got " + json_type_name(*so),
                        "stream_options");
    }
    // vLLM: stream options only make sense for a stream (an empty object is let through).
    if (!o.stream && !so->empty()) {
      throw bad_request("field stream_options: can only be given with \"stream\": true",
                        "stream_options");
    }
    FieldReader options(*so);
    if (auto v = options.boolean("include_usage")) o.include_usage = *v;
    // vLLM sends per-chunk usage only when include_usage is on too.
    o.continuous_usage =
        o.include_usage && options.boolean("continuous_usage_stats").value_or(false);
  }
}

PromptTruncation read_prompt_truncation(const FieldReader& f) {
  PromptTruncation t;
  t.keep = f.integer("truncate_prompt_tokens", -1, INT64_MAX);
  if (auto side = f.string("truncation_side")) {
    if (*side != "left" && *side != "right") {
      throw bad_request(
          "field truncation_side: expected \"left\" or \"right\", got \"" + *side + "\"",
          "truncation_side");
    }
    t.keep_last = *side == "left";
  }
  return t;
}

bool truncate_prompt(std::vector<int32_t>& ids, const PromptTruncation& truncation,
                     int64_t max_tokens, int max_model_len) {
  if (!truncation.keep) return false;
  const int64_t room = int64_t{max_model_len} - max_tokens;
  int64_t keep = *truncation.keep;
  if (keep < 0) keep = std::max<int64_t>(room, 0);
  if (keep > room) {
    throw bad_request("field truncate_prompt_tokens: " + std::to_string(keep) +
                          " is more than max_model_len - max_tokens = " + std::to_string(room) +
                          "; request a smaller truncation size",
                      "truncate_prompt_tokens");
  }
  if (keep >= static_cast<int64_t>(ids.size())) return false;
  const auto kept = static_cast<std::ptrdiff_t>(keep);
  if (truncation.keep_last) {
    ids.erase(ids.begin(), ids.end() - kept);
  } else {
    ids.resize(static_cast<size_t>(kept));
  }
  return true;
}

ChatPromptOptions read_chat_prompt_options(const FieldReader& f) {
  ChatPromptOptions o;
  const std::optional<bool> add_generation_prompt = f.boolean("add_generation_prompt");
  o.continue_final_message = f.boolean("continue_final_message").value_or(false);
  if (o.continue_final_message && add_generation_prompt.value_or(false)) {
    throw bad_request(
        "field continue_final_message: cannot be true together with \"add_generation_prompt\": "
        "true (continue the final message, or start a new one)",
        "continue_final_message");
  }
  o.add_generation_prompt = add_generation_prompt.value_or(!o.continue_final_message);
  o.add_special_tokens = f.boolean("add_special_tokens").value_or(false);
  if (const auto* kwargs = f.find("chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      throw bad_request(
          "field chat_template_kwargs: expected an object, got " + json_type_name(*kwargs),
          "chat_template_kwargs");
    }
    o.variables = *kwargs;
  }
  if (const auto* documents = f.find("documents")) {
    if (!documents->is_array()) {
      throw bad_request("field documents: expected a list, got " + json_type_name(*documents),
                        "documents");
    }
    o.variables["documents"] = *documents;
  }
  if (auto source = f.string("chat_template")) {
    try {
      o.chat_template = ChatTemplate::parse(*source);
    } catch (const Error& e) {
      throw bad_request(std::string("field chat_template: ") + e.what(), "chat_template");
    }
  }
  return o;
}

}  // namespace attnres::server::http
