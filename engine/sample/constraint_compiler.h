// Structured output's compile step: turns an OutputConstraint (sampling_params.h) into a
// grammar compiled against the model's vocabulary, with xgrammar (docs/ARCHITECTURE.md,
// "Structured output"). One compiler per served model: the vocabulary is handed to xgrammar
// once (lazily, at the first constraint), and compiled grammars are cached by (kind, spec), so
// the request that repeats a schema pays nothing.
//
// Bad specs (an invalid JSON schema, regex or grammar, an unsupported keyword, a spec over
// kMaxConstraintSpecBytes or JSON nested deeper than kMaxConstraintNesting) throw attnres::Error
// "<constraint.field>: ..." on the caller's thread: the server compiles on its front-end thread
// before the request is accepted, so the engine thread never compiles and a bad spec is a 400
// naming the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/sample/output_constraint.h"

namespace attnres {

// The model's vocabulary as the constraint compiler needs it.
struct ConstraintVocabulary {
  enum class Spelling { Raw, ByteFallback, ByteLevel };  // how token strings spell bytes
  // Token strings by id as tokenizer.json writes them (id_to_token); "" for a special token,
  // which a grammar never produces. May be shorter than `rows`.
  std::vector<std::string> tokens;
  Spelling spelling = Spelling::Raw;
  bool prepends_space = false;  // a Metaspace tokenizer's leading space (SentencePiece)
  // The model's logits per position: ids [tokens.size(), rows) are padding rows, never allowed.
  int rows = 0;
  // The ids that end generation (the model's EOS ids): allowed only where the grammar can end.
  std::vector<int32_t> stop_ids;
};

// Bounds on what one request may ask the compiler for. A spec's size bounds its compile time
// (docs/BENCHMARKS.md, "Structured output": a 60 KB schema compiles in well under a second on
// the demo vocabulary); xgrammar cannot interrupt a compile in progress, so the bound is on
// the input. Compiles run on front-end threads, never the engine thread.
inline constexpr size_t kMaxConstraintSpecBytes = 64 * 1024;
// JSON schemas and structural tags: how deep their JSON may nest (a 100-deep schema compiles in
// ~0.3 s, a 200-deep one in ~2 s, a 2000-deep one not in minutes).
inline constexpr int kMaxConstraintNesting = 64;
inline constexpr size_t kMaxChoices = 1024;  // strings in a Choice constraint
inline constexpr size_t kConstraintCacheEntries = 256;

// A grammar compiled for one vocabulary (opaque: xgrammar stays inside the .cpp files).
class CompiledConstraint;

class ConstraintCompiler {
 public:
  explicit ConstraintCompiler(ConstraintVocabulary vocabulary);
  ~ConstraintCompiler();
  ConstraintCompiler(const ConstraintCompiler&) = delete;
  ConstraintCompiler& operator=(const ConstraintCompiler&) = delete;

  // Thread-safe. Throws attnres::Error "<constraint.field>: ..." for a spec that does not
  // compile or is over the limits.
  std::shared_ptr<const CompiledConstraint> compile(const OutputConstraint& constraint) const;

  int rows() const { return rows_; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

 private:
  struct Xgrammar;  // the xgrammar tokenizer info and compiler, built at the first compile
  Xgrammar& xgrammar() const;
  std::shared_ptr<const CompiledConstraint> compile_uncached(
      const OutputConstraint& constraint) const;

  const int rows_;
  const std::vector<int32_t> stop_ids_;
  mutable ConstraintVocabulary vocabulary_;  // moved into xgrammar at the first compile
  mutable std::once_flag xgrammar_once_;
  mutable std::unique_ptr<Xgrammar> xgrammar_;
  // LRU cache keyed by kind and spec.
  mutable std::mutex cache_mutex_;
  mutable std::list<std::string> cache_order_;  // most recently used first
  struct CacheEntry {
    std::shared_ptr<const CompiledConstraint> compiled;
    std::list<std::string>::iterator order;
  };
  mutable std::unordered_map<std::string, CacheEntry> cache_;
};

}  // namespace attnres
