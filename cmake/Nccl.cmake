# NCCL for the CUDA backend's multi-GPU collectives (comm/nccl.h). Found, in this order, under
#   OSPREY_NCCL_ROOT (cache variable or environment): include/nccl.h and lib/libnccl.so[.2]
#   the CUDA toolkit (the NVIDIA toolkit images ship NCCL beside cuBLAS)
#   /usr (Debian's libnccl-dev) and /usr/local
#   the test venv's pip package nvidia-nccl-cu13 (<venv>/lib/python3.*/site-packages/nvidia/nccl),
#     which scripts/deps.sh installs when none of the above has it.
# Defines the imported target osprey::nccl and OSPREY_HAVE_NCCL. NCCL is linked by its soname
# (libnccl.so.2), so a binary built against one copy runs with the machine's own (the H200 has one
# installed system-wide); the build tree's rpath also names the directory found here.
set(OSPREY_HAVE_NCCL OFF)
if(OSPREY_HAVE_CUDA)
  set(OSPREY_NCCL_ROOT "$ENV{OSPREY_NCCL_ROOT}" CACHE PATH "NCCL installation (include/, lib/); empty: search")
  set(_osprey_nccl_hints "")
  if(OSPREY_NCCL_ROOT)
    list(APPEND _osprey_nccl_hints ${OSPREY_NCCL_ROOT})
  endif()
  list(APPEND _osprey_nccl_hints ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} /usr /usr/local)
  if(OSPREY_PYTHON)
    get_filename_component(_osprey_venv "${OSPREY_PYTHON}" DIRECTORY)  # <venv>/bin
    get_filename_component(_osprey_venv "${_osprey_venv}" DIRECTORY)
    file(GLOB _osprey_pip_nccl "${_osprey_venv}/lib/python3*/site-packages/nvidia/nccl")
    list(APPEND _osprey_nccl_hints ${_osprey_pip_nccl})
  endif()
  find_path(OSPREY_NCCL_INCLUDE_DIR nccl.h HINTS ${_osprey_nccl_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  # The pip package ships only libnccl.so.2 (no development symlink): name it explicitly.
  find_library(OSPREY_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_osprey_nccl_hints}
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu NO_DEFAULT_PATH)
  if(OSPREY_NCCL_INCLUDE_DIR AND OSPREY_NCCL_LIBRARY)
    file(STRINGS "${OSPREY_NCCL_INCLUDE_DIR}/nccl.h" _osprey_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
           OSPREY_NCCL_VERSION "${_osprey_nccl_version}")
    add_library(osprey::nccl SHARED IMPORTED)
    set_target_properties(osprey::nccl PROPERTIES
      IMPORTED_LOCATION "${OSPREY_NCCL_LIBRARY}"
      IMPORTED_SONAME "libnccl.so.2"
      INTERFACE_INCLUDE_DIRECTORIES "${OSPREY_NCCL_INCLUDE_DIR}")
    set(OSPREY_HAVE_NCCL ON)
    message(STATUS "osprey: NCCL ${OSPREY_NCCL_VERSION} (${OSPREY_NCCL_LIBRARY}, ${OSPREY_NCCL_INCLUDE_DIR})")
  else()
    message(FATAL_ERROR "osprey: the CUDA backend needs NCCL and none was found (run scripts/deps.sh, which "
                        "installs the pip package nvidia-nccl-cu13 into the venv, or set OSPREY_NCCL_ROOT)")
  endif()
endif()
