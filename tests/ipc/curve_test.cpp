#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "tide/ipc/curve.h"
#include "temp_dir.h"

namespace tide::ipc {
namespace {
namespace fs = std::filesystem;

TEST(Curve, KeyFilesRoundTripAndAreNeverOverwritten) {
  testing::TempDir dir("tide-curve");
  const auto keys = generate_curve_keys();
  ASSERT_EQ(keys.public_key.size(), 40u);
  write_curve_keys(keys, dir.path.string(), "daemon");
  const auto back = read_curve_keys((dir.path / "daemon.key").string());
  EXPECT_EQ(back.public_key, keys.public_key);
  EXPECT_EQ(back.secret_key, keys.secret_key);
  struct stat st {};
  ASSERT_EQ(::stat((dir.path / "daemon.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(read_public_key((dir.path / "daemon.pub").string()), keys.public_key);
  EXPECT_EQ(read_public_key(keys.public_key), keys.public_key);
  EXPECT_THROW(write_curve_keys(generate_curve_keys(), dir.path.string(), "daemon"), std::runtime_error);
  std::ofstream(dir.path / "bad.key") << R"({"public": "short", "secret": "x"})";
  EXPECT_THROW(read_curve_keys((dir.path / "bad.key").string()), std::runtime_error);
}

TEST(Curve, AllowlistGivesRolesAndNamesABadLine) {
  testing::TempDir dir("tide-curve");
  fs::create_directories(dir.path);
  // Z85 keys may hold '#': it starts a comment only at the start of a line.
  const std::string hashy = "Z{/!p}$5ibcGRfN[%MEGBJ#G@j#kD$kC#gFJ(eEE";
  const auto other = generate_curve_keys().public_key;
  std::ofstream(dir.path / "ok.txt") << "# clients\n\noperator " << hashy << " alice\nobserver " << other << "\n";
  const auto allowed = read_allowlist((dir.path / "ok.txt").string());
  ASSERT_EQ(allowed.size(), 2u);
  EXPECT_EQ(allowed.at(hashy), Role::operator_);
  EXPECT_EQ(allowed.at(other), Role::observer);
  std::ofstream(dir.path / "bad.txt") << "operator " << other << "\nadmin " << hashy << "\n";
  try {
    read_allowlist((dir.path / "bad.txt").string());
    FAIL() << "accepted an unknown role";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt:2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tide::ipc
