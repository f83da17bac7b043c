# tide_unity_build(target...): compile the targets' sources eight to a translation unit. A
# TU that reads LibTorch or nlohmann-json pays for it whatever it holds (the precompiled
# header's 458 MB loaded, the same templates instantiated and emitted again): on a 2-core
# EPYC the engine library took 434 CPU-seconds as 56 TUs and 145 as 7, the whole build 1,711
# CPU-seconds before and 839 after (docs/building.md). A change to one source recompiles
# its batch (about 20 s). Sources with options of their own (COMPILE_OPTIONS, ...) stay apart, as
# CMake keeps them. Names at namespace scope of one source meet the others' of its batch: a
# file-local name (anonymous namespace, static) must not repeat in the target, or a batch
# fails to compile or, worse, a call resolves to another file's overload. scripts/lint.sh
# gives clang-tidy each source of a batch with the batch's command.
# -DTIDE_UNITY_BUILD=OFF compiles one source a TU.
option(TIDE_UNITY_BUILD "Compile the heaviest targets eight sources to a translation unit" ON)
function(tide_unity_build)
  if(TIDE_UNITY_BUILD)
    set_target_properties(${ARGN} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    # GCC takes a batch's sources for headers, and a class of one with a member of a type
    # from its anonymous namespace (alerts.cpp's Impl) for one that headers would give
    # each TU a different layout of: in one TU it is not.
    foreach(target ${ARGN})
      target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-Wno-subobject-linkage>)
    endforeach()
  endif()
endfunction()
