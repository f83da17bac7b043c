#include "tide/ipc/curve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zmq.h>

#include "private_file.h"
#include "tide/engine/io/json_input.h"

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
  create_private_file(key.string(),
                      nlohmann::json{{"public", keys.public_key}, {"secret", keys.secret_key}}.dump(2) + "\n");
  std::ofstream(pub) << keys.public_key << "\n";
}

CurveKeyPair read_curve_keys(const std::string& path) {
  require_private_file(path, "a secret key");
  const auto j = parse_json_or_discard(read_all(path));
  if (!j.is_object() || !j.contains("public") || !j.contains("secret") || !j["public"].is_string() ||
      !j["secret"].is_string())
    throw std::runtime_error(fmt::format("'{}' is not a key file ({{\"public\": ..., \"secret\": ...}})", path));
  CurveKeyPair k{j["public"].get<std::string>(), j["secret"].get<std::string>()};
  if (!is_z85_key(k.public_key) || !is_z85_key(k.secret_key))
    throw std::runtime_error(fmt::format("'{}': the keys are not 40 Z85 characters each", path));
  return k;
}

void write_worker_link_keys(const WorkerLinkKeys& keys, const std::string& path) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  create_private_file(
      tmp,
      nlohmann::json{{"public", keys.own.public_key}, {"secret", keys.own.secret_key}, {"server", keys.server_public}}
              .dump(2) +
          "\n");
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
}

WorkerLinkKeys read_worker_link_keys(const std::string& path) {
  WorkerLinkKeys keys{read_curve_keys(path), ""};
  const auto j = parse_json_or_discard(read_all(path));
  keys.server_public = j.value("server", "");
  if (!is_z85_key(keys.server_public))
    throw std::runtime_error(fmt::format("'{}' names no server key (\"server\": 40 Z85 characters)", path));
  return keys;
}

std::string read_public_key(const std::string& key_or_path) {
  if (is_z85_key(key_or_path)) return key_or_path;
  const std::string text = read_all(key_or_path);
  const auto j = parse_json_or_discard(text);
  const std::string key = j.is_object() && j.contains("public") ? j["public"].get<std::string>() : trim(text);
  if (!is_z85_key(key)) throw std::runtime_error(fmt::format("'{}' holds no public key of 40 Z85 characters", key_or_path));
  return key;
}

bool is_loopback_endpoint(const std::string& bound) {
  if (bound.rfind("tcp://", 0) != 0) return bound.rfind("ipc://", 0) == 0 || bound.rfind("inproc://", 0) == 0;
  const std::string rest = bound.substr(6);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;  // not an address: never assume loopback
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

const char* role_name(Role r) { return r == Role::operator_ ? "operator" : "observer"; }

std::map<std::string, Role> read_allowlist(const std::string& path) {
  std::map<std::string, Role> out;
  std::map<std::string, int> first_line;
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
    // A key twice would leave its role to the order of the lines: which one was meant?
    if (const auto it = first_line.find(key); it != first_line.end())
      throw std::runtime_error(fmt::format("{}:{}: key {} is listed already on line {}; list each key once", path, n,
                                           key, it->second));
    first_line[key] = n;
    out[key] = role == "operator" ? Role::operator_ : Role::observer;
  }
  return out;
}

}  // namespace tide::ipc
