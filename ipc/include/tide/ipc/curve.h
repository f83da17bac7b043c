// CURVE keys and the client allowlist of a daemon that serves beyond loopback.
//
// A key file (`tide keygen NAME` writes NAME.key, mode 0600) is JSON:
//   {"public": "<40 Z85 characters>", "secret": "<40 Z85 characters>"}
// and NAME.pub holds the public key alone. An allowlist has one client per line:
//   operator <public key> [name]
//   observer <public key> [name]
// (a line starting with '#' is a comment; Z85 keys may hold '#' themselves). Operators
// may change runs; observers may only read.
#pragma once

#include <map>
#include <string>

namespace tide::ipc {

struct CurveKeyPair {
  std::string public_key, secret_key;  // Z85
};

CurveKeyPair generate_curve_keys();
// Writes dir/NAME.key (0600) and dir/NAME.pub; throws when a file exists or cannot be written.
void write_curve_keys(const CurveKeyPair& keys, const std::string& dir, const std::string& name);
// Reads a key file; throws naming the file and what is wrong.
CurveKeyPair read_curve_keys(const std::string& path);
// The keys of a run's workers on the controller's TCP worker socket (a run under a
// scheduler: docs/multinode.md, "tided on Slurm"): the run's own pair and the socket's
// public key, in a key file with one more field, "server". Written owner-only and
// replaced at each start of the run, so that a key lives as long as one attempt.
struct WorkerLinkKeys {
  CurveKeyPair own;
  std::string server_public;
};
void write_worker_link_keys(const WorkerLinkKeys& keys, const std::string& path);
WorkerLinkKeys read_worker_link_keys(const std::string& path);
// A public key given as 40 Z85 characters or as a file holding them (a .pub or a .key).
std::string read_public_key(const std::string& key_or_path);

// Whether a bound endpoint as ZeroMQ reports it (ZMQ_LAST_ENDPOINT: "tcp://127.0.0.1:7450",
// "tcp://[::1]:7450", "tcp://0.0.0.0:7450") listens on loopback only: 127.0.0.0/8, ::1 or
// ::ffff:127.0.0.0/104. Non-TCP endpoints (ipc://, inproc://) are local by nature: true.
bool is_loopback_endpoint(const std::string& bound);

enum class Role { observer, operator_ };
const char* role_name(Role r);
// public key → role; throws naming the line of a malformed entry.
std::map<std::string, Role> read_allowlist(const std::string& path);

}  // namespace tide::ipc
