// Pre-tokenizers: ByteLevel, Split (known regexes / literal, Isolated), Metaspace, Sequence.
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/core/error.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/components.h"
#include "engine/tokenizer/split_patterns.h"

namespace attnres::tok {
namespace {

// Replaces every piece by the pieces `split` makes of it (empty pieces are dropped, as in
// HF's PreTokenizedString::split). Only the first sub-piece can still be at the origin.
template <typename SplitFn>
void split_each(std::vector<Segment>& pieces, SplitFn split) {
  std::vector<Segment> out;
  out.reserve(pieces.size() * 2);
  std::vector<std::string> parts;
  for (auto& piece : pieces) {
    parts.clear();
    split(piece.text, parts);
    bool first = true;
    for (auto& p : parts) {
      if (p.empty()) continue;
      out.push_back({std::move(p), -1, piece.at_origin && first});
      first = false;
    }
  }
  pieces = std::move(out);
}

void split_isolated(SplitPattern pattern, const std::string& text, std::vector<std::string>& out) {
  size_t begin = 0;
  for (size_t end : split_with_pattern(pattern, text)) {
    out.push_back(text.substr(begin, end - begin));
    begin = end;
  }
}

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void pre_tokenize(std::vector<Segment>& pieces) const override {
    split_each(pieces, [&](std::string& text, std::vector<std::string>& out) {
      if (add_prefix_space_ && (text.empty() || text[0] != ' ')) text.insert(text.begin(), ' ');
      if (use_regex_) {
        split_isolated(SplitPattern::kGpt2, text, out);
      } else {
        out.push_back(std::move(text));
      }
      for (auto& p : out) {
        std::string mapped;
        mapped.reserve(p.size() * 2);
        byte_level_encode(p, mapped);
        p = std::move(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_, use_regex_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::optional<SplitPattern> regex, std::string literal)
      : regex_(regex), literal_(std::move(literal)) {}
  void pre_tokenize(std::vector<Segment>& pieces) const override {
    split_each(pieces, [&](std::string& text, std::vector<std::string>& out) {
      if (regex_) {
        split_isolated(*regex_, text, out);
        return;
      }
      // Literal pattern, Isolated: every occurrence is a piece, and so is the text between.
      size_t pos = 0;
      for (size_t hit; !literal_.empty() && (hit = text.find(literal_, pos)) != std::string::npos;
           pos = hit + literal_.size()) {
        out.push_back(text.substr(pos, hit - pos));
        out.push_back(literal_);
      }
      out.push_back(text.substr(pos));
    });
  }

 private:
  std::optional<SplitPattern> regex_;
  std::string literal_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Segment>& pieces) const override {
    std::vector<Segment> out;
    for (auto& piece : pieces) {
      std::string text;
      for (char c : piece.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text.push_back(c);
        }
      }
      const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && piece.at_origin))) {
        text = replacement_ + text;
      }
      if (!split_) {
        out.push_back({std::move(text), -1, piece.at_origin});
        continue;
      }
      // MergedWithNext: each replacement character starts a new piece.
      size_t begin = 0;
      bool first = true;
      for (size_t hit = text.find(replacement_, 1); hit != std::string::npos;
           hit = text.find(replacement_, hit + replacement_.size())) {
        if (hit > begin) {
          out.push_back({text.substr(begin, hit - begin), -1, piece.at_origin && first});
          first = false;
        }
        begin = hit;
      }
      if (text.size() > begin) out.push_back({text.substr(begin), -1, piece.at_origin && first});
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Segment>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

PrependScheme parse_prepend_scheme(const nlohmann::json& j, const char* component) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = string_field(j, component, "prepend_scheme");
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    throw Error(std::string("unsupported ") + component + " prepend_scheme \"" + s + "\"");
  }
  // Older files: add_prefix_space true meant "always".
  return bool_field(j, component, "add_prefix_space", true) ? PrependScheme::kAlways
                                                            : PrependScheme::kNever;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  if (!j.is_object()) throw Error("pre_tokenizer must be an object or null");
  const std::string type = string_field(j, "pre_tokenizer", "type");
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(
        bool_field(j, "ByteLevel pre_tokenizer", "add_prefix_space", true),
        bool_field(j, "ByteLevel pre_tokenizer", "use_regex", true));
  }
  if (type == "Split") {
    const char* what = "Split pre_tokenizer";
    const std::string behavior = string_field(j, what, "behavior");
    if (behavior != "Isolated") {
      throw Error("unsupported Split pre_tokenizer behavior \"" + behavior + "\" (only Isolated)");
    }
    if (bool_field(j, what, "invert", false)) {
      throw Error("unsupported Split pre_tokenizer with invert: true");
    }
    const auto& p = required_field(j, what, "pattern");
    if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      return std::make_unique<SplitPreTokenizer>(
          recognise_split_pattern(p["Regex"].get<std::string>()), "");
    }
    return std::make_unique<SplitPreTokenizer>(std::nullopt, string_pattern(j, what));
  }
  if (type == "Metaspace") {
    const char* what = "Metaspace pre_tokenizer";
    return std::make_unique<MetaspacePreTokenizer>(string_field(j, what, "replacement"),
                                                   parse_prepend_scheme(j, what),
                                                   bool_field(j, what, "split", true));
  }
  if (type == "Sequence") {
    const auto& list = required_field(j, "Sequence pre_tokenizer", "pretokenizers");
    if (!list.is_array()) throw Error("Sequence pre_tokenizer.pretokenizers must be an array");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& item : list) {
      if (auto p = make_pre_tokenizer(item)) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  throw Error("unsupported pre_tokenizer type \"" + type + "\"");
}

}  // namespace attnres::tok
