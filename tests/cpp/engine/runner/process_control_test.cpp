// The control messages of a multi-process job (engine/runner/process_control.h): what rank 0
// encodes, every other rank decodes to the same values; a damaged message is an error, never a
// read past its end.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/runner/process_control.h"

namespace attnres {
namespace {

StepBatch sample_step() {
  StepBatch step;
  BatchMeta& b = step.meta;
  b.num_tokens = 5;
  b.token_ids = {11, 12, 13, 14, 15};
  b.positions = {0, 1, 2, 7, 3};
  b.slot_mapping = {32, 33, 34, 71, 19};
  b.query_start = {0, 3, 4, 5};
  b.context_len = {3, 8, 4};
  b.block_tables = {{2}, {1, 4}, {1}};
  step.logit_rows = {2, 3, 4};
  step.depth_rows = {4, 0};
  return step;
}

TEST(ProcessControl, StepRoundTrips) {
  const StepBatch step = sample_step();
  const std::string wire = encode_step(step);
  EXPECT_EQ(control_kind(wire), ControlKind::Step);
  StepBatch got;
  got.logit_rows = {99, 98, 97, 96, 95, 94};  // reused buffers are overwritten, not appended to
  decode_step(wire, got);
  EXPECT_EQ(got.meta.num_tokens, step.meta.num_tokens);
  EXPECT_EQ(got.meta.token_ids, step.meta.token_ids);
  EXPECT_EQ(got.meta.positions, step.meta.positions);
  EXPECT_EQ(got.meta.slot_mapping, step.meta.slot_mapping);
  EXPECT_EQ(got.meta.query_start, step.meta.query_start);
  EXPECT_EQ(got.meta.context_len, step.meta.context_len);
  EXPECT_EQ(got.meta.block_tables, step.meta.block_tables);
  EXPECT_EQ(got.logit_rows, step.logit_rows);
  EXPECT_EQ(got.depth_rows, step.depth_rows);
}

TEST(ProcessControl, LoadRoundTrips) {
  LoadMessage load;
  load.args.model = "/models/attnres-0.6b";
  load.args.device = "cpu";
  load.args.threads = 3;
  load.args.tensor_parallel_size = 4;
  load.args.sequence_parallel_min_tokens = 0;
  load.args.kv_cache_dtype = DType::BF16;
  load.args.depth_bank_dtype = DType::F32;
  load.args.bf16_linear_inputs = true;
  load.args.max_graph_batch = 0;
  load.num_kv_blocks = 12345;
  load.block_size = 32;
  load.model_summary = "qwen3_attnres (attnres block) layers=4 hidden=64";
  const LoadMessage got = decode_load(encode_load(load));
  EXPECT_EQ(got.args.model, load.args.model);
  EXPECT_EQ(got.args.device, load.args.device);
  EXPECT_EQ(got.args.threads, 3);
  EXPECT_EQ(got.args.tensor_parallel_size, 4);
  EXPECT_EQ(got.args.sequence_parallel_min_tokens, 0);
  EXPECT_EQ(got.args.kv_cache_dtype, DType::BF16);
  EXPECT_EQ(got.args.depth_bank_dtype, DType::F32);
  EXPECT_TRUE(got.args.bf16_linear_inputs);
  EXPECT_EQ(got.args.max_graph_batch, 0);
  EXPECT_EQ(got.num_kv_blocks, 12345);
  EXPECT_EQ(got.block_size, 32);
  EXPECT_EQ(got.model_summary, load.model_summary);
}

// The other way round from the test above: defaults in, defaults out (a field that is not
// carried would come back as its default and pass above only by luck).
TEST(ProcessControl, LoadCarriesTheOtherValuesToo) {
  LoadMessage load;
  load.args.kv_cache_dtype = DType::F32;
  load.args.depth_bank_dtype = DType::BF16;
  load.args.bf16_linear_inputs = false;
  load.args.max_graph_batch = 7;
  const LoadMessage got = decode_load(encode_load(load));
  EXPECT_EQ(got.args.kv_cache_dtype, DType::F32);
  EXPECT_EQ(got.args.depth_bank_dtype, DType::BF16);
  EXPECT_FALSE(got.args.bf16_linear_inputs);
  EXPECT_EQ(got.args.max_graph_batch, 7);
}

// The dtypes travel as their names, and a rank takes only float32 and bfloat16: rank 0 sends
// what it resolved, never a setting for the rank to decide.
TEST(ProcessControl, LoadWithAnUnknownDtypeNameIsAnError) {
  LoadMessage load;
  std::string wire = encode_load(load);
  const size_t at = wire.find("float32");
  ASSERT_NE(at, std::string::npos);
  wire.replace(at, 7, "float16");
  try {
    decode_load(wire);
    FAIL() << "decoded an unknown dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv cache"), std::string::npos) << e.what();
  }
}

TEST(ProcessControl, SimpleMessagesCarryOnlyTheirKind) {
  EXPECT_EQ(control_kind(encode_simple(ControlKind::Exit)), ControlKind::Exit);
  EXPECT_EQ(control_kind(encode_simple(ControlKind::Unload)), ControlKind::Unload);
  EXPECT_ANY_THROW(encode_simple(ControlKind::Step));  // a programming error
}

TEST(ProcessControl, EveryTruncationIsAnError) {
  const std::string wire = encode_step(sample_step());
  StepBatch got;
  for (size_t n = 0; n < wire.size(); ++n) {
    EXPECT_THROW(decode_step(wire.substr(0, n), got), Error) << n << " of " << wire.size();
  }
  const std::string load = encode_load(LoadMessage{});
  for (size_t n = 0; n < load.size(); ++n) {
    EXPECT_THROW(decode_load(load.substr(0, n)), Error) << n;
  }
}

TEST(ProcessControl, WrongKindTrailingBytesAndHugeLengthsAreErrors) {
  StepBatch got;
  EXPECT_THROW(decode_step(encode_load(LoadMessage{}), got), Error);
  EXPECT_THROW(decode_load(encode_step(sample_step())), Error);
  EXPECT_THROW(decode_step(encode_step(sample_step()) + "x", got), Error);
  EXPECT_THROW(control_kind(std::string(1, '\x09')), Error);
  // A length field claiming more elements than the message holds.
  std::string wire = encode_step(sample_step());
  const uint64_t huge = uint64_t{1} << 60;
  wire.replace(1 + sizeof(int32_t), sizeof(huge), reinterpret_cast<const char*>(&huge),
               sizeof(huge));
  EXPECT_THROW(decode_step(wire, got), Error);
}

}  // namespace
}  // namespace attnres
