# Installs the build into a temporary prefix, moves that prefix elsewhere (so
# nothing can depend on where it was installed, nor on the build tree), and
# runs the installed torchamp-train --help, torchamp-gpt on its installed
# corpus and an installed example from there.
#   cmake -DBUILD=<build dir> -DWORK=<scratch dir> -P check_install.cmake
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD}" --prefix "${WORK}/stage"
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
file(RENAME "${WORK}/stage" "${WORK}/moved")
set(prefix "${WORK}/moved")

# No installed binary may look for libraries in the build tree.
file(GLOB_RECURSE binaries "${prefix}/bin/*" "${prefix}/libexec/*" "${prefix}/lib*/*.so*")
foreach(bin IN LISTS binaries)
  if(IS_SYMLINK "${bin}")
    continue()
  endif()
  execute_process(COMMAND readelf -d "${bin}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf -d ${bin} failed")
  endif()
  string(FIND "${dyn}" "${BUILD}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "${bin} has the build tree in its RUNPATH:\n${dyn}")
  endif()
endforeach()

# Run with a clean library path: only RUNPATHs can find the libraries.
set(run ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH)
execute_process(COMMAND ${run} "${prefix}/bin/torchamp-train" --help
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "--epochs")
  message(FATAL_ERROR "installed torchamp-train --help: exit ${rc}\n${out}\n${err}")
endif()
execute_process(COMMAND ${run} "${prefix}/libexec/torchamp/examples/quickstart"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "clipped gradient norm")
  message(FATAL_ERROR "installed quickstart: exit ${rc}\n${out}\n${err}")
endif()
# The installed torchamp-gpt reads the corpus installed beside it without
# --data (never the build tree's, which a user deletes).
if(EXISTS "${BUILD}/apps/torchamp-gpt/kjv.txt")
  if(NOT EXISTS "${prefix}/share/torchamp/kjv.txt")
    message(FATAL_ERROR "the build has torchamp-gpt's corpus but did not install it")
  endif()
  execute_process(COMMAND ${run} "${prefix}/bin/torchamp-gpt" --size tiny --steps 2 --modes fp32
                          --eval-every 2 --eval-batches 1 --sample 0 --out "${WORK}/gpt"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "from ${prefix}/share/torchamp/kjv.txt")
    message(FATAL_ERROR "installed torchamp-gpt without --data: exit ${rc}\n${out}\n${err}")
  endif()
endif()
message(STATUS "installed torchamp-train, torchamp-gpt and quickstart run from ${prefix}")
