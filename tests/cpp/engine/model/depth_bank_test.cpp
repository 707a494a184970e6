// DepthBank's bookkeeping (engine/model/depth_bank.h) step by step on the CPU backend, against
// values worked out by hand: the embedding as entry 0, a push after the add (2a), 2b's push and
// reset, the delta modes' output as the entry, delta_block's open entry, the partial aliased in
// the bank and taken back before it changes, a bf16 bank's rounded entries beside an f32
// partial, a sequence-parallel step whose output arrives in scratch, and a bf16 bank's entry
// written by the linear before a push_and_reset. Every value is small enough to be exact in
// f32 (or compared with the old path's bits), so the expectations are equalities.
#include "engine/model/depth_bank.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres {
namespace {

constexpr int64_t kRows = 2;
constexpr int64_t kWidth = 3;

// A plan with one Phase-1 group of one slot and room for `capacity` entries: what begin()
// reads to size the bank. The steps themselves are written out in each test.
DepthPlan plan_with_capacity(int capacity) {
  DepthPlan plan;
  plan.mode = AttnResMode::Full;
  plan.bank_capacity = capacity;
  DepthGroup group;
  group.num_bank_sources = 1;
  group.steps = {0};
  group.num_slots = 1;
  plan.groups = {group};
  return plan;
}

Tensor host_tensor(const std::vector<float>& values) {
  Tensor t = Tensor::empty({kRows, kWidth}, DType::F32);
  std::memcpy(t.data, values.data(), values.size() * sizeof(float));
  return t;
}

void write(const Tensor& t, const std::vector<float>& values) {
  ASSERT_EQ(t.dtype, DType::F32);
  ASSERT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::memcpy(t.data, values.data(), values.size() * sizeof(float));
}

// A [rows, width] tensor's values as floats (a bf16 entry widened exactly).
std::vector<float> values_of(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.dtype == DType::BF16 ? bf16_to_f32(t.ptr<uint16_t>()[i]) : t.ptr<float>()[i];
  }
  return out;
}

std::vector<float> entry(const DepthBank& bank, int i) {
  return values_of(bank.entries(i, i + 1).reshape({kRows, kWidth}));
}

const std::vector<float> kEmbedding = {1, 2, 3, 4, 5, 6};
const std::vector<float> kOut = {10, 20, 30, 40, 50, 60};
const std::vector<float> kOut2 = {100, 200, 300, 400, 500, 600};
const std::vector<float> kZeros(6, 0.0f);

std::vector<float> sum(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

class DepthBankTest : public ::testing::Test {
 protected:
  CpuBackend backend_{1};
  Tensor scratch_ = Tensor::empty({kRows, kWidth}, DType::F32);

  // One sublayer step the way the Transformer runs it: the bank picks the output's slot, the
  // "sublayer" writes `output` there (the partial plus `output` where it fuses the residual
  // add, as Backend::linear_residual would), then the bank takes it in.
  // Where the bank hands out an entry too, the sum goes there as well, rounded as
  // Backend::linear_residual_push (copy) rounds it.
  DepthBank::OutputSlot run_step(DepthBank& bank, const DepthStep& step,
                                 const std::vector<float>& output, bool can_fuse = false,
                                 const DepthStep* next = nullptr) {
    DepthBank::OutputSlot slot = bank.output_slot(step, next, can_fuse, scratch_);
    if (slot.residual != nullptr) {
      write(slot.out, sum(values_of(*slot.residual), output));
    } else {
      write(slot.out, output);
    }
    if (slot.entry.defined()) backend_.copy(slot.out, slot.entry);
    bank.add_output(step, slot.out);
    return slot;
  }
};

TEST_F(DepthBankTest, BeginPushesTheEmbeddingAsEntryZero) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(plan_with_capacity(3), host_tensor(kEmbedding), /*sharded=*/false);
  EXPECT_EQ(entry(bank, 0), kEmbedding);
  EXPECT_EQ(values_of(bank.partial()), kEmbedding);
  // f32 bank of 3 entries, plus the Phase-1 state; only entry 0 is filled.
  EXPECT_EQ(bank.bytes(), size_t{3 * kRows * kWidth * sizeof(float)});
  EXPECT_THROW(bank.entries(0, 2), std::exception);
  EXPECT_EQ(bank.phase1().o.dim(0), 1);
  EXPECT_EQ(bank.phase1().m.dim(1), kRows);
}

TEST_F(DepthBankTest, PlainModelHasNoBank) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(DepthPlan{}, host_tensor(kEmbedding), false);
  EXPECT_EQ(bank.bytes(), 0u);
  DepthStep step;  // plain pre-norm: the output is added to the partial, nothing pushed
  run_step(bank, step, kOut);
  EXPECT_EQ(values_of(bank.partial()), sum(kEmbedding, kOut));
}

// 2a (full): bank += [partial + output]. The sum is written into the next entry and the
// partial is that entry (no copy) until a step changes the partial without pushing, which
// takes it back into its own buffer first: the entry keeps its value.
TEST_F(DepthBankTest, PushAfterAddAliasesThePartialUntilItChanges) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(plan_with_capacity(3), host_tensor(kEmbedding), false);
  DepthStep push;
  push.push_after = true;
  DepthBank::OutputSlot slot = run_step(bank, push, kOut);
  EXPECT_EQ(slot.out.data, bank.entries(1, 2).data);  // the sum went straight into entry 1
  EXPECT_EQ(entry(bank, 1), sum(kEmbedding, kOut));
  EXPECT_EQ(bank.partial().data, bank.entries(1, 2).data);  // the partial is entry 1
  EXPECT_EQ(values_of(bank.partial()), sum(kEmbedding, kOut));

  DepthStep no_push;
  slot = run_step(bank, no_push, kOut2);
  EXPECT_EQ(slot.out.data, scratch_.data);
  EXPECT_NE(bank.partial().data, bank.entries(1, 2).data);
  EXPECT_EQ(values_of(bank.partial()), sum(sum(kEmbedding, kOut), kOut2));
  EXPECT_EQ(entry(bank, 1), sum(kEmbedding, kOut));  // unchanged by the add
  EXPECT_EQ(entry(bank, 0), kEmbedding);
}

// A fused residual add writes the new partial in place: with the partial aliased in the bank
// it is taken back first, so the fused op does not overwrite the entry.
TEST_F(DepthBankTest, FusedResidualAddNeverWritesIntoAnEntry) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(plan_with_capacity(3), host_tensor(kEmbedding), false);
  DepthStep push;
  push.push_after = true;
  run_step(bank, push, kOut);
  DepthStep fused;
  DepthBank::OutputSlot slot = run_step(bank, fused, kOut2, /*can_fuse=*/true);
  ASSERT_NE(slot.residual, nullptr);
  EXPECT_EQ(slot.out.data, bank.partial().data);
  EXPECT_NE(slot.out.data, bank.entries(1, 2).data);
  EXPECT_EQ(values_of(bank.partial()), sum(sum(kEmbedding, kOut), kOut2));
  EXPECT_EQ(entry(bank, 1), sum(kEmbedding, kOut));
}

// A step that is itself a bank entry is not fused: the output goes into the bank.
TEST_F(DepthBankTest, DeltaOutputIsTheEntryEvenWhereTheBackendFuses) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(plan_with_capacity(3), host_tensor(kEmbedding), false);
  DepthStep delta;
  delta.push_output_after = true;
  DepthBank::OutputSlot slot = run_step(bank, delta, kOut, /*can_fuse=*/true);
  EXPECT_EQ(slot.residual, nullptr);
  EXPECT_EQ(slot.out.data, bank.entries(1, 2).data);
  EXPECT_EQ(entry(bank, 1), kOut);  // the output, not the sum
  EXPECT_EQ(values_of(bank.partial()), sum(kEmbedding, kOut));
}

// 2b: at a block boundary, bank += [partial] and the partial restarts from zero.
TEST_F(DepthBankTest, PushAndResetStartsTheNextBlockSumAtZero) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(plan_with_capacity(3), host_tensor(kEmbedding), false);
  run_step(bank, DepthStep{}, kOut);
  bank.push_and_reset();
  EXPECT_EQ(entry(bank, 1), sum(kEmbedding, kOut));
  EXPECT_EQ(values_of(bank.partial()), kZeros);
  run_step(bank, DepthStep{}, kOut2);
  EXPECT_EQ(values_of(bank.partial()), kOut2);
  EXPECT_EQ(entry(bank, 1), sum(kEmbedding, kOut));
}

// delta_block: the block's outputs are summed into the open entry, which becomes the next
// entry when committed; the partial takes every output as usual. In an f32 bank the open
// entry is the next entry itself.
TEST_F(DepthBankTest, OpenEntrySumsTheBlockUntilCommitted) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(plan_with_capacity(3), host_tensor(kEmbedding), false);
  DepthStep first;
  first.accumulate_output = true;
  run_step(bank, first, kOut);
  EXPECT_THROW(bank.entries(1, 2), std::exception);  // open, not pushed
  EXPECT_EQ(values_of(bank.entries_from(1, 1).rows(0, 1).reshape({kRows, kWidth})), kOut);
  DepthStep last = first;
  last.commit_open_entry = true;
  run_step(bank, last, kOut2);
  EXPECT_EQ(entry(bank, 1), sum(kOut, kOut2));
  EXPECT_EQ(values_of(bank.partial()), sum(sum(kEmbedding, kOut), kOut2));

  // The next block's open entry starts over (entry 2), not from the committed sum.
  run_step(bank, last, kOut);
  EXPECT_EQ(entry(bank, 2), kOut);
  EXPECT_EQ(entry(bank, 1), sum(kOut, kOut2));
}

// A bf16 bank rounds each entry as it is pushed (1 + 2^-9 is 1 in bf16); the partial and
// the open entry stay f32 and keep the exact sums.
TEST_F(DepthBankTest, Bf16BankRoundsEntriesAndKeepsAnF32Partial) {
  const float tiny = 1.0f / 512;
  const std::vector<float> ones(6, 1.0f), tinies(6, tiny), rounded_up(6, 1.0f + tiny);
  DepthBank bank(backend_, DType::BF16);
  bank.begin(plan_with_capacity(4), host_tensor(ones), false);
  EXPECT_EQ(bank.bytes(), size_t{4 * kRows * kWidth * 2});
  DepthStep push;
  push.push_after = true;
  DepthBank::OutputSlot slot = run_step(bank, push, tinies);
  EXPECT_EQ(slot.out.data, scratch_.data);  // never written into a bf16 entry directly
  EXPECT_EQ(entry(bank, 1), ones);
  EXPECT_EQ(values_of(bank.partial()), rounded_up);

  DepthStep open;
  open.accumulate_output = true;
  run_step(bank, open, ones);
  DepthStep commit = open;
  commit.commit_open_entry = true;
  run_step(bank, commit, tinies);
  EXPECT_EQ(entry(bank, 2), ones);  // 1 + 2^-9 summed in f32, rounded once when committed
  EXPECT_EQ(values_of(bank.partial()), sum(sum(rounded_up, ones), tinies));
}

// A sequence-parallel step's output arrives in scratch (reduce-scattered, so the Transformer
// never fuses its residual add): nothing is written into the bank in place, and the add and
// the push are one op (Backend::add_inplace_push), pushing the sum (2a) or the output (delta).
TEST_F(DepthBankTest, ShardedStepPushesFromScratch) {
  DepthBank bank(backend_, DType::F32);
  bank.begin(plan_with_capacity(4), host_tensor(kEmbedding), /*sharded=*/true);
  DepthStep push;
  push.push_after = true;
  DepthBank::OutputSlot slot = run_step(bank, push, kOut);
  EXPECT_EQ(slot.out.data, scratch_.data);
  EXPECT_EQ(slot.residual, nullptr);
  EXPECT_EQ(entry(bank, 1), sum(kEmbedding, kOut));
  EXPECT_NE(bank.partial().data, bank.entries(1, 2).data);  // the partial keeps its buffer
  EXPECT_EQ(values_of(bank.partial()), sum(kEmbedding, kOut));

  DepthStep delta;
  delta.push_output_after = true;
  slot = run_step(bank, delta, kOut2);
  EXPECT_EQ(slot.out.data, scratch_.data);
  EXPECT_EQ(entry(bank, 2), kOut2);  // the output, copied from scratch
  EXPECT_EQ(values_of(bank.partial()), sum(sum(kEmbedding, kOut), kOut2));
}

// 2b in a bf16 bank: where the next step's push_and_reset pushes the partial this step's fused
// add writes, the bank hands that entry to this step's linear (Backend::linear_residual_push)
// and the push only counts it. The entries, the partial and the bank's size are those of the
// copy at the push, bit for bit (values that bf16 rounds: not exact).
TEST_F(DepthBankTest, Bf16BlockBoundaryTakesTheEntryFromTheLastLinear) {
  const std::vector<float> embedding = {1.0f / 3, 2.5e-3f, -7.1f, 1e5f + 3, 0.1f, -0.2f};
  const std::vector<float> out = {0.7f, -1.0f / 7, 3.3e-4f, 12.34f, -5.5f, 1.0f / 9};
  const std::vector<float> out2 = {2.0f / 3, 1e-3f, 4.4f, -1.1f, 0.3f, 9.9f};
  DepthStep fused;  // a block's last sublayer: its add fused, nothing pushed
  DepthStep reset;  // the next block's first sublayer
  reset.push_and_reset_after_mix = true;

  // The old path: no next step given, the push copies (rounds) the partial.
  DepthBank old_bank(backend_, DType::BF16);
  old_bank.begin(plan_with_capacity(3), host_tensor(embedding), false);
  DepthBank::OutputSlot slot = run_step(old_bank, fused, out, /*can_fuse=*/true);
  EXPECT_FALSE(slot.entry.defined());
  old_bank.push_and_reset();
  run_step(old_bank, reset, out2, /*can_fuse=*/true);

  DepthBank bank(backend_, DType::BF16);
  bank.begin(plan_with_capacity(3), host_tensor(embedding), false);
  slot = run_step(bank, fused, out, /*can_fuse=*/true, &reset);
  ASSERT_TRUE(slot.entry.defined());
  EXPECT_EQ(slot.entry.data, bank.entries_from(1, 1).data);  // entry 1, not pushed yet
  EXPECT_EQ(slot.entry.dtype, DType::BF16);
  EXPECT_EQ(slot.entry.shape, (Shape{kRows, kWidth}));
  EXPECT_THROW(bank.entries(1, 2), std::exception);
  bank.push_and_reset();
  EXPECT_EQ(values_of(bank.partial()), kZeros);
  run_step(bank, reset, out2, /*can_fuse=*/true);

  for (int i = 0; i < 2; ++i) {
    const Tensor a = bank.entries(i, i + 1), b = old_bank.entries(i, i + 1);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << "entry " << i;
  }
  EXPECT_NE(entry(bank, 1), sum(embedding, out));  // rounded: the comparison is not vacuous
  EXPECT_EQ(values_of(bank.partial()), values_of(old_bank.partial()));
  EXPECT_EQ(values_of(bank.partial()), out2);
  EXPECT_THROW(bank.entries(2, 3), std::exception);  // the size counted once
}

// Nowhere else: an f32 bank (the copy stays), a sharded step (no fused add), a next step
// that does not push, a step that pushes itself, an add that is not fused. And the entry
// handed out must be pushed by the next step before another slot is chosen.
TEST_F(DepthBankTest, EntryHandedOutOnlyBeforeABf16PushAndReset) {
  DepthStep fused, reset, no_reset, push;
  reset.push_and_reset_after_mix = true;
  push.push_after = true;
  const auto entry_of = [&](DType dtype, bool sharded, const DepthStep& step,
                            const DepthStep* next, bool can_fuse) {
    DepthBank bank(backend_, dtype);
    bank.begin(plan_with_capacity(4), host_tensor(kEmbedding), sharded);
    return bank.output_slot(step, next, can_fuse, scratch_).entry.defined();
  };
  EXPECT_TRUE(entry_of(DType::BF16, false, fused, &reset, true));
  EXPECT_FALSE(entry_of(DType::F32, false, fused, &reset, true));
  EXPECT_FALSE(entry_of(DType::BF16, true, fused, &reset, true));
  EXPECT_FALSE(entry_of(DType::BF16, false, fused, &no_reset, true));
  EXPECT_FALSE(entry_of(DType::BF16, false, fused, nullptr, true));
  EXPECT_FALSE(entry_of(DType::BF16, false, push, &reset, true));
  EXPECT_FALSE(entry_of(DType::BF16, false, fused, &reset, false));

  DepthBank bank(backend_, DType::BF16);
  bank.begin(plan_with_capacity(4), host_tensor(kEmbedding), false);
  run_step(bank, fused, kOut, /*can_fuse=*/true, &reset);
  EXPECT_THROW(bank.output_slot(fused, nullptr, true, scratch_), std::exception);
}

}  // namespace
}  // namespace attnres
