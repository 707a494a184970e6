#include "server/common/tool_call_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

namespace attnres::server {
namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t skip_space(std::string_view text, size_t i) {
  while (i < text.size() && is_space(text[i])) ++i;
  return i;
}

// The length of the longest end of `text` that is a proper start of `marker`.
size_t marker_prefix_at_end(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

size_t trailing_space(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && is_space(text[text.size() - 1 - n])) ++n;
  return n;
}

// Where the JSON value starting at text[i] ends (one past it), or nullopt while the text
// stops inside it. Structural only: brackets and strings are followed, nothing is validated
// (a whole answer's calls are validated by parsing them). A scalar (number, true, ...) ends
// at the first character that cannot continue it, or at the text's end when `final`.
std::optional<size_t> json_value_end(std::string_view text, size_t i, bool final) {
  if (i >= text.size()) return std::nullopt;
  const char first = text[i];
  if (first == '{' || first == '[' || first == '"') {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t j = i; j < text.size(); ++j) {
      const char c = text[j];
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
          if (depth == 0) return j + 1;  // a string value
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return j + 1;
      }
    }
    return std::nullopt;
  }
  size_t j = i;
  while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '-' ||
                             text[j] == '+' || text[j] == '.')) {
    ++j;
  }
  if (j == text.size() && !final) return std::nullopt;
  return j;
}

// A call object's opening, {"name": "...", "arguments": (or "parameters":), matched as far as
// the text goes: Match once the arguments' value has started.
struct Header {
  enum Status { NeedMore, NoMatch, Match } status = NeedMore;
  std::string name;
  size_t arguments_start = 0;
};

Header match_header(std::string_view text, size_t i) {
  Header h;
  // Consumes `literal` at text[i] (after spaces): 1 matched, 0 text ran out, -1 mismatch.
  auto literal = [&](std::string_view lit) {
    i = skip_space(text, i);
    const std::string_view rest = text.substr(std::min(i, text.size()));
    const size_t n = std::min(rest.size(), lit.size());
    if (rest.substr(0, n) != lit.substr(0, n)) return -1;
    if (n < lit.size()) return 0;
    i += lit.size();
    return 1;
  };
  auto step = [&](int r) {
    if (r < 0) h.status = Header::NoMatch;
    return r > 0;
  };
  if (!step(literal("{")) || !step(literal("\"name\"")) || !step(literal(":"))) return h;
  i = skip_space(text, i);
  if (i >= text.size()) return h;
  if (text[i] != '"') {
    h.status = Header::NoMatch;
    return h;
  }
  const auto name_end = json_value_end(text, i, false);
  if (!name_end) return h;
  try {
    h.name = nlohmann::json::parse(text.substr(i, *name_end - i)).get<std::string>();
  } catch (const std::exception&) {
    h.status = Header::NoMatch;
    return h;
  }
  i = *name_end;
  if (!step(literal(","))) return h;
  // "arguments" (Hermes, Mistral) or "parameters" (Llama 3).
  const size_t key = skip_space(text, i);
  int found = -1;
  for (std::string_view lit :
       {std::string_view("\"arguments\""), std::string_view("\"parameters\"")}) {
    i = key;
    const int m = literal(lit);
    if (m > 0) {
      found = 1;
      break;
    }
    if (m == 0) found = 0;
  }
  if (found < 0) h.status = Header::NoMatch;
  if (found <= 0) return h;
  if (!step(literal(":"))) return h;
  i = skip_space(text, i);
  if (i >= text.size()) return h;
  h.status = Header::Match;
  h.arguments_start = i;
  return h;
}

// What a prefix of the answer says so far. Every field only grows as the text grows (the scan
// holds back what more text could still change), which is what lets the stream send diffs.
struct Scan {
  struct Call {
    std::string name;
    std::string arguments;
    std::string raw;  // the JSON text that must parse as a call object (empty: none)
  };
  std::string content;
  std::vector<Call> calls;
};

// A call object that does not open the usual way ("arguments" first, extra keys, ...): taken
// whole once it is complete. False when it is not a call (the caller makes it content).
bool whole_call_object(std::string_view json_text, Scan& scan) {
  try {
    const auto j = nlohmann::ordered_json::parse(json_text);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    Scan::Call call;
    call.name = j["name"].get<std::string>();
    const char* key = j.contains("arguments") ? "arguments" : "parameters";
    call.arguments = j.contains(key) ? j[key].dump(-1, ' ', false) : "{}";
    scan.calls.push_back(std::move(call));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// One call object at text[i] of a format without closing tags (llama3_json, mistral's list):
// returns where it ended, or nullopt when the text stops inside it (what is known is in scan).
std::optional<size_t> scan_call_object(std::string_view text, size_t i, bool final, Scan& scan) {
  const Header h = match_header(text, i);
  if (h.status == Header::Match) {
    Scan::Call call;
    call.name = h.name;
    const auto value_end = json_value_end(text, h.arguments_start, final);
    call.arguments =
        text.substr(h.arguments_start, value_end.value_or(text.size()) - h.arguments_start);
    const auto object_end = value_end ? json_value_end(text, i, final) : std::nullopt;
    if (object_end) call.raw = text.substr(i, *object_end - i);
    if (!object_end && final) call.raw = text.substr(i);
    scan.calls.push_back(std::move(call));
    return object_end;
  }
  if (h.status == Header::NeedMore && !final) return std::nullopt;
  const auto object_end = json_value_end(text, i, final);
  if (!object_end) {
    if (final) scan.content += text.substr(i);
    return std::nullopt;
  }
  if (!whole_call_object(text.substr(i, *object_end - i), scan)) {
    scan.content += text.substr(i, *object_end - i);
  }
  return object_end;
}

Scan scan_hermes(std::string_view text, bool final) {
  Scan scan;
  size_t pos = 0;
  bool after_call = false;
  while (true) {
    const size_t open = text.find(kHermesOpen, pos);
    std::string_view segment =
        text.substr(pos, open == std::string_view::npos ? text.npos : open - pos);
    // Spaces between a call and the text beside it belong to neither.
    if (after_call) segment.remove_prefix(skip_space(segment, 0));
    if (open == std::string_view::npos) {
      if (!final) {
        const size_t hold = marker_prefix_at_end(segment, kHermesOpen);
        segment.remove_suffix(hold);
        segment.remove_suffix(trailing_space(segment));
      }
      scan.content += segment;
      return scan;
    }
    segment.remove_suffix(trailing_space(segment));
    scan.content += segment;
    const size_t body_start = open + kHermesOpen.size();
    const size_t close = text.find(kHermesClose, body_start);
    const bool closed = close != std::string_view::npos;
    const std::string_view body = text.substr(body_start, closed ? close - body_start : text.npos);
    const Header h = match_header(body, 0);
    if (h.status == Header::Match) {
      Scan::Call call;
      call.name = h.name;
      const auto value_end = json_value_end(body, h.arguments_start, closed || final);
      std::string_view arguments =
          body.substr(h.arguments_start, value_end.value_or(body.size()) - h.arguments_start);
      if (!value_end && !closed && !final) {
        arguments.remove_suffix(marker_prefix_at_end(arguments, kHermesClose));
      }
      call.arguments = arguments;
      call.raw = body;
      scan.calls.push_back(std::move(call));
    } else if (!closed && !final) {
      return scan;  // undecided: held back until the block closes
    } else if (!whole_call_object(body, scan)) {
      scan.content += text.substr(open, closed ? close + kHermesClose.size() - open : text.npos);
    }
    if (!closed) return scan;
    pos = close + kHermesClose.size();
    after_call = true;
  }
}

Scan scan_llama3(std::string_view text, bool final) {
  Scan scan;
  size_t i = skip_space(text, 0);
  const std::string_view rest = text.substr(i);
  if (rest.substr(0, kPythonTag.size()) == kPythonTag) {
    i = skip_space(text, i + kPythonTag.size());
  } else if (!final && kPythonTag.substr(0, rest.size()) == rest) {
    return scan;  // nothing yet, or what may become the tag
  }
  if (i >= text.size()) {
    if (final) scan.content = text;
    return scan;
  }
  if (text[i] != '{') {  // an answer, not a call
    scan.content = text;
    return scan;
  }
  while (true) {
    const auto end = scan_call_object(text, i, final, scan);
    if (!end) return scan;
    size_t j = *end;
    while (j < text.size() && (is_space(text[j]) || text[j] == ';')) ++j;
    if (j >= text.size()) return scan;
    if (text[j] != '{') {  // text after the calls
      scan.content += text.substr(skip_space(text, *end));
      return scan;
    }
    i = j;
  }
}

Scan scan_mistral(std::string_view text, bool final) {
  Scan scan;
  const size_t marker = text.find(kMistralCalls);
  if (marker == std::string_view::npos) {
    std::string_view content = text;
    if (!final) content.remove_suffix(marker_prefix_at_end(content, kMistralCalls));
    scan.content = content;
    return scan;
  }
  std::string_view before = text.substr(0, marker);
  before.remove_suffix(trailing_space(before));
  scan.content = before;
  size_t i = marker + kMistralCalls.size();
  while (true) {
    i = skip_space(text, i);
    if (i >= text.size()) return scan;
    if (text[i] == '[') {  // [{"name": ..., "arguments": ...}, ...]
      ++i;
      while (true) {
        i = skip_space(text, i);
        if (i >= text.size()) return scan;
        if (text[i] == ',') {
          ++i;
          continue;
        }
        if (text[i] == ']') {
          ++i;
          break;
        }
        if (text[i] != '{') {
          scan.content += text.substr(i);
          return scan;
        }
        const auto end = scan_call_object(text, i, final, scan);
        if (!end) return scan;
        i = *end;
      }
    } else {  // name[ARGS]{...}
      const size_t args = text.find(kMistralArgs, i);
      if (args == std::string_view::npos) {
        if (final) scan.content += text.substr(i);
        return scan;
      }
      std::string_view name = text.substr(i, args - i);
      name.remove_suffix(trailing_space(name));
      const size_t value = skip_space(text, args + kMistralArgs.size());
      if (value >= text.size() && !final) return scan;
      Scan::Call call;
      call.name = name;
      const auto value_end = json_value_end(text, value, final);
      call.arguments = text.substr(std::min(value, text.size()),
                                   value_end.value_or(text.size()) - std::min(value, text.size()));
      scan.calls.push_back(std::move(call));
      if (!value_end) return scan;
      i = *value_end;
    }
    const size_t next = skip_space(text, i);
    if (text.substr(next, kMistralCalls.size()) == kMistralCalls) {
      i = next + kMistralCalls.size();
      continue;
    }
    if (!final && kMistralCalls.substr(0, text.size() - next) == text.substr(next)) return scan;
    scan.content += text.substr(next);
    return scan;
  }
}

Scan scan_text(ToolCallFormat format, std::string_view text, bool final) {
  switch (format) {
    case ToolCallFormat::Hermes:
      return scan_hermes(text, final);
    case ToolCallFormat::Llama3Json:
      return scan_llama3(text, final);
    case ToolCallFormat::Mistral:
      return scan_mistral(text, final);
    case ToolCallFormat::None:
      break;
  }
  Scan scan;
  scan.content = text;
  return scan;
}

bool parses_as_json(std::string_view text) {
  return nlohmann::json::accept(text.begin(), text.end());
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::Hermes;
  if (name == "llama3_json") return ToolCallFormat::Llama3Json;
  if (name == "mistral") return ToolCallFormat::Mistral;
  if (name == "none") return ToolCallFormat::None;
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes:
      return "hermes";
    case ToolCallFormat::Llama3Json:
      return "llama3_json";
    case ToolCallFormat::Mistral:
      return "mistral";
    case ToolCallFormat::None:
      break;
  }
  return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view chat_template) {
  if (chat_template.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::Hermes;
  if (chat_template.find(kMistralCalls) != std::string_view::npos) return ToolCallFormat::Mistral;
  if (chat_template.find(kPythonTag) != std::string_view::npos ||
      (chat_template.find("<|start_header_id|>") != std::string_view::npos &&
       chat_template.find("\"parameters\"") != std::string_view::npos)) {
    return ToolCallFormat::Llama3Json;
  }
  return ToolCallFormat::None;
}

std::string random_tool_call_id() {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, ToolCallIdMaker make_id)
    : format_(format), make_id_(std::move(make_id)) {}

ToolStreamDelta ToolCallStreamParser::push(std::string_view text) {
  text_ += text;
  return parse(/*final=*/false);
}

ToolStreamDelta ToolCallStreamParser::finish() { return parse(/*final=*/true); }

ToolStreamDelta ToolCallStreamParser::parse(bool final) {
  const Scan scan = scan_text(format_, text_, final);
  ToolStreamDelta delta;
  if (scan.content.size() > content_sent_) {
    delta.content = scan.content.substr(content_sent_);
    content_sent_ = scan.content.size();
  }
  for (size_t i = 0; i < scan.calls.size(); ++i) {
    const Scan::Call& seen = scan.calls[i];
    const int index = static_cast<int>(i);
    if (i == calls_.size()) {
      calls_.push_back({make_id_(), seen.name, "", ""});
      delta.calls.push_back({index, calls_.back().id, seen.name, ""});
    }
    CallState& call = calls_[i];
    // Arguments only grow; a call that turned out malformed cannot take back what was sent.
    if (seen.arguments.size() > call.arguments.size() &&
        seen.arguments.compare(0, call.arguments.size(), call.arguments) == 0) {
      delta.calls.push_back(
          {index, std::nullopt, std::nullopt, seen.arguments.substr(call.arguments.size())});
      call.arguments = seen.arguments;
    }
    call.raw = seen.raw;
  }
  return delta;
}

ParsedToolCalls parse_tool_calls(ToolCallFormat format, std::string_view text,
                                 const ToolCallIdMaker& make_id) {
  ToolCallStreamParser parser(format, make_id);
  ToolStreamDelta first = parser.push(text);
  ToolStreamDelta last = parser.finish();
  ParsedToolCalls parsed;
  bool valid = true;
  for (const ToolCallStreamParser::CallState& call : parser.calls()) {
    if (call.name.empty() || !parses_as_json(call.arguments) ||
        (!call.raw.empty() && !parses_as_json(call.raw))) {
      valid = false;
    }
  }
  if (!valid) {  // vLLM: a malformed call makes the whole answer content
    if (!text.empty()) parsed.content = std::string(text);
    return parsed;
  }
  for (const ToolCallStreamParser::CallState& call : parser.calls()) {
    parsed.calls.push_back({call.id, call.name, call.arguments});
  }
  std::string content = first.content + last.content;
  if (!content.empty()) parsed.content = std::move(content);
  return parsed;
}

}  // namespace attnres::server
