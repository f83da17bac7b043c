# LibTorch from PyTorch 2.x (>= 2.5), the only LibTorch tide builds against.
#
# Where it comes from, first match wins:
#   -DTIDE_LIBTORCH=<dir>   a LibTorch archive (or any prefix holding share/cmake/Torch)
#   -DTorch_DIR=<dir>       the folder holding TorchConfig.cmake
#   the `torch` package of the project's virtual environment (.venv, made by scripts/setup.sh)
#   the `torch` package of python3 on PATH (a GPU host's installed PyTorch)
#
# Debian's libtorch-dev (1.13) is not supported: see docs/building.md. Where it is
# installed as well, TorchConfig's find_library() would pick its libc10.so/libtorch.so
# from the system paths before the chosen prefix's, and a binary would mix two
# LibTorch versions; Caffe2's config and the libraries are therefore found in the prefix only.

if(TIDE_LIBTORCH)
  set(Torch_DIR "${TIDE_LIBTORCH}/share/cmake/Torch" CACHE PATH "TorchConfig.cmake of the LibTorch tide builds against" FORCE)
elseif(NOT Torch_DIR)
  foreach(python "${PROJECT_SOURCE_DIR}/.venv/bin/python" python3)
    execute_process(
      COMMAND ${python} -c "import os, torch.utils; print(os.path.join(torch.utils.cmake_prefix_path, 'Torch'))"
      OUTPUT_VARIABLE dir RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND EXISTS "${dir}/TorchConfig.cmake")
      set(Torch_DIR "${dir}" CACHE PATH "TorchConfig.cmake of the LibTorch tide builds against")
      message(STATUS "LibTorch: the torch package of ${python}")
      break()
    endif()
  endforeach()
endif()
if(NOT Torch_DIR OR NOT EXISTS "${Torch_DIR}/TorchConfig.cmake")
  message(FATAL_ERROR "No LibTorch 2.x found (Torch_DIR='${Torch_DIR}'). Run scripts/setup.sh (it installs torch "
                      "into .venv), or pass -DTIDE_LIBTORCH=<unpacked LibTorch archive>.")
endif()

get_filename_component(TIDE_TORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
set(Caffe2_DIR "${TIDE_TORCH_PREFIX}/share/cmake/Caffe2" CACHE PATH "Caffe2Config.cmake of the chosen LibTorch" FORCE)
foreach(lib c10 torch)
  set(var ${lib}_LIBRARY)
  if(lib STREQUAL "torch")
    set(var TORCH_LIBRARY)
  endif()
  find_library(${var} ${lib} PATHS "${TIDE_TORCH_PREFIX}/lib" NO_DEFAULT_PATH)
  if(NOT ${var})
    message(FATAL_ERROR "LibTorch at ${TIDE_TORCH_PREFIX} has no lib${lib}.so")
  endif()
endforeach()

# A CUDA build of LibTorch needs the CUDA toolkit (Caffe2's config looks for it with CMake's
# FindCUDA): the toolkit of nvcc on PATH, else /usr/local/cuda. The GPU architectures are
# detected by that config from the GPUs present (TORCH_CUDA_ARCH_LIST overrides).
if(EXISTS "${TIDE_TORCH_PREFIX}/lib/libtorch_cuda.so" AND NOT CUDA_TOOLKIT_ROOT_DIR)
  find_program(TIDE_NVCC nvcc PATHS /usr/local/cuda/bin)
  set(toolkit "")
  if(EXISTS /usr/local/cuda/bin/nvcc)
    set(toolkit /usr/local/cuda)
  elseif(TIDE_NVCC)
    get_filename_component(nvcc_real "${TIDE_NVCC}" REALPATH)
    get_filename_component(toolkit "${nvcc_real}/../.." ABSOLUTE)
  endif()
  if(NOT toolkit)
    message(FATAL_ERROR "LibTorch at ${TIDE_TORCH_PREFIX} is a CUDA build: install the CUDA toolkit (nvcc) "
                        "or pass -DCUDA_TOOLKIT_ROOT_DIR=<dir>")
  endif()
  set(CUDA_TOOLKIT_ROOT_DIR "${toolkit}" CACHE PATH "The CUDA toolkit LibTorch's CUDA build compiles with")
  set(CUDAToolkit_ROOT "${toolkit}")
endif()
# Caffe2's config enables CMake's CUDA language, which looks for nvcc on PATH only; CUDA's
# installers leave /usr/local/cuda/bin off PATH.
if(CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
   AND EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc")
  set(CMAKE_CUDA_COMPILER "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc" CACHE FILEPATH "nvcc, from the CUDA toolkit")
endif()
# Caffe2's config links NVRTC from the toolkit; a minimal toolkit has none, while a CUDA
# wheel's nvidia-* packages carry the one LibTorch loads at run time.
if(EXISTS "${TIDE_TORCH_PREFIX}/lib/libtorch_cuda.so" AND (NOT CUDA_NVRTC_LIB OR CUDA_NVRTC_LIB MATCHES "NOTFOUND"))
  file(GLOB wheel_nvrtc "${TIDE_TORCH_PREFIX}/../nvidia/*/lib/libnvrtc.so.[0-9]*")
  if(wheel_nvrtc AND NOT EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/lib64/libnvrtc.so")
    list(GET wheel_nvrtc 0 wheel_nvrtc)
    set(CUDA_NVRTC_LIB "${wheel_nvrtc}" CACHE FILEPATH "NVRTC, from the CUDA wheel" FORCE)
  endif()
endif()

find_package(Torch 2.5 REQUIRED CONFIG)
message(STATUS "LibTorch ${Torch_VERSION} at ${TIDE_TORCH_PREFIX}")

# A CUDA wheel loads the CUDA libraries of its nvidia-* packages (site-packages/nvidia/*),
# which carry their headers too. A toolkit may lack some that LibTorch's headers include
# (a minimal CUDA 13 install has no cusparse.h): those come from the wheel's packages,
# after the toolkit's own.
file(GLOB TIDE_WHEEL_CUDA_INCLUDES LIST_DIRECTORIES true "${TIDE_TORCH_PREFIX}/../nvidia/*/include")
if(TIDE_WHEEL_CUDA_INCLUDES AND EXISTS "${TIDE_TORCH_PREFIX}/lib/libtorch_cuda.so")
  set_property(TARGET torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${TIDE_WHEEL_CUDA_INCLUDES})
  message(STATUS "CUDA headers also from the wheel: ${TIDE_WHEEL_CUDA_INCLUDES}")
endif()

# The C++ standard LibTorch's headers were built for (20 from PyTorch 2.10 on), unless
# one is given with -DCMAKE_CXX_STANDARD.
get_target_property(TIDE_TORCH_CXX_STANDARD torch CXX_STANDARD)
if(NOT TIDE_TORCH_CXX_STANDARD)
  set(TIDE_TORCH_CXX_STANDARD 17)
endif()

# PyTorch's mkl.cmake adds ${MKL_ROOT}/lib... link directories even where MKL is linked
# into libtorch_cpu and MKL_ROOT is empty (pytorch/pytorch#73008): -L/lib and three
# folders that do not exist.
if(TARGET caffe2::mkl AND NOT MKL_ROOT)
  set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES "")
endif()
