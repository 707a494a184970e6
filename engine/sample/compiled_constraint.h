// CompiledConstraint's definition, shared by the compiler and the matcher only: the one header
// that includes xgrammar, so the rest of the engine never sees it.
#pragma once

#include <xgrammar/xgrammar.h>

#include <cstdint>
#include <vector>

#include "engine/sample/constraint_compiler.h"

namespace attnres {

class CompiledConstraint {
 public:
  CompiledConstraint(xgrammar::CompiledGrammar grammar, int32_t rows, std::vector<int32_t> stop_ids)
      : grammar(std::move(grammar)), rows(rows), stop_ids(std::move(stop_ids)) {}

  xgrammar::CompiledGrammar grammar;
  int32_t rows;                   // logits per position (the mask's length in bits)
  std::vector<int32_t> stop_ids;  // allowed where the grammar can end
};

}  // namespace attnres
