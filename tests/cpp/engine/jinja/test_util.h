// Helpers shared by the chat template unit tests.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/core/error.h"
#include "engine/tokenizer/chat_template.h"

namespace attnres::testing {

inline std::string render(const std::string& source, const nlohmann::ordered_json& context =
                                                         nlohmann::ordered_json::object()) {
  return ChatTemplate::parse(source).render_ordered(context);
}

// The attnres::Error message of rendering (or parsing) `source`; fails the test if none.
inline std::string render_error(const std::string& source, const nlohmann::ordered_json& context =
                                                               nlohmann::ordered_json::object()) {
  try {
    render(source, context);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error from: " << source;
  return "";
}

}  // namespace attnres::testing
