#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "tide/engine/io/safetensors.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

// Two tensors and a metadata entry, as the tests below write them.
const std::vector<float> kA = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
const std::vector<int64_t> kB = {42, -7};
WrittenFile write_a_and_b(const fs::path& path) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.add("layer.a", "F32", {2, 3}, kA.data(), kA.size() * 4);
  w.add("b", "I64", {2}, kB.data(), kB.size() * 8);
  return w.write(path.string());
}

TEST(Safetensors, WritesTheDocumentedLayoutAndReadsItBack) {
  const auto path = fs::temp_directory_path() / "tide_st_test.safetensors";
  write_a_and_b(path);

  // Bytes on disk: u64 LE header length, JSON header, data 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  EXPECT_EQ((8 + header_len) % 8, 0u);
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["layer.a"]["dtype"], "F32");
  EXPECT_EQ(j["layer.a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(fs::file_size(path), 8 + header_len + 6 * 4 + 2 * 8);

  const SafetensorsReader r(path.string());
  const auto* ea = r.find("layer.a");
  ASSERT_NE(ea, nullptr);
  std::vector<float> read_a(kA.size());
  std::memcpy(read_a.data(), r.data(*ea), 24);
  EXPECT_EQ(read_a, kA);
  const auto* eb = r.find("b");
  ASSERT_NE(eb, nullptr);
  EXPECT_EQ(std::memcmp(r.data(*eb), kB.data(), 16), 0);
  fs::remove(path);
}

TEST(Safetensors, RejectsTruncatedFilesByName) {
  const auto path = fs::temp_directory_path() / "tide_st_bad.safetensors";
  const std::vector<float> a(100, 1.0f);
  SafetensorsWriter w;
  w.add("big", "F32", {100}, a.data(), 400);
  w.write(path.string());
  fs::resize_file(path, fs::file_size(path) - 10);
  try {
    SafetensorsReader r(path.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'big'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(Safetensors, RejectsShapeSizeMismatchOnWrite) {
  const float x = 0;
  SafetensorsWriter w;
  EXPECT_THROW(w.add("x", "F32", {2}, &x, 4), std::invalid_argument);
}

// Streamed tensor by tensor (a sharded run's final weights), a file has the bytes the
// all-in-memory writer gives; out of order or unfinished, nothing is left behind.
TEST(Safetensors, AStreamWritesTheSameBytesAndRefusesWhatBreaksTheHeader) {
  const auto dir = fs::temp_directory_path() / "tide_st_stream";
  fs::create_directories(dir);
  const WrittenFile whole = write_a_and_b(dir / "whole.safetensors");

  const std::vector<SafetensorsEntry> entries = {{"layer.a", "F32", {2, 3}, 0, 0}, {"b", "I64", {2}, 0, 0}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  SafetensorsStream stream((dir / "streamed.safetensors").string(), entries, metadata);
  stream.write("layer.a", kA.data(), kA.size() * 4);
  stream.write("b", kB.data(), kB.size() * 8);
  const WrittenFile streamed = stream.commit();
  EXPECT_EQ(streamed.bytes, whole.bytes);
  EXPECT_EQ(streamed.xxh3, whole.xxh3);
  EXPECT_EQ(xxh3_of_file((dir / "streamed.safetensors").string()), whole.xxh3);

  {
    SafetensorsStream s((dir / "bad.safetensors").string(), entries, metadata);
    EXPECT_THROW(s.write("b", kB.data(), kB.size() * 8), std::logic_error);  // "layer.a" comes first
    EXPECT_THROW(s.write("layer.a", kA.data(), 4), std::invalid_argument);   // not its size
    s.write("layer.a", kA.data(), kA.size() * 4);
    EXPECT_THROW(s.commit(), std::logic_error);  // "b" unwritten
  }
  EXPECT_FALSE(fs::exists(dir / "bad.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "bad.safetensors.tmp"));
  fs::remove_all(dir);
}

// A file with this header and `data_bytes` zero bytes of data.
std::string crafted(const std::string& name, const nlohmann::json& header, size_t data_bytes) {
  const auto path = (fs::temp_directory_path() / name).string();
  const std::string text = header.dump();
  const uint64_t len = text.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text << std::string(data_bytes, '\0');
  return path;
}

std::string error_reading(const std::string& path) {
  try {
    SafetensorsReader r(path);
  } catch (const std::exception& e) {
    fs::remove(path);
    return e.what();
  }
  fs::remove(path);
  return "";
}

TEST(Safetensors, RefusesHeadersThatDoNotTileTheData) {
  using nlohmann::json;
  auto entry = [](uint64_t b, uint64_t e) {
    return json{{"dtype", "F32"}, {"shape", {(e - b) / 4}}, {"data_offsets", {b, e}}};
  };
  std::string e = error_reading(crafted("tide_st_overlap.safetensors", {{"a", entry(0, 16)}, {"b", entry(8, 24)}}, 24));
  EXPECT_NE(e.find("'b' overlaps"), std::string::npos) << e;
  e = error_reading(crafted("tide_st_hole.safetensors", {{"a", entry(0, 8)}, {"b", entry(16, 24)}}, 24));
  EXPECT_NE(e.find("hole before tensor 'b'"), std::string::npos) << e;
  e = error_reading(crafted("tide_st_trailing.safetensors", {{"a", entry(0, 8)}}, 12));
  EXPECT_NE(e.find("4 bytes after the last tensor"), std::string::npos) << e;
  // 2^32 x 2^32 x 7 elements: the byte count overflows 64 bits (and would wrap to a small one).
  e = error_reading(crafted("tide_st_overflow.safetensors",
                            {{"a", {{"dtype", "F32"}, {"shape", {4294967296LL, 4294967296LL, 7}}, {"data_offsets", {0, 0}}}}},
                            0));
  EXPECT_NE(e.find("overflows 64 bits"), std::string::npos) << e;
  e = error_reading(crafted("tide_st_dtype.safetensors",
                            {{"a", {{"dtype", "Q4"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}}, 1));
  EXPECT_NE(e.find("tensor 'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("tide_st_dtype.safetensors"), std::string::npos) << e;
  e = error_reading(crafted("tide_st_meta.safetensors", {{"__metadata__", json::array()}}, 0));
  EXPECT_NE(e.find("__metadata__"), std::string::npos) << e;
  // Numbers that are not whole: nlohmann's conversion of 2e27 to an integer was
  // undefined behaviour (found by tests/fuzz under UBSan).
  e = error_reading(crafted("tide_st_float.safetensors",
                            {{"a", {{"dtype", "F32"}, {"shape", {2e27}}, {"data_offsets", {0, 8}}}}}, 8));
  EXPECT_NE(e.find("tensor 'a' shape holds 2e+27, not a whole number below 2^63"), std::string::npos) << e;
  e = error_reading(crafted("tide_st_negative.safetensors",
                            {{"a", {{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}}}, 8));
  EXPECT_NE(e.find("tensor 'a' shape holds -2"), std::string::npos) << e;
  // A well-formed file of the same kind reads.
  EXPECT_EQ(error_reading(crafted("tide_st_fine.safetensors", {{"a", entry(0, 8)}, {"b", entry(8, 24)}}, 24)), "");
}

}  // namespace
}  // namespace tide
