#include "engine/sample/constraint_compiler.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "engine/core/error.h"
#include "engine/sample/compiled_constraint.h"
#include "engine/sample/json_schema_support.h"

namespace attnres {

namespace {

const char* kind_name(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::JsonSchema:
      return "JSON schema";
    case ConstraintKind::JsonObject:
      return "JSON object";
    case ConstraintKind::Regex:
      return "regex";
    case ConstraintKind::Choice:
      return "choice";
    case ConstraintKind::Grammar:
      return "grammar";
    case ConstraintKind::StructuralTag:
      return "structural tag";
  }
  return "constraint";
}

xgrammar::VocabType vocab_type(ConstraintVocabulary::Spelling spelling) {
  switch (spelling) {
    case ConstraintVocabulary::Spelling::ByteLevel:
      return xgrammar::VocabType::BYTE_LEVEL;
    case ConstraintVocabulary::Spelling::ByteFallback:
      return xgrammar::VocabType::BYTE_FALLBACK;
    case ConstraintVocabulary::Spelling::Raw:
      break;
  }
  return xgrammar::VocabType::RAW;
}

// An EBNF string literal for `text` (xgrammar's grammar syntax): quotes, backslashes and control
// characters escaped; other UTF-8 kept as is.
std::string ebnf_literal(const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// Choice: a JSON array of strings -> `root ::= "a" | "b"`.
std::string choice_grammar(const std::string& spec) {
  const nlohmann::json choices = nlohmann::json::parse(spec, nullptr, /*allow_exceptions=*/false);
  if (!choices.is_array() || choices.empty()) {
    throw Error("expected a non-empty array of strings");
  }
  if (choices.size() > kMaxChoices) {
    throw Error("has " + std::to_string(choices.size()) + " choices, at most " +
                std::to_string(kMaxChoices) + " are allowed");
  }
  std::string grammar = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (!choices[i].is_string()) throw Error("choice " + std::to_string(i) + " is not a string");
    const std::string& text = choices[i].get_ref<const std::string&>();
    if (text.empty()) throw Error("choice " + std::to_string(i) + " is empty");
    if (i > 0) grammar += " | ";
    grammar += ebnf_literal(text);
  }
  return grammar;
}

// xgrammar prefixes some messages with its source location ("[12:00:00] /path/x.cc:12: ...");
// the user needs only the message.
std::string library_message(const std::exception& e) {
  std::string what = e.what();
  if (!what.empty() && what[0] == '[') {
    const size_t cut = what.find(": ", what.find(']'));
    if (cut != std::string::npos) what = what.substr(cut + 2);
  }
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  return what;
}

}  // namespace

struct ConstraintCompiler::Xgrammar {
  explicit Xgrammar(xgrammar::TokenizerInfo info)
      : tokenizer_info(std::move(info)),
        // Our own cache (below) keeps compiled grammars; two threads per compile.
        compiler(tokenizer_info, /*max_threads=*/2, /*cache_enabled=*/false) {}
  xgrammar::TokenizerInfo tokenizer_info;
  xgrammar::GrammarCompiler compiler;
};

ConstraintCompiler::ConstraintCompiler(ConstraintVocabulary vocabulary)
    : rows_(vocabulary.rows), stop_ids_(vocabulary.stop_ids), vocabulary_(std::move(vocabulary)) {
  if (rows_ < static_cast<int>(vocabulary_.tokens.size())) {
    throw Error("constraint vocabulary: " + std::to_string(vocabulary_.tokens.size()) +
                " tokens but only " + std::to_string(rows_) + " logits rows");
  }
}

ConstraintCompiler::~ConstraintCompiler() = default;

ConstraintCompiler::Xgrammar& ConstraintCompiler::xgrammar() const {
  std::call_once(xgrammar_once_, [&] {
    ConstraintVocabulary vocabulary = std::move(vocabulary_);
    // xgrammar takes stop ids only among the listed tokens (ids past the list are special):
    // list up to the largest, the rows between as "" (never allowed).
    for (const int32_t id : vocabulary.stop_ids) {
      if (id >= 0 && id < rows_ && static_cast<size_t>(id) >= vocabulary.tokens.size()) {
        vocabulary.tokens.resize(static_cast<size_t>(id) + 1);
      }
    }
    xgrammar::TokenizerInfo info(vocabulary.tokens, vocab_type(vocabulary.spelling), rows_,
                                 vocabulary.stop_ids, vocabulary.prepends_space);
    xgrammar_ = std::make_unique<Xgrammar>(std::move(info));
  });
  return *xgrammar_;
}

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile(
    const OutputConstraint& constraint) const {
  if (constraint.spec.size() > kMaxConstraintSpecBytes) {
    throw Error(constraint.field + ": the " + kind_name(constraint.kind) + " is " +
                std::to_string(constraint.spec.size()) + " bytes, at most " +
                std::to_string(kMaxConstraintSpecBytes) + " are allowed");
  }
  if (constraint.kind == ConstraintKind::JsonSchema ||
      constraint.kind == ConstraintKind::StructuralTag) {
    if (const int depth = json_nesting_depth(constraint.spec); depth > kMaxConstraintNesting) {
      throw Error(constraint.field + ": the " + kind_name(constraint.kind) + " nests " +
                  std::to_string(depth) + " levels deep, at most " +
                  std::to_string(kMaxConstraintNesting) + " are allowed");
    }
  }
  std::string key = std::to_string(static_cast<int>(constraint.kind));
  key += '\n';
  key += constraint.spec;
  {
    std::lock_guard lock(cache_mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      cache_order_.splice(cache_order_.begin(), cache_order_, it->second.order);
      return it->second.compiled;
    }
  }
  // Compiled outside the lock: two threads asking for the same new spec both compile it.
  std::shared_ptr<const CompiledConstraint> compiled = compile_uncached(constraint);
  std::lock_guard lock(cache_mutex_);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.compiled;
  cache_order_.push_front(key);
  cache_.emplace(std::move(key), CacheEntry{compiled, cache_order_.begin()});
  while (cache_.size() > kConstraintCacheEntries) {
    cache_.erase(cache_order_.back());
    cache_order_.pop_back();
  }
  return compiled;
}

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile_uncached(
    const OutputConstraint& constraint) const {
  Xgrammar& xg = xgrammar();
  const std::string& spec = constraint.spec;
  try {
    std::optional<xgrammar::CompiledGrammar> grammar;
    switch (constraint.kind) {
      case ConstraintKind::JsonSchema:
        if (auto keyword = unsupported_json_schema_keyword(spec)) {
          throw Error("the JSON schema keyword " + *keyword +
                      " is not supported (it could not be enforced)");
        }
        // One layout, {"a": 1, "b": [2]} (no free whitespace): a model cannot stall in whitespace,
        // and every answer parses the same.
        grammar = xg.compiler.CompileJSONSchema(spec, /*any_whitespace=*/false);
        break;
      case ConstraintKind::JsonObject:
        grammar = xg.compiler.CompileJSONSchema(R"({"type": "object"})", false);
        break;
      case ConstraintKind::Regex:
        grammar = xg.compiler.CompileRegex(spec);
        break;
      case ConstraintKind::Choice:
        grammar = xg.compiler.CompileGrammar(choice_grammar(spec));
        break;
      case ConstraintKind::Grammar:
        grammar = xg.compiler.CompileGrammar(spec);
        break;
      case ConstraintKind::StructuralTag:
        grammar = xg.compiler.CompileStructuralTag(spec);
        break;
    }
    ATTNRES_CHECK(grammar.has_value(), "unknown constraint kind");
    return std::make_shared<const CompiledConstraint>(std::move(*grammar), rows_, stop_ids_);
  } catch (const std::exception& e) {
    throw Error(constraint.field + ": invalid " + kind_name(constraint.kind) + ": " +
                library_message(e));
  }
}

}  // namespace attnres
