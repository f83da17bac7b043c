# tide_warnings: the warning set every first-party target uses.
add_library(tide_warnings INTERFACE)
target_compile_options(tide_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
# GCC 12 in C++20 mode warns about std::string's own memcpy in inlined appends and
# inserts (-Wrestrict false positives, GCC bug 105651, fixed in 13).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(tide_warnings INTERFACE -Wno-restrict)
endif()
# Errors only under the compiler CI holds the code to, GCC 12 (Debian 12). A later GCC's new
# flow-based warnings also fire in LibTorch's and the standard library's inlined code (GCC
# 13.3 on Ubuntu 24.04: -Warray-bounds in std::vector<bool>, reached from
# torch::autograd::Function), which would stop a user's build on code that is not tide's.
if(TIDE_WERROR)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(tide_warnings INTERFACE -Werror)
  else()
    message(STATUS "Warnings are not errors with ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}: "
                   "TIDE_WERROR holds GCC 12, CI's compiler, to them")
  endif()
endif()
