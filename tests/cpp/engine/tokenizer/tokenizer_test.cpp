// Unit tests for engine/tokenizer: error reporting, added-token flags and the incremental
// decoder. Id-level parity with HF lives in tests/python/test_tokenizer_parity.py; here expected
// values come from the tokenizer under test (token_to_id, decode) or from a tiny synthetic vocab.
#include "engine/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/tokenizer/tokenizer_config.h"
#include "engine/tokenizer/unicode_util.h"

namespace attnres {
namespace {

const std::string kDataDir = ATTNRES_TOKENIZER_DATA_DIR;

std::string data_file(const std::string& name) { return kDataDir + "/" + name + "/tokenizer.json"; }

// The error message of `fn`, or "" if it did not throw attnres::Error.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A tiny tokenizer: one id per character, no merges, a Fuse decoder, and added tokens with
// every flag; `added` and `extra` are spliced into the JSON.
std::string synthetic_json(const std::string& added, const std::string& pre_tokenizer = "null") {
  return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":[)" + added +
         R"(],"normalizer":null,"pre_tokenizer":)" + pre_tokenizer +
         R"(,"post_processor":null,"decoder":{"type":"Fuse"},)"
         R"("model":{"type":"BPE","dropout":null,"unk_token":null,"fuse_unk":false,)"
         R"("vocab":{"a":0,"b":1," ":2,"c":3,"<":4,">":5,"X":6,"Y":7,"Z":8},"merges":[]}})";
}

std::string added_token(int id, const std::string& content, bool special, bool lstrip, bool rstrip,
                        bool single_word) {
  auto b = [](bool v) { return v ? "true" : "false"; };
  return "{\"id\":" + std::to_string(id) + ",\"content\":\"" + content +
         "\",\"single_word\":" + b(single_word) + ",\"lstrip\":" + b(lstrip) +
         ",\"rstrip\":" + b(rstrip) + ",\"normalized\":false,\"special\":" + b(special) + "}";
}

std::shared_ptr<const Tokenizer> flags_tokenizer() {
  // Ids follow the vocab (9 entries), as HF assigns them.
  const std::string added = added_token(9, "<X>", true, true, false, false) + "," +
                            added_token(10, "<Y>", false, false, true, false) + "," +
                            added_token(11, "ab", false, false, false, true) + "," +
                            added_token(12, "<Z>", true, false, false, false);
  return Tokenizer::from_json_string(synthetic_json(added), "synthetic.json");
}

TEST(TokenizerErrors, MalformedJsonNamesTheFile) {
  const std::string msg =
      error_of([] { Tokenizer::from_json_string("{\"model\": ", "broken/tokenizer.json"); });
  EXPECT_NE(msg.find("broken/tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
}

TEST(TokenizerErrors, MissingFile) {
  const std::string msg = error_of([] { Tokenizer::load("/nonexistent/tokenizer.json"); });
  EXPECT_NE(msg.find("/nonexistent/tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(TokenizerErrors, UnsupportedModelType) {
  std::string json = synthetic_json("");
  json.replace(json.find("\"BPE\""), 5, "\"WordPiece\"");
  const std::string msg = error_of([&] { Tokenizer::from_json_string(json, "wp.json"); });
  EXPECT_NE(msg.find("wp.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unsupported model type \"WordPiece\""), std::string::npos) << msg;
}

TEST(TokenizerErrors, UnsupportedRegexIsQuoted) {
  const std::string pre =
      R"({"type":"Split","pattern":{"Regex":"\\w+|[^\\w\\s]+"},"behavior":"Isolated","invert":false})";
  const std::string msg =
      error_of([&] { Tokenizer::from_json_string(synthetic_json("", pre), "re.json"); });
  EXPECT_NE(msg.find("unsupported pre-tokenizer regex: \\w+|[^\\w\\s]+"), std::string::npos) << msg;
}

TEST(TokenizerErrors, UnsupportedComponentsAreNamed) {
  std::string json = synthetic_json("");
  json.replace(json.find("\"normalizer\":null"), 17, R"("normalizer":{"type":"Lowercase"})");
  std::string msg = error_of([&] { Tokenizer::from_json_string(json, "n.json"); });
  EXPECT_NE(msg.find("unsupported normalizer type \"Lowercase\""), std::string::npos) << msg;

  json = synthetic_json("");
  json.replace(json.find("{\"type\":\"Fuse\"}"), 15, R"({"type":"WordPiece","prefix":"##"})");
  msg = error_of([&] { Tokenizer::from_json_string(json, "d.json"); });
  EXPECT_NE(msg.find("unsupported decoder type \"WordPiece\""), std::string::npos) << msg;

  const std::string pre = R"({"type":"Split","pattern":{"String":" "},"behavior":"Removed"})";
  msg = error_of([&] { Tokenizer::from_json_string(synthetic_json("", pre), "s.json"); });
  EXPECT_NE(msg.find("unsupported Split pre_tokenizer behavior \"Removed\""), std::string::npos)
      << msg;
}

// The typed reads of tokenizer.json and tokenizer_config.json use engine/core/json_fields: the
// message names the file, the part of it and the field.
TEST(TokenizerErrors, WrongTypesNameTheField) {
  std::string json = synthetic_json("");
  json.replace(json.find("\"fuse_unk\":false"), 16, R"("fuse_unk":"no")");
  std::string msg = error_of([&] { Tokenizer::from_json_string(json, "f.json"); });
  EXPECT_EQ(msg, "f.json: model: field fuse_unk: expected true or false, got the string \"no\"");
  json = synthetic_json("");
  json.replace(json.find("{\"type\":\"Fuse\"}"), 15,
               R"({"type":"Strip","content":7,"start":0,"stop":0})");
  msg = error_of([&] { Tokenizer::from_json_string(json, "s.json"); });
  EXPECT_NE(msg.find("s.json: Strip decoder: field content: expected a string, got the number 7"),
            std::string::npos)
      << msg;
  msg = error_of(
      [] { TokenizerConfig::from_json(nlohmann::json::parse(R"({"bos_token": 5})"), "cfg"); });
  EXPECT_EQ(msg,
            "cfg: field bos_token: expected a string or an AddedToken object with a string "
            "\"content\", got the number 5");
  msg = error_of(
      [] { TokenizerConfig::from_json(nlohmann::json::parse(R"({"add_bos_token": 1})"), "cfg"); });
  EXPECT_EQ(msg, "cfg: field add_bos_token: expected true or false, got the number 1");
}

TEST(TokenizerErrors, BadMergeIsReported) {
  std::string json = synthetic_json("");
  json.replace(json.find("\"merges\":[]"), 11, R"("merges":["a q"])");
  const std::string msg = error_of([&] { Tokenizer::from_json_string(json, "m.json"); });
  EXPECT_NE(msg.find("m.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("merge #0 (a q) uses a token not in the vocab"), std::string::npos) << msg;
}

TEST(TokenizerEncode, InvalidUtf8SaysWhere) {
  auto tok = Tokenizer::load(data_file("gpt2"));
  const std::string msg = error_of([&] { tok->encode("abc\xC3(def"); });
  EXPECT_NE(msg.find("not valid UTF-8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset 3"), std::string::npos) << msg;
  // Surrogates encoded in UTF-8 and overlong forms are invalid too.
  EXPECT_NE(error_of([&] { tok->encode("\xED\xA0\x80"); }), "");
  EXPECT_NE(error_of([&] { tok->encode("\xC0\xAF"); }), "");
  EXPECT_EQ(error_of([&] { tok->encode("ok \xF0\x9F\x98\x80"); }), "");
}

TEST(TokenizerDecode, OutOfRangeIdThrows) {
  auto tok = Tokenizer::load(data_file("gpt2"));
  ASSERT_EQ(tok->vocab_size(), 50257);
  const std::vector<int32_t> too_big{15496, tok->vocab_size()};
  std::string msg = error_of([&] { tok->decode(too_big); });
  EXPECT_NE(msg.find("token id 50257 is out of range [0, 50257)"), std::string::npos) << msg;
  const std::vector<int32_t> negative{-1};
  msg = error_of([&] { tok->decode(negative); });
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  IncrementalDecoder inc(tok, false);
  EXPECT_NE(error_of([&] { inc.push(-5); }), "");
}

TEST(TokenizerVocab, LookupsAndSpecials) {
  auto tok = Tokenizer::load(data_file("qwen3"));
  EXPECT_EQ(tok->vocab_size(), 151669);
  const auto im_start = tok->token_to_id("<|im_start|>");
  ASSERT_TRUE(im_start.has_value());
  EXPECT_TRUE(tok->is_special(*im_start));
  EXPECT_EQ(tok->id_to_token(*im_start), "<|im_start|>");
  const auto hello = tok->token_to_id("Hello");
  ASSERT_TRUE(hello.has_value());
  EXPECT_FALSE(tok->is_special(*hello));
  EXPECT_EQ(tok->encode("Hello", false), std::vector<int32_t>{*hello});
  EXPECT_FALSE(tok->token_to_id("no such token here").has_value());
  EXPECT_EQ(tok->id_to_token(-3), "");
}

// Every piece the incremental decoder returns is valid UTF-8, and the pieces add up to decode().
void expect_streams_exactly(const std::shared_ptr<const Tokenizer>& tok,
                            const std::vector<int32_t>& ids, bool skip,
                            std::vector<std::string>* pieces = nullptr) {
  IncrementalDecoder inc(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = inc.push(id);
    EXPECT_FALSE(tok::find_invalid_utf8(piece).has_value()) << "partial character emitted";
    if (pieces) pieces->push_back(piece);
    all += piece;
  }
  all += inc.flush();
  EXPECT_EQ(all, tok->decode(ids, skip));
}

TEST(IncrementalDecoder, ByteFallbackEmojiWaitsForTheWholeCharacter) {
  auto tok = Tokenizer::load(data_file("tinyllama"));
  // U+1FAE0 is not in the Llama-2 vocab, so it is spelled with four <0x..> byte tokens.
  const std::string text = "Hi \xF0\x9F\xAB\xA0 there";
  const std::vector<int32_t> ids = tok->encode(text, true);
  std::vector<int32_t> byte_positions;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (tok->id_to_token(ids[i]).rfind("<0x", 0) == 0) byte_positions.push_back(i);
  }
  ASSERT_EQ(byte_positions.size(), 4u) << "expected the emoji as 4 byte-fallback tokens";
  std::vector<std::string> pieces;
  expect_streams_exactly(tok, ids, false, &pieces);
  for (int32_t pos : byte_positions) EXPECT_EQ(pieces[pos], "") << "at byte token " << pos;
  EXPECT_EQ(tok->decode(ids, true), text);
  expect_streams_exactly(tok, ids, true);
}

TEST(IncrementalDecoder, ByteLevelEmojiSplitAcrossTokens) {
  for (const char* name : {"gpt2", "llama3.2", "qwen3"}) {
    auto tok = Tokenizer::load(data_file(name));
    const std::string text =
        "family: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
        "\xF0\x9F\x91\xA7 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD done";
    const std::vector<int32_t> ids = tok->encode(text, true);
    // At least one token must end inside a character for this test to mean anything.
    bool split_inside_char = false;
    for (size_t i = 1; i < ids.size(); ++i) {
      const std::string prefix = tok->decode(std::span<const int32_t>(ids.data(), i), true);
      split_inside_char |= prefix.ends_with(tok::kReplacementChar);
    }
    EXPECT_TRUE(split_inside_char) << name;
    expect_streams_exactly(tok, ids, false);
    expect_streams_exactly(tok, ids, true);
    EXPECT_EQ(tok->decode(ids, true), text) << name;
  }
}

TEST(IncrementalDecoder, LeadingSpaceAndSpecialsMatchFullDecode) {
  auto tok = Tokenizer::load(data_file("tinyllama"));
  for (const std::string text : {" leading", "  two", "<s> x </s>", "a\n\nb", ""}) {
    const std::vector<int32_t> ids = tok->encode(text, true);
    expect_streams_exactly(tok, ids, false);
    expect_streams_exactly(tok, ids, true);
  }
  // Invalid byte runs resolve only when the run ends: one U+FFFD per byte, as HF does.
  const std::vector<int32_t> bad{*tok->token_to_id("<0xE2>"), *tok->token_to_id("<0x82>"),
                                 *tok->token_to_id("<0x41>"), *tok->token_to_id("▁ok")};
  expect_streams_exactly(tok, bad, false);
}

TEST(AddedTokens, LstripAbsorbsSpacesBefore) {
  auto tok = flags_tokenizer();
  EXPECT_EQ(tok->encode("c  <X>c"), (std::vector<int32_t>{3, 9, 3}));
  // <Z> has no lstrip: the spaces stay ordinary tokens.
  EXPECT_EQ(tok->encode("c  <Z>c"), (std::vector<int32_t>{3, 2, 2, 12, 3}));
}

TEST(AddedTokens, RstripAbsorbsSpacesAfter) {
  auto tok = flags_tokenizer();
  EXPECT_EQ(tok->encode("c <Y>  c"), (std::vector<int32_t>{3, 2, 10, 3}));
}

TEST(AddedTokens, SingleWordOnlyMatchesWholeWords) {
  auto tok = flags_tokenizer();
  EXPECT_EQ(tok->encode("ab c"), (std::vector<int32_t>{11, 2, 3}));
  EXPECT_EQ(tok->encode("c ab"), (std::vector<int32_t>{3, 2, 11}));
  EXPECT_EQ(tok->encode("cab"), (std::vector<int32_t>{3, 0, 1}));
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{0, 1, 3}));
}

TEST(AddedTokens, FileIdsAreReassignedLikeHf) {
  // HF ignores an added token's id in the file: existing vocab entries keep their vocab id,
  // new ones are numbered after the vocab (see the gpt2-added-flags parity variant).
  const std::string added = added_token(500, "c", false, false, false, false) + "," +
                            added_token(700, "<Q>", true, false, false, false);
  auto tok = Tokenizer::from_json_string(synthetic_json(added), "ids.json");
  EXPECT_EQ(tok->token_to_id("c"), 3);
  EXPECT_EQ(tok->token_to_id("<Q>"), 9);
  EXPECT_EQ(tok->vocab_size(), 10);
}

TEST(AddedTokens, SpecialFlagAndSkipOnDecode) {
  auto tok = flags_tokenizer();
  EXPECT_TRUE(tok->is_special(9));
  EXPECT_FALSE(tok->is_special(10));
  EXPECT_FALSE(tok->is_special(3));
  const std::vector<int32_t> ids{3, 9, 10, 12, 0};
  EXPECT_EQ(tok->decode(ids, false), "c<X><Y><Z>a");
  EXPECT_EQ(tok->decode(ids, true), "c<Y>a");
  EXPECT_EQ(tok->vocab_size(), 13);
  expect_streams_exactly(tok, ids, true);
}

TEST(AddedTokens, TemplateAddsBosOnlyWithSpecialTokens) {
  auto tok = Tokenizer::load(data_file("llama3.2"));
  const auto bos = tok->token_to_id("<|begin_of_text|>");
  ASSERT_TRUE(bos.has_value());
  const std::vector<int32_t> with = tok->encode("Hi", true), without = tok->encode("Hi", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], *bos);
  EXPECT_EQ(std::vector<int32_t>(with.begin() + 1, with.end()), without);
  // A special token typed in the text is matched, never split.
  const std::vector<int32_t> typed = tok->encode("<|begin_of_text|>", false);
  EXPECT_EQ(typed, std::vector<int32_t>{*bos});
}

}  // namespace
}  // namespace attnres
