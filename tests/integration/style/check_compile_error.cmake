# A misuse is a clear compile error: compiles PROBE with COMPILER
# (-fsyntax-only), expects it to fail with at most MAX_ERRORS errors, one of
# them containing EXPECT. INCLUDES: |-separated; STD: the C++ standard
# (LibTorch 2.14 and later need 20).
string(REPLACE "|" ";" INCLUDES "${INCLUDES}")
set(args "")
foreach(dir IN LISTS INCLUDES)
  list(APPEND args "-I${dir}")
endforeach()
if(NOT STD)
  set(STD 17)
endif()
execute_process(COMMAND "${COMPILER}" -std=c++${STD} -fsyntax-only ${args} "${PROBE}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "the probe compiled; it must not")
endif()
# (Counted by marker: an error's text may hold a ";", CMake's list separator.)
string(REGEX MATCHALL ": error:" errors "${err}")
list(LENGTH errors count)
string(FIND "${err}" "${EXPECT}" at)
if(at EQUAL -1 OR count GREATER MAX_ERRORS)
  message(FATAL_ERROR "expected at most ${MAX_ERRORS} errors, one saying '${EXPECT}'; "
                      "got ${count}:\n${err}")
endif()
message(STATUS "${COMPILER_ID}: ${count} error(s), saying: ${EXPECT}")
