# Small helpers so that every folder declares its target the same way.
#
#   pd_library(NAME pd_x SRCS a.cc b.cc k.cu DEPS pd_common absl::status)
#   pd_test(NAME x_test SRCS x_test.cc DEPS pd_x [LABELS slow])
#   pd_binary(NAME pdctl SRCS main.cc DEPS ...)

function(pd_library)
  cmake_parse_arguments(PD "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(${PD_NAME} STATIC ${PD_SRCS})
  target_link_libraries(${PD_NAME} PUBLIC ${PD_DEPS})
  set_target_properties(${PD_NAME} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

function(pd_binary)
  cmake_parse_arguments(PD "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${PD_NAME} ${PD_SRCS})
  target_link_libraries(${PD_NAME} PRIVATE ${PD_DEPS})
  set_target_properties(${PD_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
endfunction()

function(pd_test)
  # SERIAL: ctest runs these cases alone (they time what the machine does, e.g. "within 100 ms").
  cmake_parse_arguments(PD "SERIAL" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${PD_NAME} ${PD_SRCS})
  target_link_libraries(${PD_NAME} PRIVATE ${PD_DEPS} pd_test_main)
  # The test files themselves build at -O1 with line tables only (-g1) in the default
  # RelWithDebInfo build: what they exercise is the libraries, built as configured, and this
  # halves their compile time (scheduler_test.cc 16.2 -> 7.9 s), most of a clean build's. Neither
  # level changes a floating-point result (no fast-math; no FMA contraction without -mfma), and
  # speed is measured in bench/, never here.
  target_compile_options(${PD_NAME} PRIVATE $<$<CONFIG:RelWithDebInfo>:-O1 -g1>)
  set_target_properties(${PD_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  # One label per test: "unit" unless LABELS names another ("slow", "integration"). A list would
  # not survive gtest_discover_tests' generated script, which writes "LABELS unit slow" (the
  # property LABELS = unit, plus a stray "slow").
  set(label unit)
  if(PD_LABELS)
    list(GET PD_LABELS 0 label)
  endif()
  set(serial FALSE)
  if(PD_SERIAL)
    set(serial TRUE)
  endif()
  gtest_discover_tests(${PD_NAME}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    PROPERTIES LABELS ${label} RUN_SERIAL ${serial}
    DISCOVERY_TIMEOUT 60)
endfunction()
