#include "server/http/responses_stream.h"

#include <algorithm>
#include <cctype>

namespace attnres::server::http {
namespace {

bool all_space(const std::string& text) {
  return std::all_of(text.begin(), text.end(),
                     [](unsigned char c) { return std::isspace(c) != 0; });
}

}  // namespace

ResponseItemBuilder::ResponseItemBuilder(const ChatAnswerFormat& formats, ItemIdMaker ids,
                                         ResponseEventWriter* events, int max_calls)
    : formats_(formats), ids_(std::move(ids)), events_(events), max_calls_(max_calls) {
  if (formats.reasoning != ReasoningFormat::None) {
    reasoning_.emplace(formats.reasoning, formats.prompt_thinking);
  }
  if (formats.tool_calls != ToolCallFormat::None) tools_.emplace(formats.tool_calls);
}

void ResponseItemBuilder::push(std::string_view text) {
  if (reasoning_) {
    ReasoningDelta d = reasoning_->push(text);
    route(std::move(d.reasoning), std::move(d.content), {});
  } else {
    route("", std::string(text), {});
  }
}

// Reasoning goes to its item; what follows the reasoning through the tool-call parser.
void ResponseItemBuilder::route(std::string reasoning, std::string content,
                                std::vector<ToolCallDelta> calls) {
  on_reasoning(reasoning);
  if (tools_ && !content.empty()) {
    ToolStreamDelta d = tools_->push(content);
    content = std::move(d.content);
    calls.insert(calls.end(), d.calls.begin(), d.calls.end());
  }
  on_content(content);
  for (const ToolCallDelta& call : calls) on_call(call);
}

void ResponseItemBuilder::on_reasoning(const std::string& text) {
  if (text.empty()) return;
  reasoning_text_ += text;
  if (kind_ != Kind::Reasoning) {
    Json item = reasoning_item(ids_("rs"), "");
    open(Kind::Reasoning, std::move(item));
  }
  open_["content"][0]["text"] = open_["content"][0]["text"].get<std::string>() + text;
  if (events_) {
    events_->reasoning_delta(int(items_.size()), open_["id"], text);
  }
}

void ResponseItemBuilder::on_content(const std::string& text) {
  if (text.empty()) return;
  std::string delta = text;
  if (kind_ != Kind::Message) {
    held_space_ += text;
    if (all_space(held_space_)) return;
    open(Kind::Message, message_item(ids_("msg"), "", "in_progress"));
    delta = std::move(held_space_);
    held_space_.clear();
  }
  Json& part = open_["content"][0];
  part["text"] = part["text"].get<std::string>() + delta;
  if (events_) events_->text_delta(int(items_.size()), open_["id"], delta);
}

void ResponseItemBuilder::on_call(const ToolCallDelta& delta) {
  if (delta.index >= max_calls_) return;
  if (delta.id) {
    held_space_.clear();  // whitespace before a call is not a message
    ToolCall call{*delta.id, delta.name.value_or(""), ""};
    open(Kind::Call, function_call_item(ids_("fc"), call, "in_progress"));
    open_call_ = delta.index;
  }
  if (kind_ != Kind::Call || delta.index != open_call_ || delta.arguments.empty()) return;
  open_["arguments"] = open_["arguments"].get<std::string>() + delta.arguments;
  if (events_) events_->arguments_delta(int(items_.size()), open_["id"], delta.arguments);
}

void ResponseItemBuilder::open(Kind kind, Json item) {
  close("completed");
  kind_ = kind;
  open_ = std::move(item);
  if (!events_) return;
  const int index = int(items_.size());
  Json pending = open_;
  if (kind == Kind::Reasoning) pending["content"] = Json::array();
  if (kind == Kind::Message) pending["content"] = Json::array();
  pending["status"] = "in_progress";
  events_->item_added(index, pending);
  if (kind == Kind::Message) events_->content_part_added(index, open_["id"]);
}

void ResponseItemBuilder::close(const char* status) {
  if (kind_ == Kind::None) return;
  open_["status"] = status;
  if (events_) {
    const int index = int(items_.size());
    const std::string id = open_["id"];
    switch (kind_) {
      case Kind::Reasoning:
        events_->reasoning_done(index, id, open_["content"][0]["text"]);
        break;
      case Kind::Message:
        events_->text_done(index, id, open_["content"][0]);
        break;
      case Kind::Call:
        events_->arguments_done(index, open_);
        break;
      case Kind::None:
        break;
    }
    events_->item_done(index, open_);
  }
  items_.push_back(std::move(open_));
  kind_ = Kind::None;
}

Json ResponseItemBuilder::finish(bool incomplete) {
  if (reasoning_) {
    ReasoningDelta d = reasoning_->finish();
    route(std::move(d.reasoning), std::move(d.content), {});
  }
  if (tools_) {
    ToolStreamDelta d = tools_->finish();
    on_content(d.content);
    for (const ToolCallDelta& call : d.calls) on_call(call);
  }
  bool has_answer = kind_ == Kind::Message || kind_ == Kind::Call;
  for (const Json& item : items_) has_answer |= item["type"] != "reasoning";
  if (!has_answer) {  // no message and no call: a message with whatever text there was
    open(Kind::Message, message_item(ids_("msg"), "", "in_progress"));
    if (!held_space_.empty()) {
      open_["content"][0]["text"] = held_space_;
      if (events_) events_->text_delta(int(items_.size()), open_["id"], held_space_);
    }
  }
  close(incomplete ? "incomplete" : "completed");
  return items_;
}

}  // namespace attnres::server::http
