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
# that leaves libstdc++; the engine checks it again when a run starts
# (engine/src/io/std_binding.cpp).
#
# The shared object is named by its full path, inside --no-as-needed: on an H200 host
# (Ubuntu 24.04, g++ 13.3, PyTorch 2.11) a plain -lstdc++ there did not put libstdc++
# first (its binaries needed libtorch.so first), where the same line does on Debian 12.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE stdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  get_filename_component(stdcxx "${stdcxx}" REALPATH)
  if(NOT IS_ABSOLUTE "${stdcxx}" OR NOT EXISTS "${stdcxx}")
    set(stdcxx "-lstdc++")  # a compiler that does not say: its search path decides
  endif()
  message(STATUS "libstdc++ linked first: ${stdcxx}")
  add_link_options("SHELL:-Wl,--push-state,--no-as-needed ${stdcxx} -Wl,--pop-state")
endif()
