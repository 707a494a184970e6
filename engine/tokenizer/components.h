// The pluggable stages of a tokenizer.json pipeline (normalizer, pre-tokenizer, decoder),
// built from their JSON objects. Factories throw attnres::Error naming an unsupported "type" or
// a malformed field; the loader prefixes the file name.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "engine/tokenizer/added_vocabulary.h"

namespace attnres::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// Pre-tokenizers split each piece further (a piece is a Segment with added_id < 0).
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Segment>& pieces) const = 0;
};

// Decoders rewrite the list of token strings (HF decode_chain); the final text is the
// concatenation. `continuation` means the tokens continue an already decoded prefix (used by the
// incremental decoder): effects that only apply at the very start of a text are skipped.
struct DecodeState {
  bool continuation = false;
  bool single_token = false;  // an earlier stage (Fuse / ByteLevel) joined everything into one
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode(std::vector<std::string>& tokens, DecodeState& state) const = 0;
};

// What the incremental decoder must know about a decoder pipeline to stream it exactly.
struct DecoderTraits {
  bool byte_fallback = false;   // has ByteFallback: a run of <0x..> tokens resolves only at its end
  size_t max_strip_start = 0;   // largest Strip "start"
  size_t total_strip_stop = 0;  // sum of Strip "stop": that many trailing chars may still vanish
  bool has_metaspace = false;
  bool byte_level = false;  // has ByteLevel: token strings spell bytes as GPT-2's characters
};

// "<0xAB>" -> 0xAB; -1 for any other token string (what ByteFallback treats as a byte).
int parse_byte_token(const std::string& token);

// null JSON -> nullptr for all three.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, DecoderTraits& traits);

// Metaspace's prepend_scheme (shared by the pre-tokenizer and the decoder).
enum class PrependScheme { kAlways, kFirst, kNever };
PrependScheme parse_prepend_scheme(const nlohmann::json& j, const char* component);

// Small JSON accessors shared by the factories, on engine/core/json_fields.h (errors name the
// component and field: "Metaspace decoder: field split: expected true or false, got ...").
const nlohmann::json& required_field(const nlohmann::json& j, const char* component,
                                     const char* key);
std::string string_field(const nlohmann::json& j, const char* component, const char* key);
bool bool_field(const nlohmann::json& j, const char* component, const char* key, bool fallback);
// A {"String": "..."} pattern; a {"Regex": ...} one is reported as unsupported.
std::string string_pattern(const nlohmann::json& j, const char* component);

}  // namespace attnres::tok
