# Project-wide helpers: warning flags and one function per target kind, so folders stay short.

set(OSPREY_CXX_WARNINGS -Wall -Wextra -Wno-unused-parameter)
if(OSPREY_WERROR)
  list(APPEND OSPREY_CXX_WARNINGS -Werror)
endif()

# osprey_library(NAME SOURCES ... DEPS ...): a static library rooted at src/ for includes.
function(osprey_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${OSPREY_CXX_WARNINGS}>)
  if(ARG_DEPS)
    target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  endif()
endfunction()

# osprey_test(NAME SOURCES ... DEPS ... LABEL cpu|gpu [TIMEOUT s]): a GoogleTest binary under CTest.
function(osprey_test name)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_LABEL)
    set(ARG_LABEL cpu)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${OSPREY_CXX_WARNINGS}>)
  target_compile_definitions(${name} PRIVATE
    OSPREY_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    OSPREY_SHARED_DIR="${OSPREY_SHARED_DIR}"
    OSPREY_BINARY_DIR="${PROJECT_BINARY_DIR}"
    OSPREY_PYTHON="${OSPREY_PYTHON}")
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name}
    PROPERTIES LABELS ${ARG_LABEL} TIMEOUT ${ARG_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()

# Where the shared conformance data and the o200k rank file live (tests and CI only).
set(OSPREY_SHARED_DIR "${PROJECT_SOURCE_DIR}/../shared" CACHE PATH "shared/ folder with conformance data")

# The Python interpreter (a venv made by scripts/deps.sh) that differential tests use to run the
# reference implementations (tiktoken, openai-harmony). Tests skip themselves when it is empty.
set(OSPREY_PYTHON "" CACHE FILEPATH "python with the test requirements (scripts/requirements-test.txt)")
# The interpreter the Python-driven tests run under: OSPREY_PYTHON, else any python3 (empty when none).
set(OSPREY_TEST_PYTHON "${OSPREY_PYTHON}")
if(NOT OSPREY_TEST_PYTHON)
  find_package(Python3 COMPONENTS Interpreter)
  set(OSPREY_TEST_PYTHON "${Python3_EXECUTABLE}")
endif()
