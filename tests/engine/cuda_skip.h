// Skipped where no CUDA device is present, unless TIDE_REQUIRE_CUDA=1 (make gpu-test):
// then a missing device fails the test (as tests/tools/cuda_probe.py does for the scripts).
#pragma once

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#define SKIP_WITHOUT_CUDA()                                                                              \
  do {                                                                                                   \
    if (!torch::cuda::is_available()) {                                                                  \
      const char* required = std::getenv("TIDE_REQUIRE_CUDA");                                           \
      if (required && std::string(required) == "1") FAIL() << "no CUDA device, and TIDE_REQUIRE_CUDA=1"; \
      GTEST_SKIP() << "skipped: no CUDA device";                                                         \
    }                                                                                                    \
  } while (0)
