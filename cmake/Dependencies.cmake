# Every third-party dependency, found once. LibTorch comes from PyTorch 2.x (see
# cmake/FindLibTorch.cmake); the rest from Debian 12 packages installed by scripts/setup.sh.
if(NOT TIDE_CAPI_ONLY)
  include(cmake/FindLibTorch.cmake)
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
# tided's HTTP server (dashboard, /metrics) and the Prometheus text format it serves.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# Only prometheus-cpp's core (metric families, the text serializer), through its .pc file:
# its CMake package config also requires civetweb, CURL and zlib for the pull and push
# components tide does not use, which a host building with carried libraries lacks.
pkg_check_modules(PROMETHEUS REQUIRED IMPORTED_TARGET prometheus-cpp-core)
# ICU's regex engine runs Hugging Face pre-tokenizer patterns (\p{L}, look-ahead,
# nested classes) exactly.
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc icu-i18n)
# jemalloc, tuned in tools/common/allocator_config.cpp: glibc malloc maps and unmaps
# every large activation each step (measured: 16-31% of CPU time in the kernel).
pkg_check_modules(JEMALLOC REQUIRED IMPORTED_TARGET jemalloc)

# Torch's imported target carries its include dirs and compile definitions
# (USE_DISTRIBUTED, USE_C10D_GLOO, USE_C10D_NCCL on a CUDA build).
if(NOT TIDE_CAPI_ONLY)
  add_library(tide_torch INTERFACE)
  target_link_libraries(tide_torch INTERFACE ${TORCH_LIBRARIES})
  target_compile_options(tide_torch INTERFACE ${TORCH_CXX_FLAGS})
  # PyTorch's wheels carry fmt 12 in their include root, and Debian's spdlog (built on
  # fmt 9) does not compile against it. A folder holding only a link to the fmt tide links
  # (libfmt.so.9) goes before torch's include root, so every <fmt/...> is that one;
  # torch's own headers compile against it as well (fmt's inline namespace, v9 or v12,
  # keeps their symbols apart).
  if(EXISTS "${TIDE_TORCH_PREFIX}/include/fmt")
    get_target_property(fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
    set(fmt_first "${CMAKE_BINARY_DIR}/fmt-before-torch")
    file(MAKE_DIRECTORY "${fmt_first}")
    file(CREATE_LINK "${fmt_include}/fmt" "${fmt_first}/fmt" SYMBOLIC)
    target_include_directories(tide_torch SYSTEM BEFORE INTERFACE "${fmt_first}")
  endif()
endif()

# The Python the tests and benchmarks run: the project's virtual environment (pyzmq,
# transformers, tokenizers, torch; scripts/setup.sh), else python3.
if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(TIDE_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python")
else()
  find_program(TIDE_PYTHON python3 REQUIRED)
endif()
