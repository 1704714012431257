# Exact resume: a run checkpointed at step K and resumed in a new process ends
# with the same parameters, scale and trackers, bit for bit, as the
# uninterrupted run (K = 4: overflows are injected before and after it, and
# the overflow tracker is non-zero when it is saved).
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/ckpt")
foreach(args
    "train;${WORK}/full.bin"
    "train;${WORK}/unused.bin;--stop-at;4;--save;${WORK}/ckpt"
    "train;${WORK}/resumed.bin;--resume;${WORK}/ckpt")
  execute_process(COMMAND "${TOOL}" ${args} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "checkpoint_tool ${args} failed: ${rc}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${WORK}/full.bin" "${WORK}/resumed.bin"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the resumed run differs from the uninterrupted one")
endif()
message(STATUS "resumed run identical to the uninterrupted run")
