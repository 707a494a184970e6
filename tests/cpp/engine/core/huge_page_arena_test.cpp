// HugePageArena: tensors that behave as Tensor::empty's (zeroed, aligned, apart, alive as long
// as a view is), carved from 2 MB-aligned chunks the kernel was asked to back with huge pages.
#include "engine/core/huge_page_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/cpp/engine/core/vm_flags.h"

namespace attnres {
namespace {

using test_memory::advised_huge;
using test_memory::thp_available;
using test_memory::vm_flags_at;

TEST(HugePageArena, TensorsAreZeroedAlignedAndApart) {
  HugePageArena arena;
  std::vector<Tensor> tensors;
  for (int64_t n : {1, 3, 17, 1000, 4096, 100000}) tensors.push_back(arena.empty({n}, DType::BF16));
  tensors.push_back(arena.empty({0, 8}, DType::F32));
  for (const Tensor& t : tensors) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u);
    EXPECT_EQ(t.device, Device::CPU);
    const auto* bytes = static_cast<const unsigned char*>(t.data);
    for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(bytes[i], 0) << shape_str(t.shape);
  }
  // Each tensor owns its bytes: filling one leaves its neighbours zero.
  for (size_t k = 0; k < tensors.size(); ++k)
    std::memset(tensors[k].data, int(k + 1), tensors[k].nbytes());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto* bytes = static_cast<const unsigned char*>(tensors[k].data);
    for (size_t i = 0; i < tensors[k].nbytes(); ++i) ASSERT_EQ(bytes[i], k + 1) << k;
  }
}

TEST(HugePageArena, ChunksAreHugePageAlignedAndAdvised) {
  HugePageArena arena;
  const Tensor first = arena.empty({16}, DType::F32);
  // Larger than a chunk: a chunk of its own, also 2 MB aligned.
  const Tensor big = arena.empty({static_cast<int64_t>(HugePageArena::kMinChunk) + 5}, DType::BF16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first.data) % HugePageArena::kHugePage, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data) % HugePageArena::kHugePage, 0u);
  if (!thp_available()) GTEST_SKIP() << "this kernel has no transparent huge pages";
  EXPECT_TRUE(arena.advised());
  for (const Tensor* t : {&first, &big}) EXPECT_TRUE(advised_huge(t->data)) << vm_flags_at(t->data);
}

TEST(HugePageArena, TensorsOutliveTheArena) {
  Tensor kept;
  {
    HugePageArena arena;
    kept = arena.empty({4, 1024}, DType::F32);
    for (int64_t i = 0; i < kept.numel(); ++i) kept.ptr<float>()[i] = static_cast<float>(i);
  }
  const Tensor view = kept.row(3);
  kept = Tensor();
  for (int64_t i = 0; i < 1024; ++i)
    ASSERT_EQ(view.ptr<float>()[i], static_cast<float>(3 * 1024 + i));
}

}  // namespace
}  // namespace attnres
