// The ApiError a piece of request parsing throws, for the HTTP front end's unit tests.
#pragma once

#include <gtest/gtest.h>

#include "server/http/api_error.h"

namespace attnres::server::http {

// Runs `fn`, expecting an ApiError; returns it (a test failure, and an empty error, when `fn`
// throws none).
template <typename Fn>
ApiError expect_api_error(Fn fn) {
  try {
    fn();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError thrown";
  return ApiError(0, "");
}

}  // namespace attnres::server::http
