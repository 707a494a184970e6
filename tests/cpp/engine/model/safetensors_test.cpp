// SafetensorsFile: exact read-back per dtype, zero-copy views that outlive the file object,
// and one test per header / data defect, each checking the message names file and tensor.
#include "engine/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "tests/cpp/engine/core/vm_flags.h"
#include "tests/cpp/engine/model/checkpoint_writer.h"

namespace attnres {
namespace {

using test_files::error_of;
using test_files::SafetensorsWriter;
using test_files::TempDir;
using test_files::write_bytes;
using test_files::write_raw_safetensors;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsFile::open(path); });
}

TEST(Safetensors, ReadsF32ValuesExactly) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("a", "F32", {2, 3}, {1.0f, -2.5f, 3.25f, 1e-7f, -0.0f, 65504.f});
  w.metadata("format", "pt");
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  Tensor t = file->get("a");
  EXPECT_EQ(t.dtype, DType::F32);
  EXPECT_EQ(t.shape, (Shape{2, 3}));
  std::vector<float> got(t.ptr<float>(), t.ptr<float>() + 6);
  EXPECT_EQ(got, (std::vector<float>{1.0f, -2.5f, 3.25f, 1e-7f, -0.0f, 65504.f}));
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

TEST(Safetensors, ReadsBF16AndF16BitsExactly) {
  TempDir dir;
  SafetensorsWriter w;
  // Raw bit patterns, so the check does not depend on the conversions under test.
  const uint16_t bf16_bits[] = {0x3FC0 /*1.5*/, 0xC020 /*-2.5*/, 0x0001 /*denormal*/};
  const uint16_t f16_bits[] = {0x3E00 /*1.5*/, 0xC100 /*-2.5*/, 0x7BFF /*65504*/};
  w.add_raw("b", "BF16", {3}, std::string(reinterpret_cast<const char*>(bf16_bits), 6));
  w.add_raw("h", "F16", {3, 1}, std::string(reinterpret_cast<const char*>(f16_bits), 6));
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  Tensor b = file->get("b"), h = file->get("h");
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_EQ(h.dtype, DType::F16);
  EXPECT_EQ(h.shape, (Shape{3, 1}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b.ptr<uint16_t>()[i], bf16_bits[i]);
    EXPECT_EQ(h.ptr<uint16_t>()[i], f16_bits[i]);
  }
  EXPECT_EQ(bf16_to_f32(b.ptr<uint16_t>()[0]), 1.5f);
  EXPECT_EQ(f16_to_f32(h.ptr<uint16_t>()[2]), 65504.f);
}

TEST(Safetensors, ViewsPointIntoTheMappingAndOutliveTheFileObject) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("first", "F32", {4}, {1, 2, 3, 4});
  w.add("second", "F32", {2}, {7, 8});
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  Tensor second = file->get("second");
  const std::byte* begin = file->mapping_begin();
  const std::byte* p = static_cast<const std::byte*>(second.data);
  EXPECT_GE(p, begin);
  EXPECT_LE(p + second.nbytes(), begin + file->mapping_size());
  // 8-byte size + header + 16 bytes of "first".
  size_t padded_header = (w.header().dump().size() + 7) / 8 * 8;
  EXPECT_EQ(p - begin, static_cast<std::ptrdiff_t>(8 + padded_header + 16));
  file.reset();  // the tensor's owner keeps the mapping
  EXPECT_EQ(second.ptr<float>()[0], 7.f);
  EXPECT_EQ(second.ptr<float>()[1], 8.f);
}

// The mapping asks for huge pages (MADV_HUGEPAGE): where the filesystem gives the page cache
// large folios, a CPU decode then streams the weights from 2 MB pages (HugePageArena says why).
TEST(Safetensors, TheMappingAsksForHugePages) {
  if (!test_memory::thp_available()) GTEST_SKIP() << "this kernel has no transparent huge pages";
  TempDir dir;
  SafetensorsWriter w;
  w.add("a", "F32", {4}, {1, 2, 3, 4});
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  const Tensor a = file->get("a");
  EXPECT_TRUE(test_memory::advised_huge(a.data)) << test_memory::vm_flags_at(a.data);
}

TEST(Safetensors, MisalignedTensorsAreCopiedToAlignedMemory) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("odd", "BF16", {1}, {1.f});
  w.add("f32", "F32", {2}, {-1.5f, 2.25f});  // starts 2 bytes into the data region
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  Tensor t = file->get("f32");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u);
  const std::byte* p = static_cast<const std::byte*>(t.data);
  EXPECT_FALSE(p >= file->mapping_begin() && p < file->mapping_begin() + file->mapping_size());
  float got[2];
  std::memcpy(got, t.data, 8);
  EXPECT_EQ(got[0], -1.5f);
  EXPECT_EQ(got[1], 2.25f);
}

TEST(Safetensors, ZeroDimAndEmptyTensors) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("scalar", "BF16", {}, {0.75f});
  w.add("empty", "F32", {0, 4}, {});
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  EXPECT_EQ(file->get("scalar").shape, Shape{});
  EXPECT_EQ(file->read_scalar("scalar"), 0.75f);
  EXPECT_EQ(file->get("empty").numel(), 0);
}

TEST(Safetensors, RejectsFileShorterThanEightBytes) {
  TempDir dir;
  write_bytes(dir.file("short.safetensors"), "abc");
  EXPECT_THAT(open_error(dir.file("short.safetensors")),
              AllOf(HasSubstr("short.safetensors"), HasSubstr("3 bytes, too short")));
}

TEST(Safetensors, RejectsAbsurdHeaderSize) {
  TempDir dir;
  write_bytes(dir.file("x.safetensors"), std::string("\xff\xff\xff\xff\xff\x00\x00\x00", 8) + "{}");
  EXPECT_THAT(open_error(dir.file("x.safetensors")),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("header size 1099511627775 is absurd")));
}

TEST(Safetensors, RejectsHeaderBeyondFileEnd) {
  TempDir dir;
  write_bytes(dir.file("x.safetensors"), std::string("\x00\x01\x00\x00\x00\x00\x00\x00", 8) + "{}");
  EXPECT_THAT(open_error(dir.file("x.safetensors")),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("header size 256 runs past the end"),
                    HasSubstr("10-byte file")));
}

TEST(Safetensors, RejectsHeaderThatIsNotJson) {
  TempDir dir;
  write_raw_safetensors(dir.file("x.safetensors"), "{\"a\": [1,", "");
  EXPECT_THAT(open_error(dir.file("x.safetensors")),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("header is not valid JSON")));
}

// Found by tests/fuzz/safetensors_fuzzer: a number too large for a double is not a parse error
// in nlohmann::json but an out_of_range exception, which escaped as an uncaught exception.
TEST(Safetensors, RejectsHeaderWithANumberThatOverflows) {
  TempDir dir;
  write_raw_safetensors(dir.file("x.safetensors"), "{\"a\": 33.3E597166994737212}", "");
  EXPECT_THAT(open_error(dir.file("x.safetensors")),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("header is not valid JSON"),
                    HasSubstr("number overflow")));
}

TEST(Safetensors, RejectsHeaderThatIsNotAnObject) {
  TempDir dir;
  write_raw_safetensors(dir.file("x.safetensors"), "[1, 2]", "");
  EXPECT_THAT(
      open_error(dir.file("x.safetensors")),
      AllOf(HasSubstr("x.safetensors"), HasSubstr("header must be a JSON object, found array")));
}

// Writes a one-tensor file whose entry for "w" is `entry`, with 16 data bytes.
std::string open_error_for_entry(const TempDir& dir, const std::string& entry) {
  write_raw_safetensors(dir.file("e.safetensors"), "{\"w\": " + entry + "}", std::string(16, '\0'));
  return open_error(dir.file("e.safetensors"));
}

TEST(Safetensors, RejectsEntriesWithMissingFields) {
  TempDir dir;
  EXPECT_THAT(open_error_for_entry(dir, R"({"shape": [4], "data_offsets": [0, 16]})"),
              AllOf(HasSubstr("e.safetensors: tensor w"), HasSubstr("no 'dtype'")));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype": "F32", "data_offsets": [0, 16]})"),
              AllOf(HasSubstr("e.safetensors: tensor w"), HasSubstr("no 'shape'")));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype": "F32", "shape": [4]})"),
              AllOf(HasSubstr("e.safetensors: tensor w"), HasSubstr("no 'data_offsets'")));
  EXPECT_THAT(open_error_for_entry(dir, R"("F32")"),
              AllOf(HasSubstr("tensor w"), HasSubstr("must be an object")));
}

TEST(Safetensors, RejectsEntriesWithWrongTypes) {
  TempDir dir;
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype": 7, "shape": [4], "data_offsets": [0, 16]})"),
              AllOf(HasSubstr("tensor w"), HasSubstr("'dtype' must be a string, found 7")));
  EXPECT_THAT(
      open_error_for_entry(dir, R"({"dtype": "F32", "shape": "4", "data_offsets": [0, 16]})"),
      AllOf(HasSubstr("tensor w"), HasSubstr("'shape' must be a list")));
  EXPECT_THAT(
      open_error_for_entry(dir, R"({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]})"),
      AllOf(HasSubstr("tensor w"), HasSubstr("non-negative integers, found [-4]")));
  EXPECT_THAT(open_error_for_entry(dir, R"({"dtype": "F32", "shape": [4], "data_offsets": [16]})"),
              AllOf(HasSubstr("tensor w"), HasSubstr("'data_offsets' must be [begin, end]")));
  EXPECT_THAT(
      open_error_for_entry(dir, R"({"dtype": "F32", "shape": [4], "data_offsets": [0, 1.5]})"),
      AllOf(HasSubstr("tensor w"), HasSubstr("'data_offsets' must be [begin, end]")));
}

TEST(Safetensors, RejectsUnknownDtype) {
  TempDir dir;
  EXPECT_THAT(
      open_error_for_entry(dir, R"({"dtype": "Q4_K", "shape": [4], "data_offsets": [0, 16]})"),
      AllOf(HasSubstr("e.safetensors: tensor w"), HasSubstr("unknown dtype 'Q4_K'")));
}

TEST(Safetensors, ListsButRefusesRecognisedUnsupportedDtypes) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("d", "F64", {1}, {1.25f});
  w.add_raw("i", "I64", {2}, std::string(16, '\1'));
  w.add_raw("u", "U8", {3}, "abc");
  w.add_raw("f8", "F8_E4M3", {4}, "abcd");
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  EXPECT_EQ(file->entries().size(), 4u);
  for (const char* name : {"d", "i", "u", "f8"}) {
    const auto& entry = file->entries().at(name);
    EXPECT_FALSE(entry.supported);
    EXPECT_THAT(error_of([&] { file->get(name); }),
                AllOf(HasSubstr("x.safetensors"),
                      HasSubstr("unsupported dtype " + entry.dtype_name + " for tensor " + name)));
  }
  EXPECT_EQ(file->read_scalar("d"), 1.25f) << "F64 scalars may be read as floats";
}

TEST(Safetensors, RejectsSizeThatDoesNotMatchShape) {
  TempDir dir;
  EXPECT_THAT(
      open_error_for_entry(dir, R"({"dtype": "BF16", "shape": [4, 3], "data_offsets": [0, 16]})"),
      AllOf(HasSubstr("e.safetensors: tensor w"),
            HasSubstr("shape [4,3] of BF16 needs 24 bytes, but data_offsets [0,16] span 16")));
}

TEST(Safetensors, RejectsOffsetsOutOfOrder) {
  TempDir dir;
  EXPECT_THAT(
      open_error_for_entry(dir, R"({"dtype": "F32", "shape": [0], "data_offsets": [16, 0]})"),
      AllOf(HasSubstr("tensor w"), HasSubstr("out of order")));
}

TEST(Safetensors, RejectsOverlappingTensors) {
  TempDir dir;
  write_raw_safetensors(dir.file("o.safetensors"),
                        R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                        std::string(12, '\0'));
  EXPECT_THAT(open_error(dir.file("o.safetensors")),
              AllOf(HasSubstr("o.safetensors"), HasSubstr("tensors a [0,8) and b [4,12) overlap")));
}

TEST(Safetensors, RejectsTruncatedDataRegion) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("model.embed_tokens.weight", "F32", {4, 4});
  w.data().resize(40);  // 64 bytes needed
  w.write(dir.file("t.safetensors"));
  EXPECT_THAT(open_error(dir.file("t.safetensors")),
              AllOf(HasSubstr("t.safetensors: file truncated: tensor model.embed_tokens.weight "
                              "needs bytes [0,64) but the data region has only 40")));
}

TEST(Safetensors, RejectsMetadataThatIsNotStrings) {
  TempDir dir;
  write_raw_safetensors(dir.file("m.safetensors"), R"({"__metadata__": {"format": 1}})", "");
  EXPECT_THAT(open_error(dir.file("m.safetensors")),
              AllOf(HasSubstr("m.safetensors"), HasSubstr("__metadata__ value for 'format'")));
}

TEST(Safetensors, MissingFileAndMissingTensorNameThePath) {
  TempDir dir;
  EXPECT_THAT(open_error(dir.file("nope.safetensors")),
              AllOf(HasSubstr("nope.safetensors"), HasSubstr("cannot open")));
  SafetensorsWriter w;
  w.add("a", "F32", {1});
  w.write(dir.file("x.safetensors"));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  EXPECT_THAT(error_of([&] { file->get("b"); }),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("no tensor named b")));
}

}  // namespace
}  // namespace attnres
