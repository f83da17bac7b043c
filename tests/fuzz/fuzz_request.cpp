// A frame on the daemon's command socket: parse_request answers it or refuses it with a
// protocol error, and the reply to it can always be written.
#include <cstdint>
#include <exception>
#include <string_view>

#include "fuzz_check.h"
#include "tide/ipc/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tide::ipc;
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  nlohmann::json id;
  try {
    const Request req = parse_request(frame, id);
    if (!req.body.is_object()) tide::fuzz::fault("a request's body is not an object");
    reply_ok(req.id, req.body);
  } catch (const ProtocolError& e) {
    reply_error(id, e.code(), e.what());
  } catch (const std::exception& e) {
    tide::fuzz::fault(std::string("parse_request threw something other than a protocol error: ") + e.what());
  }
  return 0;
}
