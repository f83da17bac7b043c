# libstdc++ first in every binary's library lookup order.
#
# PyTorch's wheels are built with a toolchain that links parts of a newer libstdc++ into
# them, and export those copies: libtorch_cpu.so defines std::filesystem (remove_all,
# directory_iterator, ...), libc10.so basic_stringbuf::str() and more. The dynamic linker
# binds each undefined symbol to the first library in the lookup order that defines it,
# and that order follows each binary's DT_NEEDED list, where LibTorch comes before the
# libstdc++ that g++ appends last. So tide's own calls went to LibTorch's copies: on
# PyTorch 2.11 std::filesystem::remove_all jumped to address 0 and every checkpoint prune
# crashed. Naming libstdc++ before anything else makes it the first definition found for
# every std symbol of tide's. tests/tools/check_symbol_binding.py (ctest
# build.symbol_binding) asks the dynamic linker where each one lands and fails on any
# that leaves libstdc++.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  add_link_options("SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")
endif()
