// A .safetensors file of arbitrary bytes (written to an in-memory file and opened by path,
// as the loader does): the header checks must refuse every malformed file with an
// attnres::Error, and every tensor a valid header lists must be readable within the mapping.
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "engine/core/error.h"
#include "engine/model/safetensors.h"
#include "fuzz_support.h"

using namespace attnres;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  try {
    auto file = SafetensorsFile::open("/proc/self/fd/" + std::to_string(fd));
    for (const auto& [name, entry] : file->entries()) {
      if (!entry.supported) continue;
      const Tensor t = file->get(name);
      // Touch the first and last byte: a view outside the mapping is a sanitizer report.
      if (t.nbytes() > 0) {
        volatile uint8_t sink = static_cast<const uint8_t*>(t.data)[0];
        sink = static_cast<const uint8_t*>(t.data)[t.nbytes() - 1];
        (void)sink;
      }
    }
  } catch (const Error&) {
  }
  close(fd);
  return 0;
}
