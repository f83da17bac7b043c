// The handles the C API has given out and not yet closed. A call looks its handle up
// here first, so a closed or foreign pointer is answered with TIDE_ERR_INVALID_HANDLE
// instead of being dereferenced, and the shared_ptr it gets keeps the object alive
// until the call returns even if another thread closes the handle meanwhile.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "status.h"

namespace tide::capi {

template <class T>
class Handles {
 public:
  T* add(std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    T* key = object.get();
    live_[key] = std::move(object);
    return key;
  }
  // Throws Failure: NULL, or not live.
  std::shared_ptr<T> get(const T* handle, const char* name) const {
    require(handle, name);
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(const_cast<T*>(handle));
    if (it == live_.end())
      throw Failure(TIDE_ERR_INVALID_HANDLE, fmt::format("{} {} is closed or was not made by this library", name,
                                                         static_cast<const void*>(handle)));
    return it->second;
  }
  // The object, now owned by the caller; null if it was not live.
  std::shared_ptr<T> take(const T* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(const_cast<T*>(handle));
    if (it == live_.end()) return nullptr;
    auto object = std::move(it->second);
    live_.erase(it);
    return object;
  }

 private:
  mutable std::mutex mu_;
  std::map<T*, std::shared_ptr<T>> live_;
};

}  // namespace tide::capi
