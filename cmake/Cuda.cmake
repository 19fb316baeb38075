# CUDA is optional: the project builds and tests on machines without nvcc. When nvcc is present the
# CUDA backend is built for Hopper only (sm_90a: wgmma and setmaxnreg need the "a" target).
set(OSPREY_HAVE_CUDA OFF)
if(OSPREY_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag (the targets inherit C++20 from CXX_STANDARD).
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(OSPREY_HAVE_CUDA ON)
    set(OSPREY_CUDA_FLAGS -gencode=arch=compute_90a,code=sm_90a -lineinfo --expt-relaxed-constexpr
        -Xcompiler=-Wall -Werror=all-warnings)
    message(STATUS "osprey: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_90a)")
  else()
    message(STATUS "osprey: nvcc not found, CUDA backend OFF")
  endif()
endif()

# osprey_cuda_library(NAME SOURCES ... DEPS ...): like osprey_library, with the sm_90a flags.
function(osprey_cuda_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${OSPREY_CUDA_FLAGS}>
    $<$<COMPILE_LANGUAGE:CXX>:${OSPREY_CXX_WARNINGS}>)
  set_target_properties(${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  target_link_libraries(${name} PUBLIC CUDA::cudart ${ARG_DEPS})
endfunction()
