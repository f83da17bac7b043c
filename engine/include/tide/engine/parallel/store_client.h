// A connection of its own to the job's rendezvous store (the c10d TCPStore rank 0
// hosts), for threads other than the one that built the process groups: the
// heartbeat, the checkpoint writer. One client is not shared between threads.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "tide/engine/parallel/launch_env.h"

namespace tide {

class StoreClient {
 public:
  // `timeout` bounds every operation (connecting included); throws CommError on failure.
  StoreClient(const LaunchEnv& env, std::chrono::milliseconds timeout);
  ~StoreClient();

  void set(const std::string& key, const std::string& value);
  // The value when the key exists now, else nullopt.
  std::optional<std::string> get_if_set(const std::string& key);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide
