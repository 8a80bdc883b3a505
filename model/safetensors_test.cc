#include "model/safetensors.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/safetensors_writer.h"

namespace kvrm {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A fresh directory per test under TEST_TMPDIR.
std::string TestDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string dir = std::string(base != nullptr ? base : "/tmp") + "/st_" + name;
  EXPECT_EQ(std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str()), 0);
  return dir;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file built by hand: prefix, header as given, then `data_bytes` zero bytes.
std::string HandMade(const std::string& header, size_t data_bytes) {
  return LengthPrefix(header.size()) + header + std::string(data_bytes, '\0');
}

// A tensor with random bits (every pattern, NaNs included, must survive bit-exactly).
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  TensorToWrite ToWrite() const { return {name, dtype, shape, bytes}; }
};

OwnedTensor RandomTensor(std::mt19937& rng, std::string name, DType dtype,
                         std::vector<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<std::byte> bytes(numel * DTypeSize(dtype));
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
  return {std::move(name), dtype, std::move(shape), std::move(bytes)};
}

std::vector<TensorToWrite> ToWrite(const std::vector<OwnedTensor>& owned) {
  std::vector<TensorToWrite> out;
  for (const OwnedTensor& t : owned) out.push_back(t.ToWrite());
  return out;
}

void ExpectSameTensor(const TensorView& view, const OwnedTensor& want) {
  EXPECT_EQ(view.name, want.name);
  EXPECT_EQ(view.dtype, want.dtype) << want.name;
  EXPECT_EQ(view.shape, want.shape) << want.name;
  EXPECT_EQ(view.numel() * static_cast<int64_t>(DTypeSize(want.dtype)),
            static_cast<int64_t>(want.bytes.size()));
  ASSERT_EQ(view.nbytes, want.bytes.size()) << want.name;
  if (view.nbytes > 0) {  // an empty vector's data() may be null, which memcmp must not see
    EXPECT_EQ(std::memcmp(view.data, want.bytes.data(), view.nbytes), 0) << want.name;
  }
}

// Asserts `s` has `code` and that its message names every string in `parts`.
void ExpectError(const absl::Status& s, absl::StatusCode code,
                 const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), code) << s;
  for (const std::string& p : parts) EXPECT_THAT(std::string(s.message()), HasSubstr(p));
}

absl::Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

// ---- round trips ----------------------------------------------------------------------------

TEST(SafetensorsTest, RoundTripF32F16Bf16) {
  const std::string dir = TestDir();
  std::mt19937 rng(1234);
  const std::vector<OwnedTensor> tensors = {
      RandomTensor(rng, "model.embed_tokens.weight", DType::kF32, {7, 5}),
      RandomTensor(rng, "scalar", DType::kF32, {}),
      RandomTensor(rng, "layers.0.q.weight", DType::kF16, {3, 9}),
      RandomTensor(rng, "layers.0.norm.weight", DType::kBF16, {2, 3, 4}),
      RandomTensor(rng, "empty", DType::kBF16, {0, 4}),
      RandomTensor(rng, "odd", DType::kF16, {3}),
  };
  const std::string path = dir + "/t.safetensors";
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode"}};
  ASSERT_TRUE(WriteSafetensors(path, ToWrite(tensors), metadata).ok());

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), metadata);
  EXPECT_THAT((*file)->TensorNames(),
              ElementsAre("empty", "layers.0.norm.weight", "layers.0.q.weight",
                          "model.embed_tokens.weight", "odd", "scalar"));
  for (const OwnedTensor& t : tensors) {
    const TensorView* view = (*file)->Find(t.name);
    ASSERT_NE(view, nullptr) << t.name;
    ExpectSameTensor(*view, t);
    EXPECT_EQ(view->file, path);
  }
  EXPECT_EQ((*file)->Find("absent"), nullptr);

  // The reference layout: header padded with spaces to 8 bytes, tensors packed in the given
  // order without gaps, nothing after the last one (the reference reader checks all three).
  const std::string raw = ReadFile(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  size_t total = 0;
  for (const OwnedTensor& t : tensors) total += t.bytes.size();
  EXPECT_EQ(raw.size(), 8 + header_len + total);
  absl::StatusOr<Json> header = ParseJson(raw.substr(8, header_len), "header");
  ASSERT_TRUE(header.ok());
  uint64_t offset = 0;
  for (const OwnedTensor& t : tensors) {
    EXPECT_EQ((*header)[t.name]["data_offsets"][0].get<uint64_t>(), offset) << t.name;
    offset += t.bytes.size();
  }
  // No temporary left behind.
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
}

TEST(SafetensorsTest, SingleFileDirectory) {
  const std::string dir = TestDir();
  std::mt19937 rng(7);
  const std::vector<OwnedTensor> tensors = {RandomTensor(rng, "a", DType::kBF16, {4, 4}),
                                            RandomTensor(rng, "b", DType::kF32, {2})};
  ASSERT_TRUE(WriteSafetensorsSharded(dir, ToWrite(tensors), 1).ok());
  EXPECT_FALSE(std::ifstream(dir + "/model.safetensors.index.json").good());
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::OpenDirectory(dir);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_THAT((*set)->TensorNames(), ElementsAre("a", "b"));
  EXPECT_EQ((*set)->total_bytes(), 32 + 8);
  absl::StatusOr<TensorView> a = (*set)->Get("a", {4, 4});
  ASSERT_TRUE(a.ok()) << a.status();
  ExpectSameTensor(*a, tensors[0]);
}

TEST(SafetensorsTest, ShardedRoundTrip) {
  const std::string dir = TestDir();
  std::mt19937 rng(99);
  std::vector<OwnedTensor> tensors;
  for (int layer = 0; layer < 4; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    tensors.push_back(RandomTensor(rng, p + "self_attn.q_proj.weight", DType::kBF16, {16, 16}));
    tensors.push_back(RandomTensor(rng, p + "mlp.up_proj.weight", DType::kBF16, {32, 16}));
    tensors.push_back(RandomTensor(rng, p + "input_layernorm.weight", DType::kF32, {16}));
  }
  tensors.push_back(RandomTensor(rng, "lm_head.weight", DType::kF16, {50, 16}));
  ASSERT_TRUE(WriteSafetensorsSharded(dir, ToWrite(tensors), 3).ok());

  absl::StatusOr<Json> index = ReadJsonFile(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok()) << index.status();
  int64_t total = 0;
  for (const OwnedTensor& t : tensors) total += static_cast<int64_t>(t.bytes.size());
  EXPECT_EQ((*index)["metadata"]["total_size"].get<int64_t>(), total);
  std::map<std::string, int> per_shard;
  std::string previous;
  for (const OwnedTensor& t : tensors) {
    const std::string shard = (*index)["weight_map"][t.name].get<std::string>();
    EXPECT_GE(shard, previous) << "order must be kept across shards";
    previous = shard;
    ++per_shard[shard];
  }
  EXPECT_THAT(per_shard, ElementsAre(testing::Key("model-00001-of-00003.safetensors"),
                                     testing::Key("model-00002-of-00003.safetensors"),
                                     testing::Key("model-00003-of-00003.safetensors")));
  // Split by size: no shard more than twice the mean plus one tensor.
  for (const auto& [shard, n] : per_shard) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(dir + "/" + shard);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->metadata().at("format"), "pt");
    EXPECT_LT((*f)->file_size(), static_cast<size_t>(total) / 3 * 2 + 2000) << shard;
  }

  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::OpenDirectory(dir);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->total_bytes(), total);
  EXPECT_EQ((*set)->TensorNames().size(), tensors.size());
  for (const OwnedTensor& t : tensors) {
    absl::StatusOr<TensorView> view = (*set)->Get(t.name, t.shape);
    ASSERT_TRUE(view.ok()) << view.status();
    ExpectSameTensor(*view, t);
    EXPECT_THAT(view->file, HasSubstr((*index)["weight_map"][t.name].get<std::string>()));
  }
}

TEST(SafetensorsTest, ReadsReferenceStyleFile) {
  // As huggingface/safetensors' save_file writes it: metadata first, spaces to 8 bytes.
  const std::string dir = TestDir();
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("z":{"dtype":"BF16","shape":[0],"data_offsets":[4,4]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const float values[2] = {1.5f, -2.25f};
  std::string bytes = LengthPrefix(header.size()) + header;
  bytes.append(reinterpret_cast<const char*>(values), sizeof(values));
  WriteFile(dir + "/model.safetensors", bytes);
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::OpenDirectory(dir);
  ASSERT_TRUE(set.ok()) << set.status();
  absl::StatusOr<TensorView> w = (*set)->Get("w", {2});
  ASSERT_TRUE(w.ok()) << w.status();
  float got[2];
  std::memcpy(got, w->data, sizeof(got));
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], -2.25f);
  // A zero-length tensor inside another's range overlaps nothing.
  EXPECT_EQ((*set)->Get("z")->nbytes, 0u);
}

// ---- malformed files ------------------------------------------------------------------------

TEST(SafetensorsTest, TruncatedHeader) {
  const std::string path = TestDir() + "/short.safetensors";
  WriteFile(path, "abcde");
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "truncated header"});
  WriteFile(path, "");
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "truncated header"});
}

TEST(SafetensorsTest, HeaderLengthPastEndOfFileOrTooLarge) {
  const std::string path = TestDir() + "/x.safetensors";
  WriteFile(path, LengthPrefix(1000) + "{}        ");
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument,
              {path, "header length 1000 runs past the end"});
  WriteFile(path, LengthPrefix(uint64_t{1} << 40) + "{}");
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "exceeds"});
  WriteFile(path, LengthPrefix(~uint64_t{0}) + "{}");
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "exceeds"});
}

TEST(SafetensorsTest, InvalidJsonOrNonObjectHeader) {
  const std::string path = TestDir() + "/x.safetensors";
  WriteFile(path, HandMade("{\"a\": {\"dtype\": ", 0));
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "invalid JSON"});
  WriteFile(path, HandMade("[1, 2, 3]", 0));
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "not a JSON object"});
  WriteFile(path, HandMade(std::string(100, '[') + std::string(100, ']'), 0));
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "nested"});
}

TEST(SafetensorsTest, UnsupportedDtypesAreNamed) {
  const std::string path = TestDir() + "/x.safetensors";
  for (const std::string dtype : {"I4", "F8_E3M4", "C64", "f32"}) {
    WriteFile(
        path,
        HandMade(R"({"w":{"dtype":")" + dtype + R"(","shape":[2],"data_offsets":[0,16]}})", 16));
    ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument,
                {path, "tensor \"w\"", "\"" + dtype + "\""});
  }
}

// Integer and other non-weight types open (quantized checkpoints' packed I32 weights, I64
// bookkeeping) with their own element sizes; Get refuses them where a float weight is wanted,
// naming the dtype, and GetAny returns them.
TEST(SafetensorsTest, NonFloatTypesOpenAndGetRefusesThem) {
  const std::string dir = TestDir() + "/nonfloat";
  std::filesystem::create_directories(dir);
  const struct {
    const char* dtype;
    StorageType type;
    int size;
  } cases[] = {{"I32", StorageType::kI32, 4}, {"I64", StorageType::kI64, 8},
               {"U8", StorageType::kU8, 1},   {"F8_E4M3", StorageType::kF8E4M3, 1},
               {"F64", StorageType::kF64, 8}, {"BOOL", StorageType::kBool, 1},
               {"I16", StorageType::kI16, 2}};
  for (const auto& c : cases) {
    const int bytes = 3 * c.size;
    WriteFile(dir + "/model.safetensors",
              HandMade(absl::StrCat(R"({"w":{"dtype":")", c.dtype,
                                    R"(","shape":[3],"data_offsets":[0,)", bytes, "]}}"),
                       bytes));
    absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::OpenDirectory(dir);
    ASSERT_TRUE(set.ok()) << c.dtype << ": " << set.status();
    absl::StatusOr<TensorView> any = (*set)->GetAny("w", {3});
    ASSERT_TRUE(any.ok()) << any.status();
    EXPECT_EQ(any->type, c.type);
    EXPECT_EQ(StorageTypeName(any->type), c.dtype);
    EXPECT_EQ(any->nbytes, static_cast<size_t>(bytes));
    EXPECT_FALSE(any->is_float());
    ExpectError((*set)->Get("w", {3}).status(), absl::StatusCode::kInvalidArgument,
                {"tensor \"w\"", absl::StrCat("dtype ", c.dtype), "not a float"});
    // A mismatched length is still caught with the type's own size.
    WriteFile(dir + "/model.safetensors",
              HandMade(absl::StrCat(R"({"w":{"dtype":")", c.dtype,
                                    R"(","shape":[3],"data_offsets":[0,)", bytes + 1, "]}}"),
                       bytes + 1));
    ExpectError(SafetensorsSet::OpenDirectory(dir).status(), absl::StatusCode::kInvalidArgument,
                {"shape mismatch", c.dtype});
  }
}

TEST(SafetensorsTest, MalformedEntries) {
  const std::string path = TestDir() + "/x.safetensors";
  const struct {
    std::string entry;
    std::string message;
  } cases[] = {
      {R"("oops")", "not an object"},
      {R"({"shape":[2],"data_offsets":[0,8]})", "dtype"},
      {R"({"dtype":7,"shape":[2],"data_offsets":[0,8]})", "dtype"},
      {R"({"dtype":"F32","data_offsets":[0,8]})", "shape"},
      {R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})", "shape"},
      {R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", "-2"},
      {R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})", "2.5"},
      {R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]})", "overflows"},
      {R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]})", "overflows"},
      {R"({"dtype":"F32","shape":[2]})", "data_offsets"},
      {R"({"dtype":"F32","shape":[2],"data_offsets":[0]})", "data_offsets"},
      {R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,16]})", "data_offsets"},
      {R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})", "data_offsets"},
      {R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})", "begin <= end"},
      {R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,12]})", "shape mismatch"},
      {R"({"dtype":"BF16","shape":[3],"data_offsets":[0,12]})", "shape mismatch"},
      {R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", "past the end"},
      {R"({"dtype":"F32","shape":[0],"data_offsets":[9,9]})", "past the end"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.entry);
    WriteFile(path, HandMade(R"({"layers.0.w":)" + c.entry + "}", 8));
    ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument,
                {path, "tensor \"layers.0.w\"", c.message});
  }
}

TEST(SafetensorsTest, OverlappingTensors) {
  const std::string path = TestDir() + "/x.safetensors";
  WriteFile(path, HandMade(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                           R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                           24));
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument,
              {path, "tensor \"b\"", "overlap", "\"a\""});
  // Contained inside an earlier, longer tensor that is not the latest one to start.
  WriteFile(path, HandMade(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                           R"("c":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                           32));
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "overlap", "\"a\""});
}

TEST(SafetensorsTest, BadMetadata) {
  const std::string path = TestDir() + "/x.safetensors";
  WriteFile(path, HandMade(R"({"__metadata__":{"format":1}})", 0));
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument,
              {path, "__metadata__", "format"});
  WriteFile(path, HandMade(R"({"__metadata__":[]})", 0));
  ExpectError(OpenStatus(path), absl::StatusCode::kInvalidArgument, {path, "__metadata__"});
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  ExpectError(OpenStatus("/nonexistent/x.safetensors"), absl::StatusCode::kNotFound,
              {"/nonexistent/x.safetensors"});
  ExpectError(OpenStatus(TestDir()), absl::StatusCode::kInvalidArgument, {"not a regular file"});
}

// ---- sets -----------------------------------------------------------------------------------

class SetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir();
    std::mt19937 rng(5);
    tensors_ = {RandomTensor(rng, "embed", DType::kBF16, {2, 3}),
                RandomTensor(rng, "norm", DType::kF32, {3}),
                RandomTensor(rng, "head", DType::kF16, {3, 2})};
  }
  std::string dir_;
  std::vector<OwnedTensor> tensors_;
};

TEST_F(SetTest, MissingTensorAndShapeMismatchViaGet) {
  ASSERT_TRUE(WriteSafetensorsSharded(dir_, ToWrite(tensors_), 1).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::OpenDirectory(dir_);
  ASSERT_TRUE(set.ok()) << set.status();
  ExpectError((*set)->Get("lm_head.weight").status(), absl::StatusCode::kNotFound,
              {"\"lm_head.weight\"", dir_});
  ExpectError((*set)->Get("embed", {3, 2}).status(), absl::StatusCode::kInvalidArgument,
              {"\"embed\"", dir_ + "/model.safetensors", "[2, 3]", "[3, 2]"});
  ExpectError((*set)->Get("norm", {3, 1}).status(), absl::StatusCode::kInvalidArgument,
              {"\"norm\"", "[3]", "[3, 1]"});
  EXPECT_TRUE((*set)->Get("embed", {2, 3}).ok());
  EXPECT_TRUE((*set)->Get("embed").ok());
}

TEST_F(SetTest, SingleFileWinsOverAnIndexAsInTransformers) {
  // Shards of other values beside a single file: from_pretrained loads model.safetensors.
  std::mt19937 rng(9);
  std::vector<OwnedTensor> other = {RandomTensor(rng, "embed", DType::kBF16, {2, 3}),
                                    RandomTensor(rng, "norm", DType::kF32, {3}),
                                    RandomTensor(rng, "head", DType::kF16, {3, 2})};
  ASSERT_TRUE(WriteSafetensorsSharded(dir_, ToWrite(other), 2).ok());
  ASSERT_TRUE(WriteSafetensorsSharded(dir_, ToWrite(tensors_), 1).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::OpenDirectory(dir_);
  ASSERT_TRUE(set.ok()) << set.status();
  absl::StatusOr<TensorView> embed = (*set)->Get("embed");
  ASSERT_TRUE(embed.ok());
  EXPECT_THAT(embed->file, HasSubstr("/model.safetensors"));
  EXPECT_EQ(std::memcmp(embed->data, tensors_[0].bytes.data(), tensors_[0].bytes.size()), 0);
}

TEST_F(SetTest, IndexReferencingMissingShard) {
  ASSERT_TRUE(WriteSafetensorsSharded(dir_, ToWrite(tensors_), 3).ok());
  ASSERT_EQ(std::remove((dir_ + "/model-00002-of-00003.safetensors").c_str()), 0);
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kNotFound,
              {"model-00002-of-00003.safetensors", "model.safetensors.index.json"});
}

TEST_F(SetTest, IndexListsTensorAbsentFromShard) {
  ASSERT_TRUE(WriteSafetensorsSharded(dir_, ToWrite(tensors_), 3).ok());
  WriteFile(dir_ + "/model.safetensors.index.json",
            R"({"metadata":{"total_size":1},"weight_map":{)"
            R"("embed":"model-00001-of-00003.safetensors",)"
            R"("ghost":"model-00001-of-00003.safetensors"}})");
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"\"ghost\"", "model-00001-of-00003.safetensors"});
}

TEST_F(SetTest, MalformedIndex) {
  const std::string index = dir_ + "/model.safetensors.index.json";
  WriteFile(index, "{\"weight_map\": ");
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kInvalidArgument,
              {index, "invalid JSON"});
  WriteFile(index, R"({"metadata":{}})");
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kInvalidArgument,
              {index, "weight_map"});
  WriteFile(index, R"({"weight_map":{"embed":3}})");
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kInvalidArgument,
              {index, "\"embed\""});
  WriteFile(index, R"({"weight_map":{"embed":"../model.safetensors"}})");
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kInvalidArgument,
              {index, "../model.safetensors"});
}

TEST_F(SetTest, CorruptShardErrorNamesTheShard) {
  ASSERT_TRUE(WriteSafetensorsSharded(dir_, ToWrite(tensors_), 3).ok());
  const std::string shard = dir_ + "/model-00003-of-00003.safetensors";
  WriteFile(shard, "1234");
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kInvalidArgument,
              {shard, "truncated header"});
}

TEST_F(SetTest, EmptyDirectoriesAndFilesAreNotFound) {
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kNotFound,
              {dir_, "model.safetensors"});
  ExpectError(SafetensorsSet::OpenDirectory(dir_ + "/nope").status(), absl::StatusCode::kNotFound,
              {dir_ + "/nope"});
  ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", {}).ok());
  ExpectError(SafetensorsSet::OpenDirectory(dir_).status(), absl::StatusCode::kNotFound,
              {dir_, "no tensors"});
}

// ---- writer validation ----------------------------------------------------------------------

TEST_F(SetTest, WriterRejectsBadInput) {
  std::vector<TensorToWrite> w = ToWrite(tensors_);
  w[1].shape = {4};
  ExpectError(WriteSafetensors(dir_ + "/a.safetensors", w), absl::StatusCode::kInvalidArgument,
              {"\"norm\"", "bytes"});
  w = ToWrite(tensors_);
  w[2].name = "embed";
  ExpectError(WriteSafetensors(dir_ + "/a.safetensors", w), absl::StatusCode::kInvalidArgument,
              {"duplicate", "\"embed\""});
  ExpectError(WriteSafetensorsSharded(dir_, w, 2), absl::StatusCode::kInvalidArgument,
              {"duplicate", "\"embed\""});
  w = ToWrite(tensors_);
  w[0].name = "__metadata__";
  EXPECT_EQ(WriteSafetensors(dir_ + "/a.safetensors", w).code(),
            absl::StatusCode::kInvalidArgument);
  w[0].name = "bad\xff";
  EXPECT_EQ(WriteSafetensors(dir_ + "/a.safetensors", w).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensorsSharded(dir_, ToWrite(tensors_), 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensorsSharded(dir_, ToWrite(tensors_), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors("/nonexistent/dir/a.safetensors", ToWrite(tensors_)).code(),
            absl::StatusCode::kFailedPrecondition);
  // Nothing was written by the failed calls.
  EXPECT_FALSE(std::ifstream(dir_ + "/a.safetensors").good());
  EXPECT_FALSE(std::ifstream(dir_ + "/a.safetensors.tmp").good());
}

TEST_F(SetTest, EveryShardGetsATensorWhenShardsEqualTensors) {
  // One huge tensor first must not leave later shards empty.
  std::mt19937 rng(11);
  std::vector<OwnedTensor> t = {RandomTensor(rng, "big", DType::kF32, {1000}),
                                RandomTensor(rng, "s1", DType::kF32, {1}),
                                RandomTensor(rng, "s2", DType::kF32, {1})};
  ASSERT_TRUE(WriteSafetensorsSharded(dir_, ToWrite(t), 3).ok());
  absl::StatusOr<Json> index = ReadJsonFile(dir_ + "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok());
  EXPECT_EQ((*index)["weight_map"]["big"], "model-00001-of-00003.safetensors");
  EXPECT_EQ((*index)["weight_map"]["s1"], "model-00002-of-00003.safetensors");
  EXPECT_EQ((*index)["weight_map"]["s2"], "model-00003-of-00003.safetensors");
  absl::StatusOr<std::unique_ptr<SafetensorsSet>> set = SafetensorsSet::OpenDirectory(dir_);
  ASSERT_TRUE(set.ok()) << set.status();
  ExpectSameTensor(*(*set)->Get("s2", {1}), t[2]);
}

}  // namespace
}  // namespace kvrm
