// One exception type for every user-facing failure (bad checkpoint, bad request, bad
// template). Messages name the file / tensor / field and say what was expected; callers
// at the edge (CLI, HTTP) turn them into exit codes or 4xx responses.
#pragma once

#include <stdexcept>
#include <string>

namespace attnres {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Internal invariant violated: a bug, not bad input. Carries file and line.
[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace attnres

#define ATTNRES_CHECK(cond, msg)                                                                 \
  do {                                                                                           \
    if (!(cond)) ::attnres::internal_error(__FILE__, __LINE__, std::string(#cond ": ") + (msg)); \
  } while (0)
