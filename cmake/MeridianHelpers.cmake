# The two helpers every folder uses: one library target per layer, one test target per
# test file. Layers may only link layers below them; tests/layering_test checks includes.

set(MERIDIAN_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wcast-align -Woverloaded-virtual -Wconversion -Wno-sign-conversion
    -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough)

function(meridian_target_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${MERIDIAN_WARNINGS}>)
  if(MERIDIAN_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(MERIDIAN_SANITIZE)
    # C/C++ only: nvcc does not take -fsanitize.
    target_compile_options(${target} PRIVATE
                           $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# meridian_add_library(<layer> SOURCES ... [DEPS layer...] [PRIVATE_DEPS ...])
# Creates target meridian_<layer> (alias meridian::<layer>).
function(meridian_add_library layer)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target meridian_${layer})
  add_library(${target} STATIC ${ARG_SOURCES})
  add_library(meridian::${layer} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  meridian_target_defaults(${target})
  set_property(GLOBAL APPEND PROPERTY MERIDIAN_LAYERS ${layer})
endfunction()

# meridian_add_executable(<name> SOURCES ... DEPS ...)
function(meridian_add_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  meridian_target_defaults(${name})
endfunction()

# meridian_add_test(<name> SOURCES ... DEPS ... LABELS ... [TIMEOUT s] [ARGS ...])
# One GoogleTest binary, registered with ctest under its labels (ARGS go to the binary,
# e.g. a --gtest_filter that leaves the slow cases to a second registration).
function(meridian_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS;ARGS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  meridian_target_defaults(${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  add_test(NAME ${name} COMMAND ${name} --gtest_color=no ${ARG_ARGS})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "MERIDIAN_SECRET=meridian-test-secret;MERIDIAN_METRICS_ADDR=0")
endfunction()
