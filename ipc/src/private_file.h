// Files that hold secrets (CURVE secret keys, a run's worker keys, the dashboard token):
// created owner-only, so that the secret is never readable by others, not even for a
// moment, and refused, as ssh refuses private keys, when others can read them.
#pragma once

#include <string>

namespace tide::ipc {

// Creates `path` with mode 0600 and writes `text`; throws when it exists already or
// cannot be written.
void create_private_file(const std::string& path, const std::string& text);
// Throws, naming `what` the file holds, when `path` exists and others may read it.
void require_private_file(const std::string& path, const std::string& what);

}  // namespace tide::ipc
