# tide's own CUDA kernels (engine/src/kernels/*.cu), built where LibTorch is a CUDA build.
# They include no LibTorch header, so nvcc compiles them in seconds; model/fused_ops.cpp
# calls them on CUDA tensors and takes LibTorch's ops everywhere else.
#
# The architectures: TIDE_CUDA_ARCHITECTURES or TORCH_CUDA_ARCH_LIST if given, else
# those of the GPUs present (nvidia-smi), else, on a machine without a GPU (CI), machine
# code for Ampere, Hopper and Blackwell plus PTX that later GPUs compile at load.
set(TIDE_CUDA_KERNELS OFF)
if(NOT TIDE_CAPI_ONLY AND EXISTS "${TIDE_TORCH_PREFIX}/lib/libtorch_cuda.so")
  set(TIDE_CUDA_KERNELS ON)
endif()
if(NOT TIDE_CUDA_KERNELS)
  return()
endif()

if(NOT CMAKE_CUDA_COMPILER)
  find_program(TIDE_NVCC_FOR_KERNELS nvcc PATHS "${CUDA_TOOLKIT_ROOT_DIR}/bin" /usr/local/cuda/bin NO_CACHE)
  set(CMAKE_CUDA_COMPILER "${TIDE_NVCC_FOR_KERNELS}")
endif()
if(NOT TIDE_CUDA_ARCHITECTURES)
  set(archs "")
  if(DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
    # "8.0;9.0+PTX" -> 80-real;90  (CMake's spelling)
    string(REPLACE " " ";" torch_list "$ENV{TORCH_CUDA_ARCH_LIST}")
    foreach(a IN LISTS torch_list)
      string(REGEX REPLACE "[^0-9+A-Za-z]" "" a "${a}")
      if(a MATCHES "^([0-9]+)\\+PTX$")
        list(APPEND archs "${CMAKE_MATCH_1}")
      elseif(a MATCHES "^[0-9]+[a-z]?$")
        list(APPEND archs "${a}-real")
      endif()
    endforeach()
  else()
    find_program(TIDE_NVIDIA_SMI nvidia-smi NO_CACHE)
    if(TIDE_NVIDIA_SMI)
      execute_process(COMMAND "${TIDE_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                      OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(rc EQUAL 0 AND caps)
        string(REPLACE "\n" ";" caps "${caps}")
        foreach(c IN LISTS caps)
          string(REPLACE "." "" c "${c}")
          string(STRIP "${c}" c)
          list(APPEND archs "${c}-real")
        endforeach()
        list(REMOVE_DUPLICATES archs)
      endif()
    endif()
  endif()
  if(NOT archs)
    set(archs 80-real 90-real 100-real 120)
  endif()
  set(TIDE_CUDA_ARCHITECTURES "${archs}" CACHE STRING "GPU architectures of tide's CUDA kernels")
endif()
if(CCACHE_PROGRAM)
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()
# The CUDA runtime LibTorch loads (shared), not a second static copy.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# CMake checks the compiler with CMAKE_CUDA_ARCHITECTURES; PyTorch's config (which runs
# first, and at a later configure sets it OFF, saying it ignores it) builds a CUDA probe
# with the cached value.
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "${TIDE_CUDA_ARCHITECTURES}")
endif()
enable_language(CUDA)
# PyTorch's config also appends -gencode flags for its own architecture list (which may
# name ones this nvcc no longer builds) to CMAKE_CUDA_FLAGS: the kernels' architectures
# are the target's CUDA_ARCHITECTURES alone.
string(REGEX REPLACE "-gencode[ ;]+arch=[^ ;]+" "" CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
message(STATUS "tide's CUDA kernels: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${TIDE_CUDA_ARCHITECTURES}")
