// server/common/token_ids.h: the one check of client-sent ids both front ends use.
#include "server/common/token_ids.h"

#include <gtest/gtest.h>

#include <vector>

#include "server/common/request_error.h"

namespace attnres::testing {
namespace {

using server::RequestError;

RequestError error_of(const std::vector<int32_t>& ids, const Vocabulary& vocabulary) {
  try {
    server::check_token_ids("tokens", ids, vocabulary);
  } catch (const RequestError& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return RequestError(server::Refusal::Unavailable, "none");
}

TEST(TokenIds, OutsideTheVocabularyIsAnInvalidArgumentNamingTheField) {
  const Vocabulary vocabulary = Vocabulary::all_rows(10);
  server::check_token_ids("tokens", std::vector<int32_t>{0, 9}, vocabulary);
  const RequestError e = error_of({1, 10}, vocabulary);
  EXPECT_EQ(e.refusal(), server::Refusal::InvalidArgument);
  EXPECT_EQ(e.param(), "tokens");
  EXPECT_EQ(std::string(e.what()), "field tokens[1]: got 10, expected a token id in [0, 10)");
  EXPECT_EQ(std::string(error_of({-1}, vocabulary).what()),
            "field tokens[0]: got -1, expected a token id in [0, 10)");
}

TEST(TokenIds, PaddingRowsAreRefusedAndSaySo) {
  const Vocabulary vocabulary = Vocabulary::of(12, 10);  // rows 10 and 11 have no text
  const RequestError e = error_of({3, 11}, vocabulary);
  EXPECT_NE(std::string(e.what()).find("padding row"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace attnres::testing
