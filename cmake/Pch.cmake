# tide_reuse_torch_pch(target): compile `target` with tide_engine's precompiled
# LibTorch (engine/src/pch.h). GCC refuses a PCH built with other PIC/PIE settings, and CMake
# gives executables -fPIE where libraries get -fPIC, so executables are compiled with
# -fPIC (valid in a PIE executable) instead.
function(tide_reuse_torch_pch target)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
  target_precompile_headers(${target} REUSE_FROM tide_engine)
endfunction()
