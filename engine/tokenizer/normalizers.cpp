// Normalizers: NFC, Prepend, Replace (literal pattern), Sequence.
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/json_fields.h"
#include "engine/tokenizer/components.h"
#include "engine/tokenizer/unicode_util.h"

namespace attnres::tok {

const nlohmann::json& required_field(const nlohmann::json& j, const char* component,
                                     const char* key) {
  auto it = j.find(key);  // a JSON null is present: the caller says whether it may be
  if (it == j.end()) {
    JsonFields<nlohmann::json>(j, JsonFieldOptions::with_origin(component)).fail(key, "missing");
  }
  return *it;
}

std::string string_field(const nlohmann::json& j, const char* component, const char* key) {
  const auto& v = required_field(j, component, key);
  if (!v.is_string()) json_wrong_type(v, key, "a string", JsonFieldOptions::with_origin(component));
  return v.get<std::string>();
}

bool bool_field(const nlohmann::json& j, const char* component, const char* key, bool fallback) {
  const JsonFields<nlohmann::json> fields(j, JsonFieldOptions::with_origin(component));
  return fields.boolean(key).value_or(fallback);
}

std::string string_pattern(const nlohmann::json& j, const char* component) {
  const auto& p = required_field(j, component, "pattern");
  if (p.is_object() && p.contains("String") && p["String"].is_string()) {
    return p["String"].get<std::string>();
  }
  if (p.is_object() && p.contains("Regex")) {
    throw Error(std::string("unsupported ") + component + " regex pattern: " + p["Regex"].dump() +
                " (only literal String patterns)");
  }
  throw Error(std::string(component) + ".pattern must be {\"String\": ...}");
}

namespace {

class NfcNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = nfc(text); }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);  // HF prepends only to non-empty text
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    if (pattern_.empty() || text.find(pattern_) == std::string::npos) return;
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    for (size_t hit; (hit = text.find(pattern_, pos)) != std::string::npos;
         pos = hit + pattern_.size()) {
      out.append(text, pos, hit - pos);
      out += content_;
    }
    out.append(text, pos, std::string::npos);
    text = std::move(out);
  }

 private:
  std::string pattern_, content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  if (!j.is_object()) throw Error("normalizer must be an object or null");
  const std::string type = string_field(j, "normalizer", "type");
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(string_field(j, "Prepend normalizer", "prepend"));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(string_pattern(j, "Replace normalizer"),
                                               string_field(j, "Replace normalizer", "content"));
  }
  if (type == "Sequence") {
    const auto& list = required_field(j, "Sequence normalizer", "normalizers");
    if (!list.is_array()) throw Error("Sequence normalizer.normalizers must be an array");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& item : list) {
      if (auto n = make_normalizer(item)) parts.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  throw Error("unsupported normalizer type \"" + type + "\"");
}

}  // namespace attnres::tok
