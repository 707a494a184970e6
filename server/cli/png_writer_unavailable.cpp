// The PNG writer of a build without libpng (libpng-dev was not installed when it was
// configured): `attnres inspect --out` says so; --json and the text output still work.
#include "engine/core/error.h"
#include "server/cli/png_writer.h"

namespace attnres::cli {
namespace {

[[noreturn]] void no_libpng() {
  throw Error(
      "this attnres was built without libpng, so it cannot write PNG files: install "
      "libpng-dev (docker/install-deps.sh) and rebuild, or use --json");
}

}  // namespace

std::vector<uint8_t> encode_png_rgb(int, int, const std::vector<uint8_t>&) { no_libpng(); }

void write_png_rgb(const std::string&, int, int, const std::vector<uint8_t>&) { no_libpng(); }

}  // namespace attnres::cli
