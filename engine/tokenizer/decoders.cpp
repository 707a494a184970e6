// Decoders (HF decode_chain semantics): ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
// Sequence.
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/components.h"
#include "engine/tokenizer/unicode_util.h"

namespace attnres::tok {
namespace {

// All tokens become one string: byte-level characters turn back into bytes (a token with any
// other character is kept as its UTF-8), then invalid UTF-8 is replaced like from_utf8_lossy.
class ByteLevelDecoder final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      if (!byte_level_decode(t, bytes)) bytes += t;
    }
    tokens.assign(1, utf8_lossy(bytes));
    state.single_token = true;
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  void decode(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // HF drops every replacement character of the very first token (the prepended space).
      // A continuation chunk's first token is not the text's first token, unless an earlier
      // stage fused everything (then token 0 is the whole text in a full decode too).
      const bool drop =
          i == 0 && scheme_ != PrependScheme::kNever && (!state.continuation || state.single_token);
      std::string out;
      const std::string& t = tokens[i];
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!drop) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode(std::vector<std::string>& tokens, DecodeState&) const override {
    if (pattern_.empty()) return;
    for (auto& t : tokens) {
      std::string out;
      size_t pos = 0;
      for (size_t hit; (hit = t.find(pattern_, pos)) != std::string::npos;
           pos = hit + pattern_.size()) {
        out.append(t, pos, hit - pos);
        out += content_;
      }
      out.append(t, pos, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string pattern_, content_;
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const int hi = hex_value(t[3]), lo = hex_value(t[4]);
  if (t[3] == '+' && lo >= 0) return lo;  // Rust's u8::from_str_radix accepts a '+' sign
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

namespace {

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens, DecodeState&) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;  // bytes of consecutive <0xAB> tokens
    auto flush = [&] {
      if (run.empty()) return;
      if (!find_invalid_utf8(run)) {
        out.push_back(run);
      } else {
        // HF: an invalid run yields one U+FFFD per byte, not per maximal subpart.
        for (size_t k = 0; k < run.size(); ++k) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (auto& t : tokens) {
      const int byte = parse_byte_token(t);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
    state.single_token = true;
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decode(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // Once fused, the start of the (only) token is the start of the text: a continuation
      // chunk is in the middle of the text and must keep its leading characters.
      const size_t start = (state.continuation && state.single_token) ? 0 : start_;
      tokens[i] = strip(tokens[i], start);
    }
  }

 private:
  std::string strip(const std::string& t, size_t start) const {
    std::vector<char32_t> chars;
    for (size_t i = 0; i < t.size();) {
      char32_t cp = 0;
      int len = decode_utf8_at(t, i, &cp);
      if (len == 0) len = 1;
      chars.push_back(cp);
      i += len;
    }
    size_t begin = 0;
    while (begin < start && begin < chars.size() && chars[begin] == content_) ++begin;
    size_t end = chars.size();
    for (size_t k = 0; k < stop_ && end > begin && chars[end - 1] == content_; ++k) --end;
    std::string out;
    for (size_t k = begin; k < end; ++k) append_utf8(out, chars[k]);
    return out;
  }

  char32_t content_;
  size_t start_, stop_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void decode(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (const auto& p : parts_) p->decode(tokens, state);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

size_t size_field(const nlohmann::json& j, const char* key) {
  const auto& v = required_field(j, "Strip decoder", key);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    throw Error(std::string("Strip decoder.") + key + " must be a non-negative integer");
  }
  return v.get<size_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, DecoderTraits& traits) {
  if (j.is_null()) return nullptr;
  if (!j.is_object()) throw Error("decoder must be an object or null");
  const std::string type = string_field(j, "decoder", "type");
  if (type == "ByteLevel") {
    traits.byte_level = true;
    return std::make_unique<ByteLevelDecoder>();
  }
  if (type == "Metaspace") {
    traits.has_metaspace = true;
    return std::make_unique<MetaspaceDecoder>(string_field(j, "Metaspace decoder", "replacement"),
                                              parse_prepend_scheme(j, "Metaspace decoder"));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(string_pattern(j, "Replace decoder"),
                                            string_field(j, "Replace decoder", "content"));
  }
  if (type == "ByteFallback") {
    traits.byte_fallback = true;
    return std::make_unique<ByteFallbackDecoder>();
  }
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string content = string_field(j, "Strip decoder", "content");
    char32_t cp = 0;
    if (content.empty() || decode_utf8_at(content, 0, &cp) != static_cast<int>(content.size())) {
      throw Error("Strip decoder.content must be a single character");
    }
    const size_t start = size_field(j, "start"), stop = size_field(j, "stop");
    traits.max_strip_start = std::max(traits.max_strip_start, start);
    traits.total_strip_stop += stop;
    return std::make_unique<StripDecoder>(cp, start, stop);
  }
  if (type == "Sequence") {
    const auto& list = required_field(j, "Sequence decoder", "decoders");
    if (!list.is_array()) throw Error("Sequence decoder.decoders must be an array");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& item : list) {
      if (auto d = make_decoder(item, traits)) parts.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  throw Error("unsupported decoder type \"" + type + "\"");
}

}  // namespace attnres::tok
