// Loading tokenizer.json and the encode / decode pipeline.
#include "engine/tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/components.h"
#include "engine/tokenizer/unicode_util.h"

namespace attnres {

using nlohmann::json;

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& tokenizer_json_path) {
  std::ifstream in(tokenizer_json_path, std::ios::binary);
  if (!in) throw Error(tokenizer_json_path + ": cannot open tokenizer file");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return from_json_string(buffer.str(), tokenizer_json_path);
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json_string(const std::string& json_text,
                                                             const std::string& origin) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->parse(json_text, origin);
  return t;
}

namespace {

tok::AddedToken parse_added_token(const json& j) {
  if (!j.is_object()) throw Error("added_tokens entries must be objects");
  tok::AddedToken t;
  t.content = tok::string_field(j, "added token", "content");
  const json& id = tok::required_field(j, "added token", "id");
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
    throw Error("added token \"" + t.content + "\" has an invalid id");
  }
  t.id = static_cast<int32_t>(id.get<int64_t>());
  t.special = tok::bool_field(j, "added token", "special", false);
  t.lstrip = tok::bool_field(j, "added token", "lstrip", false);
  t.rstrip = tok::bool_field(j, "added token", "rstrip", false);
  t.single_word = tok::bool_field(j, "added token", "single_word", false);
  t.normalized = tok::bool_field(j, "added token", "normalized", !t.special);
  return t;
}

}  // namespace

void Tokenizer::parse(const std::string& json_text, const std::string& origin) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(origin + ": not valid JSON: " + e.what());
  }
  try {
    if (!root.is_object()) throw Error("the top level must be a JSON object");
    for (const char* key : {"truncation", "padding"}) {
      if (root.contains(key) && !root[key].is_null()) {
        throw Error(std::string("unsupported \"") + key + "\" (must be null)");
      }
    }
    const json& model = tok::required_field(root, "tokenizer.json", "model");
    if (!model.is_object()) throw Error("\"model\" must be an object");
    if (model.contains("type")) {
      const std::string type = tok::string_field(model, "model", "type");
      if (type != "BPE") throw Error("unsupported model type \"" + type + "\" (only BPE)");
    } else if (!model.contains("merges")) {
      throw Error("model has no \"type\" and no \"merges\"; only BPE models are supported");
    }
    model_ = std::make_unique<tok::BpeModel>(model, "model");

    auto component = [&](const char* key) -> const json& {
      static const json kNull;
      auto it = root.find(key);
      return it == root.end() ? kNull : *it;
    };
    normalizer_ = tok::make_normalizer(component("normalizer"));
    pre_tokenizer_ = tok::make_pre_tokenizer(component("pre_tokenizer"));
    decoder_traits_ = std::make_unique<tok::DecoderTraits>();
    decoder_ = tok::make_decoder(component("decoder"), *decoder_traits_);

    vocab_size_ = model_->max_id() + 1;
    raw_matcher_ = std::make_unique<tok::TokenMatcher>();
    normalized_matcher_ = std::make_unique<tok::TokenMatcher>();
    const json& added = component("added_tokens");
    if (!added.is_null() && !added.is_array()) throw Error("\"added_tokens\" must be an array");
    // HF ignores the ids written in the file: an added token takes its vocab id when its content
    // is already in the vocab, else the next id after the vocab and earlier added tokens
    // (AddedVocabulary::add_tokens). Real files agree with this; odd ones must decode the same.
    int32_t max_added_id = -1;
    for (const auto& item : added.is_array() ? added : json::array()) {
      tok::AddedToken t = parse_added_token(item);
      if (t.content.empty()) continue;
      if (auto dup = added_by_content_.find(t.content); dup != added_by_content_.end()) {
        t.id = dup->second;
        const size_t index = added_by_id_.at(t.id);
        added_[index] = t;  // the later definition's flags win, as in HF
        continue;
      }
      if (auto in_vocab = model_->token_to_id(t.content)) {
        t.id = *in_vocab;
      } else {
        t.id = std::max(max_added_id + 1, model_->vocab_count());
      }
      max_added_id = std::max(max_added_id, t.id);
      added_.push_back(std::move(t));
      added_by_id_[added_.back().id] = added_.size() - 1;
      added_by_content_[added_.back().content] = added_.back().id;
    }
    // Matchers are built after all flags are final.
    for (size_t index = 0; index < added_.size(); ++index) {
      const tok::AddedToken& t = added_[index];
      vocab_size_ = std::max(vocab_size_, t.id + 1);
      if (t.special) special_contents_[t.content] = true;
      if (t.normalized) {
        std::string pattern = t.content;
        if (normalizer_) normalizer_->normalize(pattern);
        normalized_matcher_->add(std::move(pattern), index);
      } else {
        raw_matcher_->add(t.content, index);
      }
    }
    parse_post_processor(component("post_processor"));
  } catch (const Error& e) {
    throw Error(origin + ": " + e.what());
  } catch (const json::exception& e) {
    throw Error(origin + ": malformed tokenizer.json: " + e.what());
  }
}

void Tokenizer::parse_post_processor(const json& j) {
  if (j.is_null()) return;
  if (!j.is_object()) throw Error("post_processor must be an object or null");
  const std::string type = tok::string_field(j, "post_processor", "type");
  if (type == "ByteLevel") return;  // only trims offsets: no effect on ids
  if (type == "Sequence") {
    const json& list = tok::required_field(j, "Sequence post_processor", "processors");
    if (!list.is_array()) throw Error("Sequence post_processor.processors must be an array");
    for (const auto& p : list) parse_post_processor(p);
    return;
  }
  if (type != "TemplateProcessing") {
    throw Error("unsupported post_processor type \"" + type + "\"");
  }
  const json& single = tok::required_field(j, "TemplateProcessing", "single");
  const json& specials = tok::required_field(j, "TemplateProcessing", "special_tokens");
  if (!single.is_array()) throw Error("TemplateProcessing.single must be an array");
  // Nested processors wrap what earlier ones produced.
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (const auto& item : single) {
    if (item.contains("Sequence")) {
      const std::string id = tok::string_field(item["Sequence"], "TemplateProcessing item", "id");
      if (id != "A") throw Error("unsupported TemplateProcessing single sequence \"$" + id + "\"");
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      throw Error("TemplateProcessing.single items must be SpecialToken or Sequence");
    }
    const std::string name =
        tok::string_field(item["SpecialToken"], "TemplateProcessing item", "id");
    if (!specials.contains(name)) {
      throw Error("TemplateProcessing special token \"" + name + "\" is not in special_tokens");
    }
    const json& ids =
        tok::required_field(specials[name], "TemplateProcessing special token", "ids");
    for (const auto& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        throw Error("TemplateProcessing special token \"" + name + "\" has an invalid id");
      }
      const auto v = static_cast<int32_t>(id.get<int64_t>());
      vocab_size_ = std::max(vocab_size_, v + 1);
      (seen_sequence ? suffix : prefix).push_back(v);
    }
  }
  if (!seen_sequence) throw Error("TemplateProcessing.single has no $A");
  template_prefix_.insert(template_prefix_.begin(), prefix.begin(), prefix.end());
  template_suffix_.insert(template_suffix_.end(), suffix.begin(), suffix.end());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (auto bad = tok::find_invalid_utf8(text)) {
    throw Error("encode: input is not valid UTF-8 (invalid byte 0x" +
                [](unsigned char b) {
                  const char* hex = "0123456789ABCDEF";
                  return std::string{hex[b >> 4], hex[b & 15]};
                }(static_cast<unsigned char>(text[*bad])) +
                " at byte offset " + std::to_string(*bad) + ")");
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = template_prefix_;
  ids.reserve(text.size() / 3 + 8);

  // 1. Added tokens that match the raw text; 2. normalize the rest, then match the normalized
  // added tokens; 3. pre-tokenize and BPE every remaining piece.
  std::vector<tok::Segment> raw_split, pieces;
  tok::split_on_added_tokens(text, true, *raw_matcher_, added_, raw_split);
  for (auto& seg : raw_split) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    if (normalizer_) normalizer_->normalize(seg.text);
    std::vector<tok::Segment> normalized_split;
    tok::split_on_added_tokens(seg.text, seg.at_origin, *normalized_matcher_, added_,
                               normalized_split);
    for (auto& part : normalized_split) {
      if (part.added_id >= 0) {
        ids.push_back(part.added_id);
        continue;
      }
      pieces.assign(1, std::move(part));
      if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
      for (const auto& word : pieces) model_->tokenize(word.text, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), template_suffix_.begin(), template_suffix_.end());
  return ids;
}

std::vector<std::string> Tokenizer::id_strings(std::span<const int32_t> ids,
                                               bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      throw Error("decode: token id " + std::to_string(id) + " is out of range [0, " +
                  std::to_string(vocab_size_) + ")");
    }
    const std::string* s = nullptr;
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      s = &added_[it->second].content;
    } else {
      s = model_->id_to_token(id);
    }
    if (s == nullptr) continue;  // an id with no token (gap in the vocab): HF drops it too
    if (skip_special && special_contents_.count(*s) != 0) continue;
    tokens.push_back(*s);
  }
  return tokens;
}

std::string Tokenizer::decode_strings(std::vector<std::string> tokens, bool continuation) const {
  if (!decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 || continuation) out.push_back(' ');
      out += tokens[i];
    }
    return out;
  }
  tok::DecodeState state;
  state.continuation = continuation;
  decoder_->decode(tokens, state);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return decode_strings(id_strings(ids, skip_special_tokens), false);
}

int32_t Tokenizer::vocab_size() const { return vocab_size_; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) {
    return it->second;
  }
  return model_->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  const std::string* s = model_->id_to_token(id);
  return s ? *s : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

Tokenizer::TokenSpelling Tokenizer::token_spelling() const {
  if (decoder_traits_->byte_level) return TokenSpelling::ByteLevel;
  if (decoder_traits_->byte_fallback) return TokenSpelling::ByteFallback;
  return TokenSpelling::Raw;
}

bool Tokenizer::prepends_space() const { return decoder_traits_->has_metaspace; }

}  // namespace attnres
