// The checkpoint directory as the controller and `tide ckpt` read it: which step
// directories count, and what verification says about a damaged one.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace tide
