# Configures, builds and runs tests/consumer against torchamp found with
# find_package(torchamp CONFIG REQUIRED): MODE=build-tree points torchamp_DIR
# at the build directory; MODE=install-prefix installs there first and uses
# CMAKE_PREFIX_PATH, as a user of an installed package would.
file(REMOVE_RECURSE "${WORK}")
set(find_args "")
# Where LibTorch's CMake configs are (a wheel's: Torch and the Caffe2 config it
# loads), '|'-separated, so a LibTorch elsewhere on the system is not mixed in.
string(REPLACE "|" ";" prefix_path "${TORCH_PREFIX_PATH}")
if(MODE STREQUAL "build-tree")
  list(APPEND find_args "-Dtorchamp_DIR=${TORCHAMP_BUILD}")
else()
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${TORCHAMP_BUILD}" --prefix "${WORK}/prefix"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install failed")
  endif()
  list(PREPEND prefix_path "${WORK}/prefix")
endif()
# A CUDA LibTorch's config needs the toolkit that this build was configured with.
if(CUDA_ROOT)
  list(APPEND find_args "-DCUDA_TOOLKIT_ROOT_DIR=${CUDA_ROOT}" "-DCUDAToolkit_ROOT=${CUDA_ROOT}"
       "-DCMAKE_CUDA_COMPILER=${CUDA_ROOT}/bin/nvcc")
endif()
if(LAUNCHER)
  list(APPEND find_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release "-DTorch_DIR=${Torch_DIR}" "-DCMAKE_PREFIX_PATH=${prefix_path}"
  ${find_args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK}/build" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "build failed")
endif()
execute_process(COMMAND "${WORK}/build/consumer" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer exited with ${rc}")
endif()
