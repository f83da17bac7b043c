#include "tide/ipc/curve.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zmq.h>

namespace tide::ipc {
namespace fs = std::filesystem;

namespace {
bool is_z85_key(const std::string& s) {
  if (s.size() != 40) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, s.c_str()) != nullptr;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot read '{}'", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}
}  // namespace

CurveKeyPair generate_curve_keys() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0)
    throw std::runtime_error(fmt::format("cannot make a CURVE key pair: {}", zmq_strerror(zmq_errno())));
  return {pub, sec};
}

void write_curve_keys(const CurveKeyPair& keys, const std::string& dir, const std::string& name) {
  fs::create_directories(dir);
  const fs::path key = fs::path(dir) / (name + ".key"), pub = fs::path(dir) / (name + ".pub");
  for (const auto& p : {key, pub})
    if (fs::exists(p)) throw std::runtime_error(fmt::format("'{}' exists; keys are never overwritten", p.string()));
  {
    std::ofstream out(key);
    out << nlohmann::json{{"public", keys.public_key}, {"secret", keys.secret_key}}.dump(2) << "\n";
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", key.string()));
  }
  ::chmod(key.c_str(), 0600);
  std::ofstream(pub) << keys.public_key << "\n";
}

CurveKeyPair read_curve_keys(const std::string& path) {
  const auto j = nlohmann::json::parse(read_all(path), nullptr, false);
  if (!j.is_object() || !j.contains("public") || !j.contains("secret") || !j["public"].is_string() ||
      !j["secret"].is_string())
    throw std::runtime_error(fmt::format("'{}' is not a key file ({{\"public\": ..., \"secret\": ...}})", path));
  CurveKeyPair k{j["public"].get<std::string>(), j["secret"].get<std::string>()};
  if (!is_z85_key(k.public_key) || !is_z85_key(k.secret_key))
    throw std::runtime_error(fmt::format("'{}': the keys are not 40 Z85 characters each", path));
  return k;
}

std::string read_public_key(const std::string& key_or_path) {
  if (is_z85_key(key_or_path)) return key_or_path;
  const std::string text = read_all(key_or_path);
  const auto j = nlohmann::json::parse(text, nullptr, false);
  const std::string key = j.is_object() && j.contains("public") ? j["public"].get<std::string>() : trim(text);
  if (!is_z85_key(key)) throw std::runtime_error(fmt::format("'{}' holds no public key of 40 Z85 characters", key_or_path));
  return key;
}

const char* role_name(Role r) { return r == Role::operator_ ? "operator" : "observer"; }

std::map<std::string, Role> read_allowlist(const std::string& path) {
  std::map<std::string, Role> out;
  std::istringstream in(read_all(path));
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    // Z85 keys may hold '#': only a line that starts with it is a comment.
    std::istringstream fields(line);
    std::string role, key;
    if (!(fields >> role) || role[0] == '#') continue;
    fields >> key;
    if ((role != "operator" && role != "observer") || !is_z85_key(key))
      throw std::runtime_error(fmt::format("{}:{}: want 'operator|observer <40-character Z85 public key> [name]'", path, n));
    out[key] = role == "operator" ? Role::operator_ : Role::observer;
  }
  return out;
}

}  // namespace tide::ipc
