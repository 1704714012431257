# A bounded libFuzzer run from the committed seeds (copied: libFuzzer adds to
# its corpus folder). Fails on any crash, leak-free sanitizer report or
# timeout; prints the executions and the time.
#
# SECONDS is fuzzing time on one core: on a machine with N cores (at most 4)
# it runs as N jobs of SECONDS / N each, side by side on the one corpus
# (libFuzzer's -jobs), so the same number of inputs in 1/N of the time. A job
# that finds a problem fails the run (libFuzzer's exit code), with its log.
# LibTorch's exit-time registries are not leaks of ours.
set(ENV{ASAN_OPTIONS} "detect_leaks=0:detect_odr_violation=0")
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:halt_on_error=1")
file(REMOVE_RECURSE "${WORK}" "${WORK}-jobs")
file(COPY "${SEEDS}/" DESTINATION "${WORK}")
file(MAKE_DIRECTORY "${WORK}-jobs")
cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
if(cores LESS 1)
  set(cores 1)
elseif(cores GREATER 4)
  set(cores 4)
endif()
math(EXPR per_job "(${SECONDS} + ${cores} - 1) / ${cores}")
execute_process(COMMAND "${FUZZER}" -jobs=${cores} -workers=${cores} -max_total_time=${per_job}
                        -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 "${WORK}"
  WORKING_DIRECTORY "${WORK}-jobs" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(execs 0)
set(logs "")
foreach(job RANGE 1 ${cores})
  math(EXPR index "${job} - 1")
  set(log "(no log)")
  if(EXISTS "${WORK}-jobs/fuzz-${index}.log")
    file(READ "${WORK}-jobs/fuzz-${index}.log" log)
  endif()
  string(APPEND logs "--- job ${index}:\n${log}\n")
  string(REGEX MATCH "stat::number_of_executed_units: *([0-9]+)" found "${log}")
  if(found)
    math(EXPR execs "${execs} + ${CMAKE_MATCH_1}")
  endif()
endforeach()
message(STATUS "fuzzed ${cores} x ${per_job} s: ${execs} inputs executed")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the fuzzer found a problem (exit ${rc}):\n${err}\n${logs}")
endif()
