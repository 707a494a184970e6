#include "clients/bench/stream_recorder.h"

#include <nlohmann/json.hpp>

namespace attnres::bench {

void ChunkTimer::on_chunk(double now, RequestOutput& out) {
  if (!any_) {
    any_ = true;
    out.ttft = now - sent_at_;
  } else {
    out.itl.push_back(now - last_);
  }
  last_ = now;
}

void OpenAiStreamRecorder::on_event(const std::string& data, double now) {
  if (!error_.empty() || done_) return;
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  nlohmann::json event = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (event.is_discarded() || !event.is_object()) {
    error_ = "stream event is not a JSON object: " + data.substr(0, 200);
    return;
  }
  if (auto e = event.find("error"); e != event.end() && !e->is_null()) {
    const nlohmann::json& err = *e;
    error_ = "in-band error: " +
             (err.is_object() && err.contains("message") && err["message"].is_string()
                  ? err["message"].get<std::string>()
                  : err.dump());
    return;
  }
  auto choices = event.find("choices");
  if (choices != event.end() && choices->is_array() && !choices->empty()) {
    timer_.on_chunk(now, out_);
    const nlohmann::json& choice = (*choices)[0];
    const nlohmann::json* text = nullptr;
    if (api_ == OpenAiApi::kCompletions) {
      if (auto t = choice.find("text"); t != choice.end()) text = &*t;
    } else if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
      if (auto c = d->find("content"); c != d->end()) text = &*c;
    }
    if (text && text->is_string()) out_.generated_text += text->get<std::string>();
  }
  // Usage may ride on the last chunk itself (llama.cpp's llama-server) instead of a trailing
  // `choices: []` event (vLLM, attnres).
  if (auto u = event.find("usage"); u != event.end() && u->is_object()) {
    usage_ = true;
    if (auto c = u->find("completion_tokens"); c != u->end() && c->is_number_integer()) {
      out_.output_tokens = c->get<int>();
    }
    if (auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) {
      out_.prompt_len = p->get<int>();
    }
    // OpenAI's prompt_tokens_details.cached_tokens (vLLM: with --enable-prompt-tokens-details).
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      if (auto c = d->find("cached_tokens"); c != d->end() && c->is_number_integer()) {
        out_.cached_tokens = c->get<int>();
      }
    }
  }
}

void OpenAiStreamRecorder::finish() {
  timer_.finish(out_);
  if (error_.empty() && !timer_.any()) {
    error_ = "never received a chunk with a choice, so no TTFT (vLLM: marked failed)";
  }
  if (error_.empty() && !done_) error_ = "the stream ended without data: [DONE]";
  if (error_.empty() && !usage_) {
    error_ = "the stream carried no usage (stream_options.include_usage was sent)";
  }
  out_.success = error_.empty();
  out_.error = error_;
}

void check_lengths(const BenchPrompt& prompt, bool ignore_eos, RequestOutput& out) {
  if (!out.success) return;
  std::string why;
  // prompt_len 0: a later turn of a conversation, whose total depends on the answers.
  if (prompt.prompt_len > 0 && out.prompt_len != prompt.prompt_len) {
    why = "the server counted " + std::to_string(out.prompt_len) + " prompt tokens, expected " +
          std::to_string(prompt.prompt_len);
  } else if (ignore_eos ? out.output_tokens != prompt.output_len
                        : out.output_tokens < 1 || out.output_tokens > prompt.output_len) {
    why = "the server generated " + std::to_string(out.output_tokens) + " tokens, expected " +
          (ignore_eos ? "" : "1 to ") + std::to_string(prompt.output_len);
  }
  if (!why.empty()) {
    out.success = false;
    out.error = why;
  }
}

}  // namespace attnres::bench
