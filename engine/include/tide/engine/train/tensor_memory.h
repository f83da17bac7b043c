// Host tensor memory, counted: the CPU's counterpart of the CUDA caching allocator's
// statistics (PyTorch's memory_allocated / max_memory_allocated). Resident-set figures
// cannot say what tensors hold (the allocator keeps freed pages, libraries have their
// own), and the planner's predictions are checked against this count.
#pragma once

#include <cstdint>

namespace tide {

// Wraps LibTorch's CPU allocator with one that counts the bytes of live host tensors and
// their high-water mark. Idempotent; tensors allocated before it are not counted.
void count_host_tensor_memory();

int64_t host_tensor_bytes();       // live now (0 until counting starts)
int64_t peak_host_tensor_bytes();  // the most live at once since counting started or the last reset
void reset_peak_host_tensor_bytes();

}  // namespace tide
