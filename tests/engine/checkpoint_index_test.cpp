// The checkpoint directory as the controller and `tide ckpt` read it: which step
// directories count, and what verification says about a damaged one.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/engine/io/safetensors.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

class CheckpointIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    root_ = fs::temp_directory_path() / ("tide_ckpt_index_" + test + "_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  static void touch(const fs::path& p, const std::string& text = "") { std::ofstream(p) << text; }

  // A committed step directory with one small rank file and its manifest.
  fs::path committed(int64_t step, int format = kCheckpointFormat) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
    const fs::path dir = root_ / name;
    fs::create_directories(dir);
    const std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f};
    SafetensorsWriter w;
    w.set_metadata("tide.pieces", "[]");
    w.add("p|param|0", "F32", {4}, values.data(), values.size() * 4);
    const WrittenFile f = w.write((dir / "rank-00000.safetensors").string());
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(f.xxh3));
    const nlohmann::json manifest = {{"format", format},
                                     {"step", step},
                                     {"files", {{"rank-00000.safetensors", {{"bytes", f.bytes}, {"xxh3", hash}}}}}};
    touch(dir / "manifest.json", manifest.dump());
    touch(dir / "COMMITTED", std::to_string(step) + "\n");
    return dir;
  }

  // A committed step directory whose rank file holds `tensors` (name, F32 values) and
  // lists `pieces` in its tide.pieces, with the manifest's true size and hash.
  fs::path with_pieces(int64_t step, const nlohmann::json& pieces,
                       const std::vector<std::pair<std::string, int>>& tensors) {
    const fs::path dir = committed(step);
    std::vector<std::vector<float>> values;
    SafetensorsWriter w;
    w.set_metadata("tide.pieces", pieces.dump());
    for (const auto& [name, n] : tensors) {
      values.emplace_back(static_cast<size_t>(n), 1.0f);
      w.add(name, "F32", {n}, values.back().data(), values.back().size() * 4);
    }
    const WrittenFile f = w.write((dir / "rank-00000.safetensors").string());
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(f.xxh3));
    nlohmann::json manifest = read_manifest(dir.string());
    manifest["files"] = {{"rank-00000.safetensors", {{"bytes", f.bytes}, {"xxh3", hash}}}};
    touch(dir / "manifest.json", manifest.dump());
    return dir;
  }

  static nlohmann::json piece(const std::string& tensor, nlohmann::json global, nlohmann::json tp, nlohmann::json local,
                              nlohmann::json range) {
    return {{"tensor", tensor},         {"param", "w"},
            {"kind", "param"},          {"global_shape", std::move(global)},
            {"tp", std::move(tp)},      {"local_shape", std::move(local)},
            {"range", std::move(range)}};
  }

  fs::path root_;
};

TEST_F(CheckpointIndex, ListsOnlyCommittedStepDirectoriesOldestFirst) {
  committed(10);
  committed(5);
  fs::create_directories(root_ / "step-00000007");  // no COMMITTED: a save that did not finish
  fs::create_directories(root_ / "step-00000012.tmp");
  touch(root_ / "step-00000012.tmp" / "COMMITTED");
  fs::create_directories(root_ / "step-123");  // not a step directory's name
  touch(root_ / "step-123" / "COMMITTED");
  fs::create_directories(root_ / "step-0000001x");
  touch(root_ / "step-0000001x" / "COMMITTED");
  touch(root_ / "step-00000020");  // a file, not a directory
  touch(root_ / "latest", "step-00000010\n");

  const auto all = list_checkpoints(root_.string());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 5);
  EXPECT_EQ(all[1].step, 10);
  EXPECT_EQ(fs::path(all[1].path).filename(), "step-00000010");
  EXPECT_TRUE(list_checkpoints((root_ / "missing").string()).empty());
}

TEST_F(CheckpointIndex, VerificationNamesWhatIsWrong) {
  const fs::path dir = committed(5);
  EXPECT_TRUE(verify_checkpoint(dir.string()).empty());
  EXPECT_EQ(read_manifest(dir.string())["step"], 5);

  // One byte flipped: the hash differs, and the file is named.
  const fs::path file = dir / "rank-00000.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  auto problems = verify_checkpoint(dir.string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("rank-00000.safetensors: XXH3"), std::string::npos) << problems[0];

  // Shorter: the size differs; gone: missing.
  fs::resize_file(file, fs::file_size(file) - 1);
  problems = verify_checkpoint(dir.string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("bytes, the manifest says"), std::string::npos) << problems[0];
  fs::remove(file);
  problems = verify_checkpoint(dir.string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("rank-00000.safetensors: missing"), std::string::npos) << problems[0];

  // No marker, and a manifest of another format.
  fs::remove(dir / "COMMITTED");
  EXPECT_NE(verify_checkpoint(dir.string())[0].find("no COMMITTED marker"), std::string::npos);
  const fs::path newer = committed(6, kCheckpointFormat + 1);
  problems = verify_checkpoint(newer.string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("format 2"), std::string::npos) << problems[0];
  EXPECT_THROW(read_manifest(newer.string()), std::runtime_error);
}

TEST_F(CheckpointIndex, VerificationReportsEveryByteItHashes) {
  // A file of more than one 64 MiB chunk: its hash, taken a chunk at a time, must be the
  // one the writer took in a single pass.
  const fs::path dir = with_pieces(7, nlohmann::json::array(), {{"big", (65 << 20) / 4 + 3}});
  const auto bytes = static_cast<int64_t>(fs::file_size(dir / "rank-00000.safetensors"));
  std::vector<std::tuple<std::string, int64_t, int64_t>> heard;
  const auto listen = [&](const std::string& stage, int64_t done, int64_t total) {
    heard.emplace_back(stage, done, total);
  };
  EXPECT_TRUE(verify_checkpoint(dir.string(), listen).empty());
  using Heard = std::tuple<std::string, int64_t, int64_t>;
  EXPECT_EQ(heard, (std::vector<Heard>{
                       {"verifying", 0, bytes}, {"verifying", int64_t{64} << 20, bytes}, {"verifying", bytes, bytes}}));

  // A missing file counts as read: the report still ends at the manifest's total.
  fs::remove(dir / "rank-00000.safetensors");
  heard.clear();
  EXPECT_EQ(verify_checkpoint(dir.string(), listen).size(), 1u);
  EXPECT_EQ(heard, (std::vector<Heard>{{"verifying", 0, bytes}, {"verifying", bytes, bytes}}));
}

TEST_F(CheckpointIndex, ManifestNamesCannotLeaveTheDirectory) {
  const fs::path dir = committed(7);
  // A manifest naming a file outside: refused before anything is hashed, by name.
  const std::string outside = "../../../../../../etc/passwd";
  nlohmann::json manifest = read_manifest(dir.string());
  manifest["files"] = {{outside, {{"bytes", fs::file_size("/etc/passwd")}, {"xxh3", "0"}}}};
  touch(dir / "manifest.json", manifest.dump());
  auto problems = verify_checkpoint(dir.string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("leaves the checkpoint directory"), std::string::npos) << problems[0];
  EXPECT_THROW(read_manifest(dir.string()), std::runtime_error);
  // An entry of the wrong types is named, not a JSON type error.
  manifest["files"] = {{"rank-00000.safetensors", {{"bytes", "many"}, {"xxh3", 5}}}};
  touch(dir / "manifest.json", manifest.dump());
  problems = verify_checkpoint(dir.string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("needs 'bytes' (an integer)"), std::string::npos) << problems[0];
}

TEST_F(CheckpointIndex, AFileWithTheRightHashButABadHeaderIsUnusable) {
  // Written wrong, hashed as written: the bytes check out, the file does not read.
  const fs::path dir = committed(8);
  const fs::path file = dir / "rank-00000.safetensors";
  const std::string header = R"({"p|param|0":{"dtype":"F32","shape":[4],"data_offsets":[0,99]}})";
  const uint64_t len = header.size();
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << std::string(16, '\0');
  }
  nlohmann::json manifest = read_manifest(dir.string());
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(xxh3_of_file(file.string())));
  manifest["files"] = {{"rank-00000.safetensors", {{"bytes", fs::file_size(file)}, {"xxh3", hash}}}};
  touch(dir / "manifest.json", manifest.dump());
  const auto problems = verify_checkpoint(dir.string());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("lies outside the data section"), std::string::npos) << problems[0];
}

TEST_F(CheckpointIndex, PieceListsAreCheckedBeforeAResumeTrustsThem) {
  // Each file hashes true: what is wrong was written so (a writer's fault), and the
  // resume would have read past a list, filled a tensor from a wrong range, or left
  // part of a parameter at zero.
  using nlohmann::json;
  const json whole = {{"dim", -1}, {"first", 0}, {"length", 0}, {"valid", 0}};
  const std::vector<std::pair<std::string, int>> two = {{"w|param|0", 4}, {"w|param|4", 2}};
  // json::array: a braced list of one object would be that object.
  const auto problem = [&](int64_t step, const json& pieces, const std::vector<std::pair<std::string, int>>& tensors) {
    const auto problems = verify_checkpoint(with_pieces(step, pieces, tensors).string());
    return problems.empty() ? std::string() : problems.front();
  };
  EXPECT_EQ(problem(1,
                    json::array({piece("w|param|0", {2, 3}, whole, {2, 3}, {0, 4}),
                                 piece("w|param|4", {2, 3}, whole, {2, 3}, {4, 6})}),
                    two),
            "");
  std::string e = problem(2, json::array({piece("w|param|0", {2, 3}, whole, {2, 3}, {0})}), two);
  EXPECT_NE(e.find("tide.pieces entry 0 (piece 'w|param|0') has no range [begin, end]"), std::string::npos) << e;
  e = problem(3,
              json::array({piece("w|param|0", {2, 3}, whole, {2, 3}, {0, 4}),
                           piece("w|param|4", {2, 3}, whole, {2, 3}, {6, 8})}),
              two);
  EXPECT_NE(e.find("has range [6, 8] outside its slice's 6 elements"), std::string::npos) << e;
  e = problem(4, json::array({piece("w|param|0", {2e27, 3}, whole, {2e27, 3}, {0, 4})}), two);
  EXPECT_NE(e.find("has a dimension in 'global_shape' 2e+27, not an integer"), std::string::npos) << e;
  e = problem(5, json::array({piece("w|param|0", {2, 3}, whole, {2, 3}, {0, 3})}), two);
  EXPECT_NE(e.find("is a F32 tensor of shape [4], not the 3 F32 values of its range"), std::string::npos) << e;
  // A hole inside the slice, and a tensor-parallel slice missing.
  e = problem(6, json::array({piece("w|param|4", {2, 3}, whole, {2, 3}, {4, 6})}), two);
  EXPECT_NE(e.find("the pieces of param w have elements [4, 6) of the slice at 0 where [0, ...) comes next"),
            std::string::npos)
      << e;
  const json first_half = {{"dim", 0}, {"first", 0}, {"length", 1}, {"valid", 2}};
  e = problem(7, json::array({piece("w|param|0", {2, 4}, first_half, {1, 4}, {0, 4})}), two);
  EXPECT_NE(e.find("the pieces of param w end at 1 along tp.dim, short of 2"), std::string::npos) << e;
}

}  // namespace
}  // namespace tide
