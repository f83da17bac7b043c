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
# On an H200 host (Ubuntu 24.04, g++ 13.3, PyTorch 2.11; 2026-11-27) the binaries built
# with a plain -lstdc++ here needed libtorch.so first, where the same build on Debian 12
# needs libstdc++ first; why was not found in that lease (scripts/gpu_host_checks.sh's
# binding part keeps the link line, toolchain and build variables for the next). The
# shared object is now named by its full path, inside --no-as-needed, which no search
# order can change, at the very front of the linker flags, before anything an LDFLAGS of
# the environment (one suspect) puts there.
# Any compiler that links against libstdc++ and answers -print-file-name (GCC, Clang,
# and the drivers built on them) gets it; a compiler that does not answer gets -lstdc++
# where it is GCC or Clang.
if(NOT MSVC)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE stdcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${stdcxx}" AND EXISTS "${stdcxx}")
    get_filename_component(stdcxx "${stdcxx}" REALPATH)
  elseif(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    set(stdcxx "-lstdc++")
  else()
    set(stdcxx "")
  endif()
  if(stdcxx)
    message(STATUS "libstdc++ linked first: ${stdcxx}")
    # At the front of the linker flags, ahead of what the environment's LDFLAGS put there
    # (CMake starts CMAKE_*_LINKER_FLAGS from it), which add_link_options would follow.
    set(first "-Wl,--push-state,--no-as-needed ${stdcxx} -Wl,--pop-state")
    # (A normal variable over the cached one: each configure starts again from the cache.)
    foreach(kind EXE SHARED)
      set(CMAKE_${kind}_LINKER_FLAGS "${first} ${CMAKE_${kind}_LINKER_FLAGS}")
    endforeach()
  else()
    message(WARNING "${CMAKE_CXX_COMPILER_ID} names no libstdc++.so: the order of the binaries' libraries is "
                    "the linker's (build.symbol_binding checks it)")
  endif()
endif()
