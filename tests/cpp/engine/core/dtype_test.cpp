// The user-facing storage dtype names (--kv-cache-dtype, --depth-bank-dtype).
#include "engine/core/dtype.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace attnres::test {
namespace {

TEST(StorageDtypeName, NamesRoundTrip) {
  EXPECT_EQ(storage_dtype_from_name("bfloat16", "--kv-cache-dtype"), DType::BF16);
  EXPECT_EQ(storage_dtype_from_name("float32", "--kv-cache-dtype"), DType::F32);
  EXPECT_EQ(storage_dtype_name(DType::BF16), "bfloat16");
  EXPECT_EQ(storage_dtype_name(DType::F32), "float32");
  EXPECT_EQ(storage_dtype_name(DType::F16), "F16");  // not a storage choice: its dtype name
}

TEST(StorageDtypeName, AnUnresolvedOrUnknownNameIsRefusedNamingTheFlag) {
  for (const char* name : {"auto", "float16", "BF16", ""}) {
    try {
      storage_dtype_from_name(name, "--depth-bank-dtype");
      ADD_FAILURE() << "accepted '" << name << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--depth-bank-dtype '") + name + "': expected bfloat16 or float32");
    }
  }
}

}  // namespace
}  // namespace attnres::test
