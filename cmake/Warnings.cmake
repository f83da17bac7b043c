# tide_warnings: the warning set every first-party target uses.
add_library(tide_warnings INTERFACE)
target_compile_options(tide_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
# GCC 12 in C++20 mode warns about std::string's own memcpy in inlined appends and
# inserts (-Wrestrict false positives, GCC bug 105651, fixed in 13).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(tide_warnings INTERFACE -Wno-restrict)
endif()
if(TIDE_WERROR)
  target_compile_options(tide_warnings INTERFACE -Werror)
endif()
