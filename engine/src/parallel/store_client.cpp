#include "tide/engine/parallel/store_client.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "tide/engine/parallel/comm.h"

namespace tide {

struct StoreClient::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreClient::StoreClient(const LaunchEnv& env, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: cannot reach the rendezvous store at {}:{}: {}", env.rank, env.master_addr,
                                env.master_port, e.what()));
  }
}

StoreClient::~StoreClient() = default;

void StoreClient::set(const std::string& key, const std::string& value) {
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::optional<std::string> StoreClient::get_if_set(const std::string& key) {
  if (!impl_->store->check({key})) return std::nullopt;
  const auto raw = impl_->store->get(key);
  return std::string(raw.begin(), raw.end());
}

}  // namespace tide
