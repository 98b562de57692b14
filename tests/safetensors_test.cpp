#include "models/safetensors.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace trainer::models;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A private folder per test case, removed afterwards.
struct TempDir {
  fs::path dir;
  TempDir() {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          ("safetensors_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A hand-made file: header length (by default the header's size), header text, data bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(header_len >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_bytes, 0x3f);
  spit(path, bytes);
}

// The error message of reading `path` (fails the test when reading succeeds).
std::string read_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL("reading " << path << " did not throw");
  return "";
}

void check_one_line_naming(const std::string& msg, const std::string& path) {
  CHECK_THAT(msg, Contains("safetensors: " + path + ": "));
  CHECK(msg.find('\n') == std::string::npos);
}

template <typename T>
std::vector<T> values_of(const SafeTensor& t) {
  std::vector<T> v(t.bytes.size() / sizeof(T));
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

}  // namespace

TEST_CASE("safetensors round trip of several dtypes and shapes, in the given order") {
  TempDir tmp;
  const std::string path = tmp.file("round.safetensors");
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
  std::vector<double> f64 = {3.141592653589793, -1e300, 2.5, 0.1};
  std::vector<int64_t> i64 = {-1, 0, int64_t(1) << 40, INT64_MIN};
  std::vector<int32_t> i32 = {7, -8, INT32_MAX, INT32_MIN, 0, 1};
  float scalar = 42.5f;
  std::vector<float> big(2 * 3 * 4 * 5);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.5f * float(i) - 7.0f;

  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "123"}, {"note", "a \"quoted\" value"}};
  write_safetensors(path,
                    {{"z.f32", "F32", {2, 3}, f32.data()},
                     {"a.f64", "F64", {4}, f64.data()},
                     {"labels", "I64", {4}, i64.data()},
                     {"grid", "I32", {3, 1, 2}, i32.data()},
                     {"scalar", "F32", {}, &scalar},
                     {"empty", "F32", {0, 3}, nullptr},
                     {"conv.weight", "F32", {2, 3, 4, 5}, big.data()}},
                    meta);
  CHECK_FALSE(fs::exists(path + ".tmp"));

  // Header length is a multiple of 8, so the data section is 8-byte aligned.
  const auto raw = slurp(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | raw.at(i);
  CHECK(header_len % 8 == 0);

  const SafeTensorsFile file = read_safetensors(path);
  CHECK(file.path == path);
  CHECK(file.metadata == meta);
  REQUIRE(file.tensors.size() == 7);
  const std::vector<std::string> order = {"z.f32", "a.f64", "labels", "grid", "scalar", "empty", "conv.weight"};
  for (size_t i = 0; i < order.size(); ++i) CHECK(file.tensors[i].name == order[i]);

  const SafeTensor& a = file.at("z.f32");
  CHECK(a.dtype == "F32");
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.numel() == 6);
  CHECK(a.as_f32() == f32);
  CHECK(std::signbit(a.as_f32()[4]));  // -0.0 survives bit for bit
  CHECK(file.at("a.f64").as_f64() == f64);
  CHECK(file.at("labels").as_i64() == i64);
  CHECK(values_of<int32_t>(file.at("grid")) == i32);
  CHECK(file.at("grid").shape == std::vector<int64_t>{3, 1, 2});
  CHECK(file.at("grid").as_i64() == std::vector<int64_t>(i32.begin(), i32.end()));

  const SafeTensor& s = file.at("scalar");
  CHECK(s.shape.empty());
  CHECK(s.numel() == 1);
  CHECK(s.as_f32() == std::vector<float>{42.5f});

  const SafeTensor& e = file.at("empty");
  CHECK(e.shape == std::vector<int64_t>{0, 3});
  CHECK(e.numel() == 0);
  CHECK(e.bytes.empty());
  CHECK(e.as_f32().empty());

  CHECK(file.at("conv.weight").as_f32() == big);
  CHECK(file.contains("labels"));
  CHECK_FALSE(file.contains("missing"));
}

TEST_CASE("safetensors conversions between dtypes") {
  TempDir tmp;
  const std::string path = tmp.file("conv.safetensors");
  std::vector<int64_t> i64 = {-3, 5};
  std::vector<double> f64 = {0.1, -2.0};
  write_safetensors(path, {{"i", "I64", {2}, i64.data()}, {"d", "F64", {2}, f64.data()}});
  const auto file = read_safetensors(path);
  CHECK(file.metadata.empty());
  CHECK(file.at("i").as_f32() == std::vector<float>{-3.0f, 5.0f});
  CHECK(file.at("i").as_f64() == std::vector<double>{-3.0, 5.0});
  CHECK(file.at("d").as_f32() == std::vector<float>{0.1f, -2.0f});
  CHECK_THROWS_WITH(file.at("d").as_i64(), Contains("'d'") && Contains("F64"));
}

TEST_CASE("safetensors at() names the missing tensor and the file") {
  TempDir tmp;
  const std::string path = tmp.file("few.safetensors");
  float v = 1.0f;
  write_safetensors(path, {{"weight", "F32", {}, &v}});
  const auto file = read_safetensors(path);
  CHECK_THROWS_WITH(file.at("bias"), Contains("'bias'") && Contains(path) && Contains("weight"));
}

TEST_CASE("safetensors write with no tensors and overwrite in place") {
  TempDir tmp;
  const std::string path = tmp.file("empty.safetensors");
  write_safetensors(path, {});
  CHECK(read_safetensors(path).tensors.empty());
  float v = 2.0f;
  write_safetensors(path, {{"x", "F32", {1}, &v}}, {{"k", "v"}});
  const auto file = read_safetensors(path);
  REQUIRE(file.tensors.size() == 1);
  CHECK(file.at("x").as_f32() == std::vector<float>{2.0f});
  CHECK(file.metadata.at("k") == "v");
}

TEST_CASE("safetensors writer rejects bad input, naming the file") {
  TempDir tmp;
  const std::string path = tmp.file("bad.safetensors");
  float v = 1.0f;
  CHECK_THROWS_WITH(write_safetensors(path, {{"x", "BF16", {1}, &v}}),
                    Contains(path) && Contains("unknown dtype 'BF16'"));
  CHECK_THROWS_WITH(write_safetensors(path, {{"x", "F32", {1}, &v}, {"x", "F32", {1}, &v}}),
                    Contains(path) && Contains("duplicate"));
  CHECK_THROWS_WITH(write_safetensors(path, {{"x", "F32", {3}, nullptr}}), Contains("null data"));
  CHECK_THROWS_WITH(write_safetensors(path, {{"__metadata__", "F32", {1}, &v}}), Contains("invalid tensor name"));
  CHECK_FALSE(fs::exists(path));
  const std::string nowhere = tmp.file("no/such/folder/x.safetensors");
  CHECK_THROWS_WITH(write_safetensors(nowhere, {{"x", "F32", {1}, &v}}), Contains(nowhere));
}

TEST_CASE("safetensors reads a file written by numpy") {
  const std::string path = std::string(TRAINER_FIXTURES) + "/safetensors_numpy.safetensors";
  const auto file = read_safetensors(path);
  CHECK(file.metadata.count("writer") == 1);
  CHECK_THAT(file.metadata.at("writer"), Contains("numpy"));
  REQUIRE(file.tensors.size() == 6);

  const auto& m = file.at("f32_matrix");
  CHECK(m.dtype == "F32");
  CHECK(m.shape == std::vector<int64_t>{2, 3});
  CHECK(m.as_f32() == std::vector<float>{-0.625f, -0.375f, -0.125f, 0.125f, 0.375f, 0.625f});

  const auto& d = file.at("f64_vector");
  CHECK(d.dtype == "F64");
  CHECK(d.as_f64() == std::vector<double>{1.0, -2.5, 1e-300, 3.141592653589793});

  const auto& l = file.at("i64_labels");
  CHECK(l.dtype == "I64");
  CHECK(l.as_i64() == std::vector<int64_t>{-1, 0, 7, (int64_t(1) << 40) + 3});

  const auto& g = file.at("i32_grid");
  CHECK(g.dtype == "I32");
  CHECK(g.shape == std::vector<int64_t>{2, 2});
  CHECK(g.as_i64() == std::vector<int64_t>{1, -2, INT32_MAX, INT32_MIN});

  CHECK(file.at("scalar").shape.empty());
  CHECK(file.at("scalar").as_f32() == std::vector<float>{3.25f});
  CHECK(file.at("empty").shape == std::vector<int64_t>{0, 3});
  CHECK(file.at("empty").bytes.empty());
}

TEST_CASE("safetensors reads the PyTorch reference fixtures") {
  const std::string dir = TRAINER_FIXTURES;
  const auto cnn = read_safetensors(dir + "/small_cnn.safetensors");
  CHECK(cnn.at("input").shape == std::vector<int64_t>{4, 3, 8, 8});
  CHECK(cnn.at("param.0.weight").shape == std::vector<int64_t>{8, 3, 3, 3});
  CHECK(cnn.at("param.5.weight").shape == std::vector<int64_t>{10, 128});
  CHECK(cnn.at("target").dtype == "I64");
  CHECK(cnn.at("loss").shape.empty());
  CHECK(cnn.at("f64.loss").dtype == "F64");
  CHECK(std::abs(cnn.at("loss").as_f64()[0] - cnn.at("f64.loss").as_f64()[0]) < 1e-5);
  CHECK(cnn.at("buffer.1.num_batches_tracked").as_i64() == std::vector<int64_t>{1});
  CHECK(cnn.metadata.count("architecture") == 1);

  const auto fwd = read_safetensors(dir + "/resnet_block.safetensors");
  CHECK(fwd.at("input").shape == std::vector<int64_t>{2, 16, 8, 8});
  CHECK(fwd.at("output.A").shape == std::vector<int64_t>{2, 32, 4, 4});
  CHECK(fwd.at("param.A.conv1.weight").shape == std::vector<int64_t>{32, 16, 3, 3});
  const auto bwd = read_safetensors(dir + "/resnet_block_grads.safetensors");
  CHECK(bwd.at("grad.param.B.conv2.weight").shape == std::vector<int64_t>{32, 32, 3, 3});
}

TEST_CASE("safetensors rejects corrupt files with one clear line naming the file") {
  TempDir tmp;
  const std::string path = tmp.file("bad.safetensors");
  const std::string one = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

  SECTION("valid baseline") {
    write_raw(path, one, 8);
    CHECK(read_safetensors(path).at("x").numel() == 2);
  }
  SECTION("missing file") {
    const std::string missing = tmp.file("missing.safetensors");
    const auto msg = read_error(missing);
    check_one_line_naming(msg, missing);
    CHECK_THAT(msg, Contains("cannot open"));
  }
  SECTION("truncated before the header length") {
    spit(path, {1, 0, 0});
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("truncated file"));
  }
  SECTION("header length larger than the file") {
    write_raw(path, one, 8, 1000);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("header length 1000 is larger than the file"));
  }
  SECTION("data truncated") {
    write_safetensors(path, {{"x", "F64", {4}, std::vector<double>(4, 1.0).data()}});
    auto bytes = slurp(path);
    bytes.resize(bytes.size() - 5);
    spit(path, bytes);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("'x'") && Contains("out of bounds") && Contains("truncated"));
  }
  SECTION("invalid JSON") {
    write_raw(path, "{\"x\": {\"dtype\": \"F32\",\n \"shape\": [2]", 8);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("invalid JSON header"));
  }
  SECTION("not JSON at all") {
    write_raw(path, "PK\x03\x04garbage", 0);
    CHECK_THAT(read_error(path), Contains("not a safetensors file"));
  }
  SECTION("offsets out of bounds") {
    write_raw(path, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("'x'") && Contains("[8, 16] out of bounds"));
  }
  SECTION("offsets overlapping") {
    write_raw(path,
              R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
              12);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("'b' overlaps tensor 'a'"));
  }
  SECTION("offsets not matching dtype and shape") {
    write_raw(path, R"({"x":{"dtype":"F64","shape":[2,3],"data_offsets":[0,24]}})", 24);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("'x'") && Contains("hold 24 bytes but F64 [2, 3] needs 6 x 8 bytes"));
  }
  SECTION("shape larger than the file") {
    write_raw(path, R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8);
    CHECK_THAT(read_error(path), Contains("'x'") && Contains("int64"));
  }
  SECTION("unknown dtype") {
    write_raw(path, R"({"x":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})", 8);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("'x'") && Contains("unknown dtype 'BF16'"));
  }
  SECTION("hole between tensors") {
    write_raw(path,
              R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
              12);
    CHECK_THAT(read_error(path), Contains("hole") && Contains("[4, 8)"));
  }
  SECTION("trailing bytes") {
    write_raw(path, one, 16);
    CHECK_THAT(read_error(path), Contains("8 trailing bytes"));
  }
  SECTION("duplicate tensor name") {
    write_raw(path,
              R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
              R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
              8);
    CHECK_THAT(read_error(path), Contains("duplicate entry 'x'"));
  }
  SECTION("malformed entries") {
    write_raw(path, R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
    CHECK_THAT(read_error(path), Contains("shape entries must be non-negative integers"));
    write_raw(path, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8);
    CHECK_THAT(read_error(path), Contains("end before they begin"));
    write_raw(path, R"({"x":{"dtype":"F32","shape":[2]}})", 8);
    CHECK_THAT(read_error(path), Contains("data_offsets must be"));
    write_raw(path, R"({"__metadata__":{"k":3}})", 0);
    CHECK_THAT(read_error(path), Contains("__metadata__ value of 'k' is not a string"));
    write_raw(path, R"([1,2])", 0);
    CHECK_THAT(read_error(path), Contains("not a safetensors file"));
  }
  SECTION("a newline in a tensor name stays on one line") {
    write_raw(path, "{\"bad\\nname\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}", 0);
    const auto msg = read_error(path);
    check_one_line_naming(msg, path);
    CHECK_THAT(msg, Contains("unknown dtype"));
  }
}
