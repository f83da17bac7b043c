#pragma once
// Where this process's calls into the C++ standard library land (cmake/Linking.cmake).
#include <string>

namespace tide {

// Throws std::runtime_error when std::filesystem's functions resolve to a copy inside
// another library than libstdc++ (PyTorch's wheels export one; PyTorch 2.11's crashed
// every checkpoint prune), naming that library; a run checks it before it starts, where
// it would otherwise die at its first prune. Passes where the lookup cannot tell.
void check_std_library_binding();

// The file that defines `symbol` for a lookup in this process's global scope, as the
// dynamic linker resolves tide's own references; empty where none does.
std::string library_defining(const char* symbol);

}  // namespace tide
