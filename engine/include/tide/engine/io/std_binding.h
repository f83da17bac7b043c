#pragma once
// Where this process's calls into the C++ standard library land (cmake/Linking.cmake).

namespace tide {

// Throws std::runtime_error when tide's calls to std::filesystem resolve to a copy inside
// another library than libstdc++ (PyTorch's wheels export one; PyTorch 2.11's crashed
// every checkpoint prune), naming that library and the LD_PRELOAD that works round it. A
// run checks it before it starts, where it would otherwise die at its first prune. A
// program that holds its own copy (a static libstdc++) passes.
void check_std_library_binding();

}  // namespace tide
