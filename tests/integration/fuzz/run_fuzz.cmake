# A bounded libFuzzer run from the committed seeds (copied: libFuzzer adds to
# its corpus folder). Fails on any crash, leak-free sanitizer report or
# timeout; prints the executions and the time.
# LibTorch's exit-time registries are not leaks of ours.
set(ENV{ASAN_OPTIONS} "detect_leaks=0:detect_odr_violation=0")
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:halt_on_error=1")
file(REMOVE_RECURSE "${WORK}")
file(COPY "${SEEDS}/" DESTINATION "${WORK}")
execute_process(COMMAND "${FUZZER}" -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=4096
                        -print_final_stats=1 "${WORK}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" execs "${err}")
message(STATUS "fuzzed ${SECONDS} s: ${execs}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the fuzzer found a problem (exit ${rc}):\n${err}")
endif()
