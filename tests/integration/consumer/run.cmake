# Configures, builds and runs tests/integration/consumer against torchamp found with
# find_package(torchamp CONFIG REQUIRED): MODE=build-tree points torchamp_DIR
# at the build directory; MODE=install-prefix installs there first and uses
# CMAKE_PREFIX_PATH, as a user of an installed package would.
# MODE=other-torch installs too, with another LibTorch (OTHER_TORCH_PREFIX, of
# another version) first on the search path: the package config still picks
# the LibTorch torchamp was built with; and with Torch_DIR naming the other
# one, configuring fails and says what to do.
file(REMOVE_RECURSE "${WORK}")
set(find_args "")
# Where LibTorch's CMake configs are (a wheel's: Torch and the Caffe2 config it
# loads), '|'-separated, so a LibTorch elsewhere on the system is not mixed in.
string(REPLACE "|" ";" prefix_path "${TORCH_PREFIX_PATH}")
# A CUDA LibTorch's config needs the toolkit that this build was configured with
# (also where another LibTorch comes first: torchamp's config loads its own).
if(CUDA_ROOT)
  list(APPEND find_args "-DCUDA_TOOLKIT_ROOT_DIR=${CUDA_ROOT}" "-DCUDAToolkit_ROOT=${CUDA_ROOT}"
       "-DCMAKE_CUDA_COMPILER=${CUDA_ROOT}/bin/nvcc")
endif()
if(MODE STREQUAL "build-tree")
  list(APPEND find_args "-Dtorchamp_DIR=${TORCHAMP_BUILD}")
else()
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${TORCHAMP_BUILD}" --prefix "${WORK}/prefix"
    OUTPUT_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install failed")
  endif()
  if(MODE STREQUAL "other-torch")
    # Only the install prefix, after the other LibTorch: no Torch_DIR.
    set(prefix_path "${OTHER_TORCH_PREFIX};${WORK}/prefix")
    unset(Torch_DIR)
    file(GLOB other_dir LIST_DIRECTORIES true "${OTHER_TORCH_PREFIX}/share/cmake/Torch"
         "${OTHER_TORCH_PREFIX}/lib/*/cmake/Torch")
    if(NOT other_dir)
      message(FATAL_ERROR "no TorchConfig.cmake under ${OTHER_TORCH_PREFIX}")
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/wrong" -G "${GENERATOR}"
      "-DTorch_DIR=${other_dir}" "-DCMAKE_PREFIX_PATH=${prefix_path}" ${find_args}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(REGEX REPLACE "[ \n]+" " " err "${err}")
    if(rc EQUAL 0 OR NOT err MATCHES "torchamp was built against LibTorch ${TORCH_VERSION} .*found LibTorch [0-9.]+ .*-DTorch_DIR=")
      message(FATAL_ERROR "Torch_DIR=${other_dir}: expected a configure error naming both "
                          "LibTorches and -DTorch_DIR, got ${rc}:\n${out}${err}")
    endif()
    string(REGEX REPLACE ".*(torchamp was built against)" "\\1" err "${err}")
    message(STATUS "Torch_DIR of another LibTorch, as expected:${err}")
    # A program that calls find_package(Torch) before torchamp's finds the
    # other LibTorch first: the error says to swap the two lines.
    execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/torch-first" -G "${GENERATOR}"
      -DCONSUMER_FIND_TORCH=before "-DCMAKE_PREFIX_PATH=${prefix_path}" ${find_args}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(REGEX REPLACE "[ \n]+" " " err "${err}")
    if(rc EQUAL 0 OR NOT err MATCHES "found LibTorch [0-9.]+ .*call find_package\\(torchamp CONFIG REQUIRED\\) before find_package\\(Torch\\).*-DTorch_DIR=")
      message(FATAL_ERROR "find_package(Torch) first: expected a configure error saying to call "
                          "find_package(torchamp) first, got ${rc}:\n${out}${err}")
    endif()
    string(REGEX REPLACE ".*(To fix:)" "\\1" err "${err}")
    message(STATUS "find_package(Torch) first, as expected: ${err}")
    # The fix works: torchamp's first, the program's own find_package(Torch)
    # after it (the build below) finds torchamp's LibTorch.
    list(APPEND find_args -DCONSUMER_FIND_TORCH=after)
  else()
    list(PREPEND prefix_path "${WORK}/prefix")
  endif()
endif()
if(LAUNCHER)
  list(APPEND find_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()
if(Torch_DIR)
  list(APPEND find_args "-DTorch_DIR=${Torch_DIR}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix_path}"
  ${find_args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure failed")
endif()
if(MODE STREQUAL "other-torch")
  file(STRINGS "${WORK}/build/CMakeCache.txt" found REGEX "^Torch_DIR:")
  string(REGEX REPLACE "^[^=]*=" "" found "${found}")
  file(REAL_PATH "${found}" found)
  file(REAL_PATH "${TORCHAMP_TORCH_DIR}" want)
  if(NOT found STREQUAL want)
    message(FATAL_ERROR "found Torch in ${found}, not torchamp's ${want}")
  endif()
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK}/build" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "build failed")
endif()
# CHECK_NO_GLOO: the program's compile read no Gloo header (the compiler's
# dependency files list every header it read).
if(CHECK_NO_GLOO)
  file(GLOB_RECURSE depfiles "${WORK}/build/CMakeFiles/*.o.d")
  if(NOT depfiles)
    message(FATAL_ERROR "no dependency files under ${WORK}/build to check")
  endif()
  foreach(depfile IN LISTS depfiles)
    file(STRINGS "${depfile}" gloo REGEX "/gloo/")
    if(gloo)
      message(FATAL_ERROR "${depfile}: the program read Gloo headers:\n${gloo}")
    endif()
  endforeach()
  message(STATUS "no Gloo header read (${depfiles})")
endif()
# RUN_WITH ('|'-separated): a command that runs the program, given its path
# and RUN_ARGS (tests/integration/consumer_ddp: a Python script that starts it under torchrun).
string(REPLACE "|" ";" run_with "${RUN_WITH}")
execute_process(COMMAND ${run_with} "${WORK}/build/consumer" ${RUN_ARGS} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer exited with ${rc}")
endif()
