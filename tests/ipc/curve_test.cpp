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
  // A secret key others can read is refused, as ssh refuses such a private key.
  ::chmod((dir.path / "daemon.key").c_str(), 0640);
  try {
    read_curve_keys((dir.path / "daemon.key").string());
    FAIL() << "accepted a key file of mode 0640";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("readable by others (mode 0640)"), std::string::npos) << e.what();
  }
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
  // A key listed twice would take whichever role came last: refused, naming both lines.
  std::ofstream(dir.path / "twice.txt") << "operator " << other << "\n# later\nobserver " << other << "\n";
  try {
    read_allowlist((dir.path / "twice.txt").string());
    FAIL() << "accepted a key listed twice";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("twice.txt:3: key " + other + " is listed already on line 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(Curve, LoopbackEndpointsAreThoseZeroMqBoundOnLoopback) {
  for (const char* ep : {"tcp://127.0.0.1:7450", "tcp://127.3.4.5:1", "tcp://[::1]:7450", "tcp://[::ffff:127.0.0.1]:9",
                         "ipc:///tmp/x.sock", "inproc://x"})
    EXPECT_TRUE(is_loopback_endpoint(ep)) << ep;
  for (const char* ep : {"tcp://0.0.0.0:7450", "tcp://[::]:7450", "tcp://10.0.0.5:7450", "tcp://128.0.0.1:1",
                         "tcp://[::ffff:10.0.0.1]:9", "tcp://localhost:7450", "tcp://lo:7450", "tcp://garbage",
                         "udp://127.0.0.1:1"})
    EXPECT_FALSE(is_loopback_endpoint(ep)) << ep;
}

}  // namespace
}  // namespace tide::ipc
