// The scheduler's decisions, step by step, with the fake forward. Each test writes the
// expected timeline in its comments and asserts it exactly ("A:2*" = A computes 2 tokens and
// samples its next token; "B:8" = an 8-token prefill chunk that samples nothing).
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine_test_util.h"
#include "scheduler_harness.h"

namespace attnres::testing {
namespace {

using Timeline = std::vector<std::string>;

SchedulerConfig config_with(int max_num_seqs, int max_num_batched_tokens,
                            bool chunked_prefill = true, int max_model_len = 256) {
  SchedulerConfig config;
  config.max_num_seqs = max_num_seqs;
  config.max_num_batched_tokens = max_num_batched_tokens;
  config.max_model_len = max_model_len;
  config.enable_chunked_prefill = chunked_prefill;
  return config;
}

TEST(Scheduler, ChunkedPrefillSplitsALongPromptAcrossSteps) {
  // Budget 8 tokens per step, prompt 20, 3 tokens to generate:
  //   1: A:8    2: A:8    3: A:4* (first token)    4: A:1*    5: A:1* (third token, done)
  SchedulerHarness h(config_with(8, 8), 16, 4);
  h.add("A", iota_prompt(20, 1), 3);
  EXPECT_EQ(h.run(), (Timeline{"A:8", "A:8", "A:4*", "A:1*", "A:1*"}));
  EXPECT_EQ(h.output("A"), reference_tokens(iota_prompt(20, 1), 3));
  EXPECT_EQ(h.scheduler.block_manager().num_free_blocks(), 16);
}

TEST(Scheduler, DecodesGoFirstAndPrefillGetsTheRestOfTheBudget) {
  // Budget 10. A (prompt 2, 5 tokens) arrives before B (prompt 30, 2 tokens):
  //   1: A:2* B:8      A's whole prompt, B's first chunk with what is left
  //   2: A:1* B:9      A's decode is scheduled first; B's chunk shrinks to 9
  //   3: A:1* B:9
  //   4: A:1* B:4*     B's prompt completes (8 + 9 + 9 + 4 = 30): its first token
  //   5: A:1* B:1*     both finish
  SchedulerHarness h(config_with(8, 10), 32, 4);
  h.add("A", iota_prompt(2, 5), 5);
  h.add("B", iota_prompt(30, 9), 2);
  EXPECT_EQ(h.run(), (Timeline{"A:2* B:8", "A:1* B:9", "A:1* B:9", "A:1* B:4*", "A:1* B:1*"}));
  EXPECT_EQ(h.output("A"), reference_tokens(iota_prompt(2, 5), 5));
  EXPECT_EQ(h.output("B"), reference_tokens(iota_prompt(30, 9), 2));
}

TEST(Scheduler, DecodesAreNeverStarvedByALongPrefill) {
  // Budget 4. A, B, C (prompt 2, 4 tokens each) then D (prompt 20, 1 token):
  //   1: A:2* B:2*               the budget is full, C and D wait
  //   2: A:1* B:1* C:2*          decodes first, C admitted with the rest
  //   3: A:1* B:1* C:1* D:1      D gets the single token left
  //   4: A:1* B:1* C:1* D:1      A and B finish
  //   5: C:1* D:3                C finishes
  //   6-8: D:4                   D alone, a full budget per step (5 -> 9 -> 13 -> 17)
  //   9: D:3*                    D's prompt done: its only token
  SchedulerHarness h(config_with(8, 4), 32, 4);
  for (const char* id : {"A", "B", "C"}) h.add(id, iota_prompt(2, id[0]), 4);
  h.add("D", iota_prompt(20, 3), 1);
  EXPECT_EQ(h.run(), (Timeline{"A:2* B:2*", "A:1* B:1* C:2*", "A:1* B:1* C:1* D:1",
                               "A:1* B:1* C:1* D:1", "C:1* D:3", "D:4", "D:4", "D:4", "D:3*"}));
  for (const char* id : {"A", "B", "C"}) {
    EXPECT_EQ(h.output(id), reference_tokens(iota_prompt(2, id[0]), 4)) << id;
  }
}

TEST(Scheduler, DecodesGoBeforeAnOlderSequencesPrefill) {
  // Running is kept in arrival order, so an older sequence that is still prefilling (one that
  // came back after a preemption, say) sits before a younger decode. Budget 10:
  //   1: A:2*           A alone
  //   (X, which arrived before A, is queued now with a 30-token prompt)
  //   2: A:1* X:9
  //   3: A:1* X:9       arrival order alone would give "X:10" and starve A's decode
  SchedulerHarness h(config_with(8, 10), 32, 4);
  h.add("A", iota_prompt(2, 5), 6);
  EXPECT_EQ(h.step(), "A:2*");
  h.add("X", iota_prompt(30, 9), 1, /*arrival_order=*/0);
  EXPECT_EQ(h.step(), "A:1* X:9");
  EXPECT_EQ(h.step(), "A:1* X:9");
  EXPECT_EQ(h.scheduler.running().front()->request_id, "X");  // X is older
  h.run();
  EXPECT_EQ(h.output("A"), reference_tokens(iota_prompt(2, 5), 6));
  EXPECT_EQ(h.output("X"), reference_tokens(iota_prompt(30, 9), 1));
}

TEST(Scheduler, AStepThatPreemptedAdmitsNothing) {
  // 4 blocks of 4, budget 3. A and B: prompt 4, 10 tokens each.
  //   1: A:3          2: A:1* B:2        3: A:1* B:2* (A takes a 2nd block)
  //   4: A:1* B:1*    (B takes a 2nd block: the cache is full)
  //   5-6: A:1* B:1*
  //   7: A needs a 3rd block: B is preempted, A gets one of its 2 blocks. B's recompute
  //      would fit a 2-token chunk in the block left, but admitting it would only be
  //      evicted again: nothing is admitted in a step that preempted.
  //   8: A:1* B:2
  SchedulerHarness h(config_with(8, 3), 4, 4);
  h.add("A", iota_prompt(4, 1), 10);
  h.add("B", iota_prompt(4, 2), 10);
  const Timeline timeline = h.run();
  ASSERT_GE(timeline.size(), 8u);
  EXPECT_EQ(Timeline(timeline.begin(), timeline.begin() + 8),
            (Timeline{"A:3", "A:1* B:2", "A:1* B:2*", "A:1* B:1*", "A:1* B:1*", "A:1* B:1*",
                      "A:1* | preempted B", "A:1* B:2"}));
  EXPECT_EQ(h.output("A"), reference_tokens(iota_prompt(4, 1), 10));
  EXPECT_EQ(h.output("B"), reference_tokens(iota_prompt(4, 2), 10));
}

TEST(Scheduler, MaxNumSeqsBoundsTheRunningSet) {
  // max_num_seqs 2; A, B, C (prompt 3, 2 tokens each):
  //   1: A:3* B:3*    C waits although the budget has room
  //   2: A:1* B:1*    A and B finish
  //   3: C:3*
  //   4: C:1*
  SchedulerHarness h(config_with(2, 64), 32, 4);
  for (const char* id : {"A", "B", "C"}) h.add(id, iota_prompt(3, id[0]), 2);
  EXPECT_EQ(h.run(), (Timeline{"A:3* B:3*", "A:1* B:1*", "C:3*", "C:1*"}));
}

TEST(Scheduler, WithoutChunkingAPromptWaitsForAStepWithRoomForAllOfIt) {
  // Budget 10, chunked prefill off; A and B (prompt 6, 2 tokens each):
  //   1: A:6*         B's 6 tokens do not fit in the 4 left
  //   2: A:1* B:6*    A finishes
  //   3: B:1*
  SchedulerHarness h(config_with(8, 10, /*chunked_prefill=*/false, /*max_model_len=*/10), 32, 4);
  h.add("A", iota_prompt(6, 1), 2);
  h.add("B", iota_prompt(6, 2), 2);
  EXPECT_EQ(h.run(), (Timeline{"A:6*", "A:1* B:6*", "B:1*"}));
}

TEST(Scheduler, ChunkingOffNeedsABudgetForAWholeContext) {
  EXPECT_THROW(Scheduler(config_with(8, 10, false, 11), BlockManager(8, 4)), Error);
}

TEST(Scheduler, PreemptsTheLatestArrivalByRecomputeAndEveryoneStillFinishesCorrectly) {
  // 6 blocks of 4 tokens. A, B, C: prompt 6, 8 tokens each (each needs 4 blocks at the end,
  // 12 together: the cache cannot hold them at once).
  //   1: A:6* B:6* C:6*          2 blocks each: the cache is full
  //   2-3: A:1* B:1* C:1*        tokens 7 and 8 still fit in 2 blocks
  //   4: A needs a 3rd block: C (latest arrival) is preempted, its 2 blocks feed A and B
  //   5-7: A:1* B:1*             C (9 tokens, 3 blocks) cannot come back: 0 free
  //   8: A needs a 4th block: B is preempted; A gets its 8th token and finishes
  //   9: B:13*                   B recomputes prompt + its 7 tokens, samples its 8th, done
  //  10: C:9*                    C recomputes prompt + 3 tokens, samples its 4th
  //  11-14: C:1*                 C's tokens 5..8
  SchedulerHarness h(config_with(8, 64), 6, 4);
  for (const char* id : {"A", "B", "C"}) h.add(id, iota_prompt(6, id[0]), 8);
  EXPECT_EQ(h.run(),
            (Timeline{"A:6* B:6* C:6*", "A:1* B:1* C:1*", "A:1* B:1* C:1*",
                      "A:1* B:1* | preempted C", "A:1* B:1*", "A:1* B:1*", "A:1* B:1*",
                      "A:1* | preempted B", "B:13*", "C:9*", "C:1*", "C:1*", "C:1*", "C:1*"}));
  // Batch invariance at the logic level: the same tokens as each request run alone.
  for (const char* id : {"A", "B", "C"}) {
    EXPECT_EQ(h.output(id), reference_tokens(iota_prompt(6, id[0]), 8)) << id;
    EXPECT_EQ(h.get(id).finish_reason, FinishReason::Length) << id;
  }
  EXPECT_EQ(h.scheduler.num_preemptions(), 2);
  EXPECT_EQ(h.get("B").num_preemptions, 1);
  EXPECT_EQ(h.scheduler.block_manager().num_free_blocks(), 6);
}

TEST(Scheduler, ManyRequestsInATinyCacheAllMatchTheReference) {
  // 10 requests of different lengths through 10 blocks of 4 tokens with a budget of 16:
  // constant chunking and preemption. No timeline; every output must equal the reference.
  SchedulerHarness h(config_with(6, 16), 10, 4);
  for (int i = 0; i < 10; ++i) {
    h.add(numbered("R", i), iota_prompt(3 + (i * 7) % 17, i), 4 + (i * 5) % 13);
  }
  h.run();
  for (int i = 0; i < 10; ++i) {
    const std::string id = numbered("R", i);
    EXPECT_TRUE(h.get(id).finished()) << id;
    EXPECT_EQ(h.output(id), reference_tokens(iota_prompt(3 + (i * 7) % 17, i), 4 + (i * 5) % 13))
        << id;
  }
  EXPECT_GT(h.scheduler.num_preemptions(), 0);
  EXPECT_EQ(h.scheduler.block_manager().num_free_blocks(), 10);
}

TEST(Scheduler, AbortFreesBlocksImmediately) {
  //   1: A:6* B:6* C:6*    2 blocks each, 2 of 8 left; D (prompt 12, 3 blocks) must wait
  //   abort B: its 2 blocks are free before the next schedule(); abort D from waiting
  SchedulerHarness h(config_with(8, 64), 8, 4);
  for (const char* id : {"A", "B", "C"}) h.add(id, iota_prompt(6, id[0]), 8);
  h.add("D", iota_prompt(12, 4), 8);
  EXPECT_EQ(h.step(), "A:6* B:6* C:6*");
  EXPECT_EQ(h.scheduler.num_waiting(), 1);
  EXPECT_EQ(h.scheduler.block_manager().num_free_blocks(), 2);

  std::vector<Sequence*> aborted = h.scheduler.abort("B");
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_EQ(aborted[0]->finish_reason, FinishReason::Abort);
  EXPECT_EQ(h.scheduler.block_manager().num_free_blocks(), 4);
  EXPECT_TRUE(h.scheduler.abort("B").empty());        // already finished
  EXPECT_TRUE(h.scheduler.abort("unknown").empty());  // never existed
  EXPECT_EQ(h.scheduler.abort("D").size(), 1u);       // waiting: just dequeued
  EXPECT_EQ(h.scheduler.num_waiting(), 0);

  EXPECT_EQ(h.step(), "A:1* C:1*");
  EXPECT_EQ(h.scheduler.abort_all().size(), 2u);
  EXPECT_EQ(h.scheduler.block_manager().num_free_blocks(), 8);
  EXPECT_FALSE(h.scheduler.has_unfinished());
  EXPECT_EQ(h.step(), "");
}

TEST(Scheduler, ASequenceThatCanNeverFitFailsAndOthersProceed) {
  // 4 blocks of 4 = 16 tokens; X's prompt is 20. Budget 8:
  //   1: X:8          2: X:8 (16 tokens, the whole cache)
  //   3: X fails (needs a 5th block that does not exist); Y is admitted: Y:3*
  SchedulerHarness h(config_with(8, 8), 4, 4);
  h.add("X", iota_prompt(20, 1), 2);
  h.add("Y", iota_prompt(3, 2), 1);
  EXPECT_EQ(h.run(), (Timeline{"X:8", "X:8", "Y:3* | failed X"}));
  EXPECT_EQ(h.get("X").finish_reason, FinishReason::Abort);
  EXPECT_NE(h.get("X").error.find("needs 5 KV blocks but the cache has 4"), std::string::npos)
      << h.get("X").error;
  EXPECT_EQ(h.output("Y"), reference_tokens(iota_prompt(3, 2), 1));
  EXPECT_EQ(h.scheduler.block_manager().num_free_blocks(), 4);
}

TEST(Scheduler, AWaitingSequenceIsNotOvertakenWhenItDoesNotFit) {
  // 5 blocks of 4. A (prompt 12: 3 blocks) runs; B (prompt 12) does not fit the 2 left and
  // C (prompt 2: 1 block) would, but FCFS keeps C behind B:
  //   1: A:12*    2: A:1* (A done, 3 blocks back)    3: B:12* C:2*    4: B:1* C:1*
  SchedulerHarness h(config_with(8, 64), 5, 4);
  h.add("A", iota_prompt(12, 1), 2);
  h.add("B", iota_prompt(12, 2), 2);
  h.add("C", iota_prompt(2, 3), 2);
  EXPECT_EQ(h.run(), (Timeline{"A:12*", "A:1*", "B:12* C:2*", "B:1* C:1*"}));
}

}  // namespace
}  // namespace attnres::testing
