// The user-facing names of the storage dtypes (dtype.h).
#include "engine/core/dtype.h"

#include "engine/core/error.h"

namespace attnres {

std::string storage_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    default:
      return std::string(dtype_name(dtype));
  }
}

DType storage_dtype_from_name(const std::string& name, std::string_view what) {
  if (name == "float32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  throw Error(std::string(what) + " '" + name + "': expected bfloat16 or float32");
}

}  // namespace attnres
