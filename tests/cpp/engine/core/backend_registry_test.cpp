// The backend registry's traits (engine/core/backend_registry.h): the defaults filled in for
// what a registration leaves out, in particular what a fractional --kv-cache-memory is a
// fraction of (host RAM unless the backend says otherwise, as CUDA does with its free GPU
// memory).
#include "engine/core/backend_registry.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include "engine/core/error.h"

namespace attnres {
namespace {

std::unique_ptr<Backend> no_backend(const BackendOptions&) {
  throw Error("registry test: not built");
}

TEST(BackendRegistry, KvMemoryDefaultsToTheHostsPhysicalMemory) {
  const size_t physical =
      static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(host_physical_memory_bytes(), physical);
  EXPECT_GT(physical, 0u);
  register_backend("registry-test-host", no_backend, BackendTraits{.display_name = "Host"});
  const BackendTraits traits = backend_traits("registry-test-host");
  ASSERT_TRUE(traits.kv_memory_bytes);
  EXPECT_EQ(traits.kv_memory_bytes(0), physical);
  EXPECT_EQ(traits.kv_memory_bytes(3), physical);  // one host, whatever the rank
  // Unstated capabilities are the defaults: an f32 cache only, no bf16 linear inputs.
  EXPECT_TRUE(traits.capabilities.kv_cache_dtypes.contains(DType::F32));
  EXPECT_FALSE(traits.capabilities.kv_cache_dtypes.contains(DType::BF16));
  EXPECT_FALSE(traits.capabilities.bf16_linear_inputs);
}

TEST(BackendRegistry, ADeviceBackendSaysWhatItsFractionIsOf) {
  BackendTraits given{.display_name = "Device", .kv_memory_bytes = [](int device) {
                        return size_t{1000} * static_cast<size_t>(device + 1);
                      }};
  register_backend("registry-test-device", no_backend, given);
  const BackendTraits traits = backend_traits("registry-test-device");
  EXPECT_EQ(traits.kv_memory_bytes(0), 1000u);
  EXPECT_EQ(traits.kv_memory_bytes(1), 2000u);
  EXPECT_EQ(traits.display_name, "Device");
}

}  // namespace
}  // namespace attnres
