// Units of the safetensors reader: the real Mixtral fixture, checkpoint
// layouts (single file, sharded with an index, lone *.safetensors), dtype
// decoding, and one malformed file per validation rule, each checked for a
// one-line message that names the file and the tensor.
#include "moert/Checkpoint.h"
#include "moert/Error.h"

#include "gtest/gtest.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

using namespace moert;
namespace fs = std::filesystem;

namespace {

const std::string kMixtral = MOE_FIXTURES_DIR "/models/mixtral";

/// A fresh directory per test, removed with everything in it afterwards.
class TempDir {
public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "moert-ckpt-XXXXXX").string();
    if (!::mkdtemp(pattern.data()))
      ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string &path() const { return path_; }
  std::string file(const std::string &name) const { return (fs::path(path_) / name).string(); }

private:
  std::string path_;
};

void writeText(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary) << text;
}

/// Writes a safetensors file from header text and data bytes. Like the real
/// writers it pads the header with spaces so that the data starts 8-aligned.
void writeRaw(const std::string &path, std::string header, const std::string &data) {
  while ((8 + header.size()) % 8 != 0)
    header += ' ';
  std::string bytes;
  for (int i = 0; i < 8; ++i)
    bytes += static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  writeText(path, bytes + header + data);
}

template <typename T> std::string bytesOf(const std::vector<T> &values) {
  return std::string(reinterpret_cast<const char *>(values.data()), values.size() * sizeof(T));
}

struct Spec {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// Writes well-formed tensors back to back (the shapes are trusted: the
/// error tests below write their broken headers with writeRaw).
void writeTensors(const std::string &path, const std::vector<Spec> &specs) {
  std::string header = R"({"__metadata__": {"format": "pt"})", data;
  for (const Spec &s : specs) {
    header += fmt::format(R"(, "{}": {{"dtype": "{}", "shape": {}, "data_offsets": [{}, {}]}})",
                          s.name, s.dtype, shapeString(s.shape), data.size(),
                          data.size() + s.bytes.size());
    data += s.bytes;
  }
  writeRaw(path, header + "}", data);
}

/// The message of the InputError `f` throws, or a marker when it throws none.
std::string inputErrorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const InputError &e) {
    return e.what();
  }
  return "(no InputError)";
}

void expectMentions(const std::string &message, const std::vector<std::string> &needles) {
  for (const std::string &needle : needles)
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message lacks '" << needle << "': " << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
}

/// Writes `header` + `data` to bad.safetensors and returns the open error.
std::string openError(const TempDir &dir, const std::string &header, const std::string &data) {
  const std::string path = dir.file("bad.safetensors");
  writeRaw(path, header, data);
  return inputErrorOf([&] { SafetensorsFile::open(path); });
}

//===----------------------------------------------------------------------===//
// The real fixture
//===----------------------------------------------------------------------===//

TEST(CheckpointFixture, MixtralTensorsHaveKnownShapesAndFiniteValues) {
  auto checkpoint = Checkpoint::open(kMixtral);
  EXPECT_EQ(checkpoint->names().size(), 65u);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> known = {
      {"lm_head.weight", {251, 64}},
      {"model.embed_tokens.weight", {251, 64}},
      {"model.layers.0.block_sparse_moe.gate.weight", {8, 64}},
      {"model.layers.0.block_sparse_moe.experts.7.w2.weight", {64, 48}},
      {"model.layers.1.self_attn.k_proj.weight", {32, 64}},
      {"model.norm.weight", {64}}};
  for (const auto &[name, shape] : known) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(checkpoint->has(name));
    TensorView view = checkpoint->tensor(name, shape);
    EXPECT_EQ(view.dtype, DType::F32);
    EXPECT_EQ(checkpoint->fileOf(name), kMixtral + "/model.safetensors");
    for (int64_t i = 0; i < view.numel(); ++i)
      ASSERT_TRUE(std::isfinite(view.at(i))) << "element " << i;
  }
}

TEST(CheckpointFixture, MixtralValuesMatchPython) {
  // Read with Python's struct module from the same file.
  auto checkpoint = Checkpoint::open(kMixtral + "/model.safetensors");
  TensorView norm = checkpoint->tensor("model.norm.weight", {64});
  EXPECT_FLOAT_EQ(norm.at(0), 0.8174352049827576f);
  EXPECT_FLOAT_EQ(norm.at(5), 0.94755619764328f);
  TensorView gate = checkpoint->tensor("model.layers.0.block_sparse_moe.gate.weight", {8, 64});
  EXPECT_FLOAT_EQ(gate.at(0), -0.7894557118415833f);
  EXPECT_FLOAT_EQ(gate.at(5), 0.03811834752559662f);
  EXPECT_FLOAT_EQ(checkpoint->tensor("lm_head.weight", {251, 64}).at(5), 0.032843366265296936f);
}

TEST(CheckpointFixture, ShapeMismatchNamesFileTensorAndShapes) {
  auto checkpoint = Checkpoint::open(kMixtral);
  EXPECT_EQ(inputErrorOf([&] { checkpoint->tensor("model.layers.0.self_attn.k_proj.weight", {64, 64}); }),
            kMixtral + "/model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': "
                       "expected shape [64, 64] but found [32, 64]");
}

TEST(CheckpointFixture, MissingTensorNamesCheckpoint) {
  auto checkpoint = Checkpoint::open(kMixtral);
  EXPECT_FALSE(checkpoint->has("model.layers.2.input_layernorm.weight"));
  EXPECT_EQ(inputErrorOf([&] { checkpoint->tensor("model.layers.2.input_layernorm.weight", {64}); }),
            kMixtral + ": missing tensor 'model.layers.2.input_layernorm.weight'");
}

//===----------------------------------------------------------------------===//
// Decoding and dtypes
//===----------------------------------------------------------------------===//

TEST(SafetensorsDecode, Bf16AndF16ThroughAt) {
  TempDir dir;
  // bf16: 1, -2, 0.5, 3.140625; f16: 1, -2, 0.5, 65504 (largest), 2^-24
  // (smallest subnormal).
  writeTensors(dir.file("model.safetensors"),
               {{"b", "BF16", {2, 2}, bytesOf<uint16_t>({0x3f80, 0xc000, 0x3f00, 0x4049})},
                {"h", "F16", {5}, bytesOf<uint16_t>({0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001})}});
  auto checkpoint = Checkpoint::open(dir.path());
  TensorView b = checkpoint->tensor("b", {2, 2});
  EXPECT_EQ(b.dtype, DType::BF16);
  EXPECT_EQ(b.at(0), 1.0f);
  EXPECT_EQ(b.at(1), -2.0f);
  EXPECT_EQ(b.at(2), 0.5f);
  EXPECT_EQ(b.at(3), 3.140625f);
  TensorView h = checkpoint->tensor("h", {5});
  EXPECT_EQ(h.dtype, DType::F16);
  EXPECT_EQ(h.at(0), 1.0f);
  EXPECT_EQ(h.at(1), -2.0f);
  EXPECT_EQ(h.at(2), 0.5f);
  EXPECT_EQ(h.at(3), 65504.0f);
  EXPECT_EQ(h.at(4), std::ldexp(1.0f, -24));
}

TEST(SafetensorsDecode, IntegerTensorsReadableButNotAsWeights) {
  TempDir dir;
  writeTensors(dir.file("model.safetensors"),
               {{"ids", "I64", {2}, bytesOf<int64_t>({7, -3})},
                {"pos", "I32", {3}, bytesOf<int32_t>({1, 2, 3})}});
  auto file = SafetensorsFile::open(dir.file("model.safetensors"));
  EXPECT_EQ(file->names(), (std::vector<std::string>{"ids", "pos"}));
  EXPECT_EQ(file->tensor("ids").at(1), -3.0f);
  EXPECT_EQ(file->tensor("pos").at(2), 3.0f);
  auto checkpoint = Checkpoint::open(dir.path());
  expectMentions(inputErrorOf([&] { checkpoint->tensor("pos", {3}); }),
                 {dir.file("model.safetensors"), "'pos'", "I32", "not a float type"});
  expectMentions(inputErrorOf([&] { checkpoint->tensor("ids", {2}); }), {"'ids'", "I64"});
}

TEST(SafetensorsDecode, EmptyTensorAndNoTensors) {
  TempDir dir;
  writeTensors(dir.file("a.safetensors"), {{"empty", "F32", {0, 4}, ""},
                                           {"one", "F32", {1}, bytesOf<float>({2.5f})}});
  auto file = SafetensorsFile::open(dir.file("a.safetensors"));
  EXPECT_EQ(file->tensor("empty").numel(), 0);
  EXPECT_EQ(file->tensor("one").at(0), 2.5f);
  writeRaw(dir.file("b.safetensors"), "{}", "");
  EXPECT_TRUE(SafetensorsFile::open(dir.file("b.safetensors"))->names().empty());
}

//===----------------------------------------------------------------------===//
// Malformed files: one per rule
//===----------------------------------------------------------------------===//

TEST(SafetensorsErrors, MissingFile) {
  TempDir dir;
  expectMentions(inputErrorOf([&] { SafetensorsFile::open(dir.file("nope.safetensors")); }),
                 {dir.file("nope.safetensors"), "cannot open", "No such file"});
}

TEST(SafetensorsErrors, ShorterThanEightBytes) {
  TempDir dir;
  writeText(dir.file("short.safetensors"), "abc");
  expectMentions(inputErrorOf([&] { SafetensorsFile::open(dir.file("short.safetensors")); }),
                 {dir.file("short.safetensors"), "3 bytes", "too short"});
  writeText(dir.file("empty.safetensors"), "");
  expectMentions(inputErrorOf([&] { SafetensorsFile::open(dir.file("empty.safetensors")); }),
                 {dir.file("empty.safetensors"), "0 bytes"});
}

TEST(SafetensorsErrors, HeaderLongerThanFile) {
  TempDir dir;
  // Header length 1000, but only 2 bytes follow.
  writeText(dir.file("t.safetensors"), std::string("\xe8\x03\0\0\0\0\0\0{}", 10));
  expectMentions(inputErrorOf([&] { SafetensorsFile::open(dir.file("t.safetensors")); }),
                 {dir.file("t.safetensors"), "header length 1000", "truncated"});
}

TEST(SafetensorsErrors, HeaderNotJsonObject) {
  TempDir dir;
  expectMentions(openError(dir, "{\"a\": ", ""), {"bad.safetensors", "not valid JSON"});
  expectMentions(openError(dir, "[1, 2]", ""), {"bad.safetensors", "array, expected an object"});
  expectMentions(openError(dir, R"({"__metadata__": [1]})", ""), {"bad.safetensors", "__metadata__"});
  expectMentions(openError(dir, R"({"__metadata__": {"format": 1}})", ""),
                 {"bad.safetensors", "'format'", "expected a string"});
}

TEST(SafetensorsErrors, EntryFieldsMissingOrMistyped) {
  TempDir dir;
  const std::string data(16, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w": 3})", "entry is a JSON number"},
      {R"({"w": {"shape": [4], "data_offsets": [0, 16]}})", "no \"dtype\""},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 16]}})", "no \"shape\""},
      {R"({"w": {"dtype": "F32", "shape": [4]}})", "no \"data_offsets\""},
      {R"({"w": {"dtype": 32, "shape": [4], "data_offsets": [0, 16]}})", "\"dtype\" is a JSON number"},
      {R"({"w": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}})", "\"shape\" is a JSON string"},
      {R"({"w": {"dtype": "F32", "shape": [4.0], "data_offsets": [0, 16]}})", "expected non-negative integers"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0]}})", "\"data_offsets\" is [0]"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, "16"]}})", "expected [begin, end]"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [-4, 12]}})", "expected [begin, end]"},
      {R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", "end before they begin"},
  };
  for (const auto &[header, needle] : cases) {
    SCOPED_TRACE(header);
    expectMentions(openError(dir, header, data), {dir.file("bad.safetensors"), "tensor 'w'", needle});
  }
}

TEST(SafetensorsErrors, UnknownDtype) {
  TempDir dir;
  for (const char *dtype : {"F64", "U8", "f32", "float32"}) {
    SCOPED_TRACE(dtype);
    expectMentions(
        openError(dir, fmt::format(R"({{"w": {{"dtype": "{}", "shape": [2], "data_offsets": [0, 8]}}}})", dtype),
                  std::string(8, '\0')),
        {"bad.safetensors", "tensor 'w'", fmt::format("unsupported dtype '{}'", dtype)});
  }
}

TEST(SafetensorsErrors, NegativeDimension) {
  TempDir dir;
  expectMentions(openError(dir, R"({"w": {"dtype": "F32", "shape": [2, -2], "data_offsets": [0, 16]}})",
                           std::string(16, '\0')),
                 {"bad.safetensors", "tensor 'w'", "negative dimension -2"});
}

TEST(SafetensorsErrors, OffsetsPastEndOfTruncatedFile) {
  TempDir dir;
  expectMentions(openError(dir, R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})",
                           std::string(20, '\0')),
                 {"bad.safetensors", "tensor 'w'", "data_offsets [0, 32]", "truncated"});
}

TEST(SafetensorsErrors, OffsetsDisagreeWithDtypeAndShape) {
  TempDir dir;
  const std::string name = "model.layers.0.mlp.gate.weight";
  EXPECT_EQ(openError(dir,
                      fmt::format(R"({{"{}": {{"dtype": "F32", "shape": [8, 64], "data_offsets": [10, 20]}}}})", name),
                      std::string(64, '\0')),
            dir.file("bad.safetensors") + ": tensor '" + name +
                "': data_offsets [10, 20] hold 10 bytes but F32 [8, 64] needs 2048");
  // A shape whose byte count overflows 64 bits cannot match any offsets.
  expectMentions(openError(dir, R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
                           std::string(8, '\0')),
                 {"tensor 'w'", "more than 2^64"});
}

TEST(SafetensorsErrors, OverlappingEntries) {
  TempDir dir;
  expectMentions(openError(dir,
                           R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                           std::string(16, '\0')),
                 {"bad.safetensors", "'a'", "'b'", "overlap"});
}

// Issue 11: the data bytes are tiled exactly, as the format and its
// reference reader require (bytes no tensor owns mean a damaged file).
TEST(SafetensorsErrors, GapsAndTrailingBytes) {
  TempDir dir;
  expectMentions(openError(dir,
                           R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})",
                           std::string(24, '\0')),
                 {"bad.safetensors", "data bytes [8, 16) belong to no tensor", "'b'"});
  expectMentions(openError(dir, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                           std::string(12, '\0')),
                 {"bad.safetensors", "4 bytes after the last tensor's data"});
}

TEST(SafetensorsErrors, MisalignedElements) {
  TempDir dir;
  expectMentions(openError(dir, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [2, 10]}})",
                           std::string(12, '\0')),
                 {"bad.safetensors", "tensor 'w'", "not aligned"});
}

TEST(SafetensorsErrors, MissingTensorInFile) {
  TempDir dir;
  writeTensors(dir.file("model.safetensors"), {{"w", "F32", {1}, bytesOf<float>({1})}});
  auto file = SafetensorsFile::open(dir.file("model.safetensors"));
  EXPECT_EQ(inputErrorOf([&] { file->tensor("v"); }),
            dir.file("model.safetensors") + ": missing tensor 'v'");
}

//===----------------------------------------------------------------------===//
// Checkpoint layouts
//===----------------------------------------------------------------------===//

/// Two shards and their index: a and b in shard 1, c in shard 2.
void writeSharded(const TempDir &dir) {
  writeTensors(dir.file("model-00001-of-00002.safetensors"),
               {{"a", "F32", {2}, bytesOf<float>({1, 2})}, {"b", "BF16", {1}, bytesOf<uint16_t>({0x4040})}});
  writeTensors(dir.file("model-00002-of-00002.safetensors"), {{"c", "F32", {1, 3}, bytesOf<float>({4, 5, 6})}});
  writeText(dir.file("model.safetensors.index.json"),
            R"({"metadata": {"total_size": 22}, "weight_map": {
                  "a": "model-00001-of-00002.safetensors",
                  "b": "model-00001-of-00002.safetensors",
                  "c": "model-00002-of-00002.safetensors"}})");
}

TEST(CheckpointSharded, IndexSplitsTensorsOverTwoFiles) {
  TempDir dir;
  writeSharded(dir);
  auto checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(checkpoint->fileOf("a"), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(checkpoint->fileOf("b"), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(checkpoint->fileOf("c"), dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(checkpoint->tensor("a", {2}).at(1), 2.0f);
  EXPECT_EQ(checkpoint->tensor("b", {1}).at(0), 3.0f);
  EXPECT_EQ(checkpoint->tensor("c", {1, 3}).at(2), 6.0f);
  // The index may also be named directly.
  EXPECT_EQ(Checkpoint::open(dir.file("model.safetensors.index.json"))->names().size(), 3u);
  expectMentions(inputErrorOf([&] { checkpoint->tensor("c", {3}); }),
                 {dir.file("model-00002-of-00002.safetensors"), "'c'", "expected shape [3] but found [1, 3]"});
}

TEST(CheckpointSharded, MissingShardNamedByIndex) {
  TempDir dir;
  writeSharded(dir);
  fs::remove(dir.file("model-00002-of-00002.safetensors"));
  expectMentions(inputErrorOf([&] { Checkpoint::open(dir.path()); }),
                 {dir.file("model.safetensors.index.json"), "tensor 'c'",
                  dir.file("model-00002-of-00002.safetensors"), "does not exist"});
}

TEST(CheckpointSharded, TensorAbsentFromItsShard) {
  TempDir dir;
  writeSharded(dir);
  // The index claims c is in shard 1, but it is in shard 2.
  writeText(dir.file("model.safetensors.index.json"),
            R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                               "c": "model-00001-of-00002.safetensors"}})");
  expectMentions(inputErrorOf([&] { Checkpoint::open(dir.path()); }),
                 {"tensor 'c'", dir.file("model-00001-of-00002.safetensors"), "does not hold it"});
}

TEST(CheckpointSharded, MalformedIndex) {
  TempDir dir;
  writeSharded(dir);
  const std::string index = dir.file("model.safetensors.index.json");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not valid JSON"},
      {R"({"metadata": {}})", "\"weight_map\""},
      {R"({"weight_map": {}})", "empty"},
      {R"({"weight_map": {"a": 1}})", "tensor 'a'"},
      {R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})", "not a file name"},
  };
  for (const auto &[text, needle] : cases) {
    SCOPED_TRACE(text);
    writeText(index, text);
    expectMentions(inputErrorOf([&] { Checkpoint::open(dir.path()); }), {index, needle});
  }
}

TEST(CheckpointLayout, LoneSafetensorsFileInDirectory) {
  TempDir dir;
  writeTensors(dir.file("weights.safetensors"), {{"w", "F32", {1}, bytesOf<float>({7})}});
  auto checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint->fileOf("w"), dir.file("weights.safetensors"));
  EXPECT_EQ(checkpoint->tensor("w", {1}).at(0), 7.0f);
}

TEST(CheckpointLayout, ModelSafetensorsPreferredOverOthers) {
  TempDir dir;
  writeTensors(dir.file("model.safetensors"), {{"w", "F32", {1}, bytesOf<float>({1})}});
  writeTensors(dir.file("other.safetensors"), {{"v", "F32", {1}, bytesOf<float>({2})}});
  auto checkpoint = Checkpoint::open(dir.path());
  EXPECT_TRUE(checkpoint->has("w"));
  EXPECT_FALSE(checkpoint->has("v"));
}

TEST(CheckpointLayout, NoneOrSeveralSafetensorsFiles) {
  TempDir dir;
  writeText(dir.file("config.json"), "{}");
  expectMentions(inputErrorOf([&] { Checkpoint::open(dir.path()); }),
                 {dir.path(), "no model.safetensors.index.json"});
  writeTensors(dir.file("x.safetensors"), {{"w", "F32", {1}, bytesOf<float>({1})}});
  writeTensors(dir.file("y.safetensors"), {{"w", "F32", {1}, bytesOf<float>({1})}});
  expectMentions(inputErrorOf([&] { Checkpoint::open(dir.path()); }),
                 {dir.path(), "2 *.safetensors files (x.safetensors, y.safetensors)"});
}

TEST(CheckpointLayout, MissingPath) {
  TempDir dir;
  expectMentions(inputErrorOf([&] { Checkpoint::open(dir.file("absent")); }),
                 {dir.file("absent"), "no such checkpoint"});
}

TEST(CheckpointLayout, BadFileInsideDirectoryNamesIt) {
  TempDir dir;
  writeText(dir.file("model.safetensors"), "short");
  expectMentions(inputErrorOf([&] { Checkpoint::open(dir.path()); }),
                 {dir.file("model.safetensors"), "too short"});
}

} // namespace
