# Every third-party dependency, found once. All come from Debian 12 packages
# installed by scripts/setup.sh.
if(NOT TIDE_CAPI_ONLY)
  find_package(Torch REQUIRED)
endif()
find_package(Threads REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(cppzmq REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(LUAJIT REQUIRED IMPORTED_TARGET luajit)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# ICU's regex engine runs Hugging Face pre-tokenizer patterns (\p{L}, look-ahead,
# nested classes) exactly.
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc icu-i18n)
# jemalloc, tuned in tools/common/allocator_config.cpp: glibc malloc maps and unmaps
# every large activation each step (measured: 16-31% of CPU time in the kernel).
pkg_check_modules(JEMALLOC REQUIRED IMPORTED_TARGET jemalloc)

# Torch's imported target carries its include dirs and compile definitions
# (USE_DISTRIBUTED, USE_C10D_GLOO, the C++ ABI flag).
if(NOT TIDE_CAPI_ONLY)
  add_library(tide_torch INTERFACE)
  target_link_libraries(tide_torch INTERFACE ${TORCH_LIBRARIES})
  target_compile_options(tide_torch INTERFACE ${TORCH_CXX_FLAGS})
endif()
