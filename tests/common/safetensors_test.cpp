// safetensors: what write_safetensors writes, read_safetensors reads back bit for bit (every
// supported dtype we use, scalars and empty tensors, metadata); a hand-written file in the
// published layout reads as the spec says; and every malformed file is a CheckpointError whose
// message names the file (and what is wrong), never a crash or a silently wrong tensor.
#include "starling/common/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "../data/test_util.h"
#include "starling/common/error.h"

namespace starling {
namespace {

namespace fs = std::filesystem;
using data::testing::TempDir;
using data::testing::write_text;

// The 8-byte little-endian header length, the header text, then the data bytes.
std::string file_bytes(const std::string& header, const std::string& data = "",
                       uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header_len >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string float_bytes(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) {
    char b[4];
    std::memcpy(b, &v, 4);  // the test machines are little-endian, as the format is
    out.append(b, 4);
  }
  return out;
}

// read_safetensors(path) must throw CheckpointError naming the file and containing `detail`.
void expect_bad(const fs::path& path, const std::string& detail) {
  try {
    read_safetensors(path);
    ADD_FAILURE() << path << ": expected CheckpointError containing \"" << detail << "\"";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path.string()), std::string::npos) << "does not name the file: " << what;
    EXPECT_NE(what.find(detail), std::string::npos)
        << "does not mention \"" << detail << "\": " << what;
  }
}

TEST(Safetensors, RoundTripsDtypesShapesAndMetadata) {
  TempDir dir;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", at::randn({3, 5}, gen)},
      {"f16", at::randn({4, 2, 3}, gen).to(at::kHalf)},
      {"bf16", at::randn({7}, gen).to(at::kBFloat16)},
      {"i64", at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {2, 3}, gen, at::kLong)},
      {"u8", at::randint(0, 256, {9}, gen, at::kByte)},
      {"scalar", at::scalar_tensor(3.25, at::kFloat)},
      {"empty", at::empty({0, 3}, at::kFloat)},
      {"transposed", at::randn({3, 4}, gen).t()},  // not contiguous: written in logical order
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "a \"b\" c"}};
  const fs::path path = dir / "t.safetensors";
  write_safetensors(path, tensors, metadata);

  const auto bytes = data::testing::read_bytes(path);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i)
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data should start 8-byte aligned";

  const SafetensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.file, path);
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, want] = tensors[i];
    const auto& [got_name, got] = file.tensors[i];
    EXPECT_EQ(got_name, name) << "tensors must come back in data-offset (= write) order";
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(got.is_contiguous()) << name;
    EXPECT_TRUE(at::equal(got, want)) << name;
    EXPECT_TRUE(file.contains(name));
    EXPECT_TRUE(at::equal(file.at(name), want)) << name;
  }
  EXPECT_EQ(file.at("scalar").dim(), 0);
  EXPECT_EQ(file.at("scalar").item<float>(), 3.25f);
  EXPECT_EQ(file.at("empty").numel(), 0);
  EXPECT_FALSE(file.contains("nope"));
  try {
    file.at("nope");
    ADD_FAILURE() << "at() of an absent name should throw";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, NoMetadataAndNoTensors) {
  TempDir dir;
  write_safetensors(dir / "e.safetensors", {});
  const auto file = read_safetensors(dir / "e.safetensors");
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

// A mapped read gives the same tensors as a copied one; writing to a mapped tensor never reaches
// the file; the tensors outlive the SafetensorsFile; bytes not aligned to their element size (a
// foreign file's) are copied instead of mapped.
TEST(Safetensors, MappedReadEqualsACopiedOneAndNeverWritesTheFile) {
  TempDir dir;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  const fs::path path = dir / "m.safetensors";
  write_safetensors(path, {{"w", at::randn({64, 33}, gen)}, {"b", at::randn({5}, gen)}});
  const SafetensorsFile copied = read_safetensors(path);
  at::Tensor w;
  {
    const SafetensorsFile mapped = read_safetensors(path, SafetensorsRead::kMap);
    ASSERT_EQ(mapped.tensors.size(), 2u);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_TRUE(at::equal(mapped.tensors[i].second, copied.tensors[i].second));
    w = mapped.at("w");
  }
  EXPECT_TRUE(at::equal(w, copied.at("w")));  // the mapping outlives the file object
  w.mul_(3);
  EXPECT_TRUE(at::equal(read_safetensors(path).at("w"), copied.at("w")));

  // U8 x3 then F32 at data byte 3: the float cannot be mapped in place.
  const std::string header = R"({"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                             R"("f":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}})";
  std::string padded = header;
  while ((8 + padded.size()) % 8 != 0) padded.push_back(' ');
  write_text(dir / "u.safetensors", file_bytes(padded, "abc" + float_bytes({1.5f, -4.0f})));
  const auto odd = read_safetensors(dir / "u.safetensors", SafetensorsRead::kMap);
  EXPECT_EQ(odd.at("f")[1].item<float>(), -4.0f);
  EXPECT_EQ(odd.at("u")[2].item<uint8_t>(), 'c');
}

// A reader supplies each tensor's values as it is written (a swapping runner lends one at a
// time); one that changes a tensor's shape is a programming error, caught.
TEST(Safetensors, WritesThroughAReader) {
  TempDir dir;
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"a", at::arange(6, at::kFloat).view({2, 3})}, {"b", at::ones({4})}};
  int reads = 0;
  write_safetensors(dir / "r.safetensors", tensors, {}, [&](const at::Tensor& t) {
    ++reads;
    return t * 2;
  });
  EXPECT_EQ(reads, 2);
  const auto file = read_safetensors(dir / "r.safetensors");
  EXPECT_TRUE(at::equal(file.at("a"), tensors[0].second * 2));
  EXPECT_TRUE(at::equal(file.at("b"), tensors[1].second * 2));
  EXPECT_THROW(write_safetensors(dir / "s.safetensors", tensors, {},
                                 [](const at::Tensor& t) { return t.view({-1}); }),
               std::logic_error);
}

// A file written by hand in the published layout (as the Hugging Face library writes it: no
// padding, tensors out of name order) reads back with the values the bytes hold.
TEST(Safetensors, ReadsHandWrittenFile) {
  TempDir dir;
  const std::string header = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                             R"("a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
                             R"("__metadata__":{"format":"pt"}})";
  write_text(dir / "h.safetensors",
             file_bytes(header, float_bytes({1.5f, -2.0f}) + float_bytes({0.25f, 1e6f})));
  const auto file = read_safetensors(dir / "h.safetensors");
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_EQ(file.tensors[0].first, "a");
  EXPECT_EQ(file.tensors[1].first, "b");
  EXPECT_EQ(file.at("a").sizes(), (at::IntArrayRef{1, 2}));
  EXPECT_EQ(file.at("a")[0][1].item<float>(), -2.0f);
  EXPECT_EQ(file.at("b")[1].item<float>(), 1e6f);
  EXPECT_EQ(file.metadata.at("format"), "pt");
}

TEST(SafetensorsErrors, MissingFile) {
  TempDir dir;
  expect_bad(dir / "absent.safetensors", "cannot open");
}

TEST(SafetensorsErrors, ADirectoryOrAFifoIsNotAFile) {
  TempDir dir;
  fs::create_directory(dir / "model.safetensors");
  expect_bad(dir / "model.safetensors", "is a directory");
  // A FIFO would block the read until a writer came: refused before it is opened.
  ASSERT_EQ(::mkfifo((dir / "pipe.safetensors").c_str(), 0600), 0);
  expect_bad(dir / "pipe.safetensors", "not a regular file");
}

TEST(SafetensorsErrors, ShorterThanEightBytes) {
  TempDir dir;
  write_text(dir / "s.safetensors", "abc");
  expect_bad(dir / "s.safetensors", "3 bytes");
  write_text(dir / "z.safetensors", "");
  expect_bad(dir / "z.safetensors", "0 bytes");
}

TEST(SafetensorsErrors, HeaderLengthBeyondFile) {
  TempDir dir;
  write_text(dir / "l.safetensors", file_bytes("{}", "", 1000));
  expect_bad(dir / "l.safetensors", "header length 1000");
  // A huge length must not be trusted for an allocation.
  write_text(dir / "h.safetensors", file_bytes("{}", "", uint64_t{1} << 62));
  expect_bad(dir / "h.safetensors", "header length");
}

TEST(SafetensorsErrors, HeaderNotJson) {
  TempDir dir;
  write_text(dir / "j.safetensors", file_bytes("{\"a\": {not json"));
  expect_bad(dir / "j.safetensors", "JSON");
  write_text(dir / "k.safetensors", file_bytes("[1, 2]"));
  expect_bad(dir / "k.safetensors", "JSON object");
}

TEST(SafetensorsErrors, UnknownDtype) {
  TempDir dir;
  write_text(
      dir / "d.safetensors",
      file_bytes(R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", float_bytes({1, 2})));
  expect_bad(dir / "d.safetensors", "\"w\"");
  expect_bad(dir / "d.safetensors", "F7");
}

TEST(SafetensorsErrors, OffsetsDisagreeWithShape) {
  TempDir dir;
  // 2 floats need 8 bytes; the offsets give 4.
  write_text(
      dir / "o.safetensors",
      file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", float_bytes({1, 2})));
  expect_bad(dir / "o.safetensors", "\"w\"");
  // End before begin.
  write_text(dir / "r.safetensors",
             file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                        float_bytes({1, 2, 3})));
  expect_bad(dir / "r.safetensors", "\"w\"");
  // A negative dimension.
  write_text(dir / "n.safetensors",
             file_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                        float_bytes({1, 2})));
  expect_bad(dir / "n.safetensors", "\"w\"");
  // Offsets missing altogether.
  write_text(dir / "m.safetensors",
             file_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", float_bytes({1, 2})));
  expect_bad(dir / "m.safetensors", "\"w\"");
}

// A shape whose element count overflows 64 bits must not wrap around to match the offsets (it
// reached at::empty and threw c10::Error instead of CheckpointError). Disabled until
// read_safetensors checks the element count for overflow.
TEST(SafetensorsErrors, ShapeOverflow) {
  TempDir dir;
  write_text(dir / "w.safetensors",
             file_bytes(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],)"
                        R"("data_offsets":[0,0]}})"));
  expect_bad(dir / "w.safetensors", "\"w\"");
  write_text(dir / "f.safetensors",
             file_bytes(R"({"w":{"dtype":"F32","shape":[4611686018427387904],)"
                        R"("data_offsets":[0,0]}})"));
  expect_bad(dir / "f.safetensors", "\"w\"");
}

TEST(SafetensorsErrors, TruncatedData) {
  TempDir dir;
  const fs::path path = dir / "t.safetensors";
  write_safetensors(path, {{"a", at::ones({4})}, {"b", at::ones({16})}});
  ASSERT_NO_THROW(read_safetensors(path));
  fs::resize_file(path, fs::file_size(path) - 5);  // cut into "b"
  expect_bad(path, "\"b\"");
  expect_bad(path, "truncated");
}

TEST(SafetensorsErrors, OverlappingTensors) {
  TempDir dir;
  write_text(dir / "v.safetensors",
             file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        float_bytes({1, 2, 3})));
  expect_bad(dir / "v.safetensors", "overlap");
  expect_bad(dir / "v.safetensors", "\"b\"");
}

TEST(SafetensorsErrors, MetadataNotStrings) {
  TempDir dir;
  write_text(dir / "m.safetensors", file_bytes(R"({"__metadata__":{"steps":3}})"));
  expect_bad(dir / "m.safetensors", "steps");
}

}  // namespace
}  // namespace starling
