// WeightStore: one model.safetensors or an index plus shards, and the errors for a missing
// shard, an index that lies about a shard's contents, and a directory without weights.
#include "engine/model/weight_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/cpp/engine/model/checkpoint_writer.h"

namespace attnres {
namespace {

using test_files::error_of;
using test_files::json;
using test_files::SafetensorsWriter;
using test_files::TempDir;
using test_files::write_bytes;
using test_files::write_json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string store_error(const TempDir& dir) {
  return error_of([&] { WeightStore::open(dir.path()); });
}

TEST(WeightStore, OpensSingleFile) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("b", "F32", {2}, {3, 4});
  w.add("a", "F32", {1}, {9});
  w.write(dir.file("model.safetensors"));
  WeightStore store = WeightStore::open(dir.path());
  EXPECT_THAT(store.names(), ElementsAre("a", "b"));
  EXPECT_TRUE(store.has("a"));
  EXPECT_FALSE(store.has("c"));
  EXPECT_EQ(store.file_of("b"), dir.file("model.safetensors"));
  EXPECT_EQ(store.get("b").ptr<float>()[1], 4.f);
  EXPECT_THAT(error_of([&] { store.get("c"); }),
              AllOf(HasSubstr("model.safetensors"), HasSubstr("tensor c is missing")));
}

// Two shards: "x" and "y" in shard 1, "z" in shard 2.
void write_two_shards(const TempDir& dir) {
  SafetensorsWriter one, two;
  one.add("x", "BF16", {2}, {1.5f, -2.f});
  one.add("y", "BF16", {1}, {0.5f});
  two.add("z", "BF16", {3}, {4.f, 5.f, 6.f});
  one.write(dir.file("model-00001-of-00002.safetensors"));
  two.write(dir.file("model-00002-of-00002.safetensors"));
}

json two_shard_index() {
  return {{"metadata", {{"total_size", 12}}},
          {"weight_map",
           {{"x", "model-00001-of-00002.safetensors"},
            {"y", "model-00001-of-00002.safetensors"},
            {"z", "model-00002-of-00002.safetensors"}}}};
}

TEST(WeightStore, OpensShardedCheckpointThroughTheIndex) {
  TempDir dir;
  write_two_shards(dir);
  write_json(dir.file("model.safetensors.index.json"), two_shard_index());
  WeightStore store = WeightStore::open(dir.path());
  EXPECT_THAT(store.names(), ElementsAre("x", "y", "z"));
  EXPECT_EQ(store.file_of("x"), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(store.file_of("z"), dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(bf16_to_f32(store.get("x").ptr<uint16_t>()[0]), 1.5f);
  EXPECT_EQ(bf16_to_f32(store.get("z").ptr<uint16_t>()[2]), 6.f);
  EXPECT_EQ(store.source(), dir.file("model.safetensors.index.json"));
}

TEST(WeightStore, MissingShardNamesTensorAndShard) {
  TempDir dir;
  write_two_shards(dir);
  json index = two_shard_index();
  index["weight_map"]["z"] = "model-00003-of-00002.safetensors";
  write_json(dir.file("model.safetensors.index.json"), index);
  EXPECT_THAT(store_error(dir),
              AllOf(HasSubstr("model.safetensors.index.json: tensor z is in shard "
                              "model-00003-of-00002.safetensors"),
                    HasSubstr("does not exist")));
}

TEST(WeightStore, TensorListedButAbsentFromShardNamesBoth) {
  TempDir dir;
  write_two_shards(dir);
  json index = two_shard_index();
  index["weight_map"]["w"] = "model-00002-of-00002.safetensors";
  write_json(dir.file("model.safetensors.index.json"), index);
  EXPECT_THAT(store_error(dir),
              AllOf(HasSubstr("tensor w is listed in shard model-00002-of-00002.safetensors"),
                    HasSubstr("model-00002-of-00002.safetensors does not contain it")));
}

TEST(WeightStore, RejectsMalformedIndex) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors.index.json"), "{\"weight_map\": ");
  EXPECT_THAT(store_error(dir),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("not valid JSON")));
  write_json(dir.file("model.safetensors.index.json"), {{"weight_map", {{"x", 3}}}});
  EXPECT_THAT(store_error(dir), HasSubstr("weight_map entry for tensor x must be a file name"));
  write_json(dir.file("model.safetensors.index.json"), {{"weight_map", {{"x", "../evil"}}}});
  EXPECT_THAT(store_error(dir), HasSubstr("names shard '../evil'"));
}

TEST(WeightStore, DirectoryWithoutWeights) {
  TempDir dir;
  EXPECT_THAT(store_error(dir), AllOf(HasSubstr(dir.path()), HasSubstr("no weights found")));
  write_bytes(dir.file("pytorch_model.bin"), "x");
  EXPECT_THAT(store_error(dir), HasSubstr("convert to safetensors"));
}

TEST(WeightStore, CorruptShardErrorNamesTheShard) {
  TempDir dir;
  write_two_shards(dir);
  write_bytes(dir.file("model-00002-of-00002.safetensors"), "1234");
  write_json(dir.file("model.safetensors.index.json"), two_shard_index());
  EXPECT_THAT(store_error(dir),
              AllOf(HasSubstr("model-00002-of-00002.safetensors"), HasSubstr("too short")));
}

}  // namespace
}  // namespace attnres
