# Configures, builds and runs tests/integration/subproject with torchamp brought in WAY
# (add_subdirectory, find_torch_first or fetchcontent; see its CMakeLists.txt),
# LibTorch found through the parent's own CMAKE_PREFIX_PATH. Then checks that
# the parent's install step installs nothing of torchamp.
#
# WORK is a folder whose path is the same in every clone (tests/CMakeLists.txt:
# under TORCHAMP_SUBPROJECT_DIR, one a leg and way, add_subdirectory and
# find_torch_first sharing one in turn, so that the second hits the first's
# objects), and ROOT, the checkout, is reached through a link there
# (WORK/torchamp): the unity sources CMake writes #include their files by
# absolute path, and ccache reuses an object only for the same text, so under
# the clone's own path a clone in another folder compiled the library again
# (75 s a way on the debian leg). A lock keeps two runs on one machine from
# sharing WORK; a passing run removes it.
get_filename_component(parent "${WORK}" DIRECTORY)
file(MAKE_DIRECTORY "${parent}")
file(LOCK "${WORK}.lock" GUARD PROCESS TIMEOUT 1800)
file(REMOVE "${WORK}/torchamp")  # the link itself, before the folder
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(CREATE_LINK "${ROOT}" "${WORK}/torchamp" SYMBOLIC)
# LibTorch through the link too where it lies in the checkout (the wheel's, in
# .deps/), so that its -isystem paths are also the same in every clone.
string(REPLACE "${ROOT}/" "${WORK}/torchamp/" prefix_path "${TORCH_PREFIX_PATH}")
string(REPLACE "|" ";" prefix_path "${prefix_path}")
set(source "${WORK}/torchamp")
set(args "")
# Each way builds the library afresh (ccache cannot match its objects with
# the main build's: another config.h folder, other relative paths), so as a
# unity build, a setting a parent may make: the library in a few translation
# units, LibTorch's headers parsed a few times, not 30. A clean clone's run
# (2026-12-06) took 514 s and 425 s for the two other ways without it, 172 s
# for this one with it. The library's own build is not a unity build, so
# both are compiled.
list(APPEND args -DCMAKE_UNITY_BUILD=ON)
if(WAY STREQUAL "fetchcontent")
  # A local copy of what a release archive holds, fetched by URL.
  set(source "${WORK}/torchamp-src")
  file(MAKE_DIRECTORY "${source}")
  file(COPY "${ROOT}/CMakeLists.txt" "${ROOT}/cmake" "${ROOT}/include" "${ROOT}/src"
       DESTINATION "${source}")
endif()
if(CUDA_ROOT)
  list(APPEND args "-DCUDA_TOOLKIT_ROOT_DIR=${CUDA_ROOT}" "-DCUDAToolkit_ROOT=${CUDA_ROOT}"
       "-DCMAKE_CUDA_COMPILER=${CUDA_ROOT}/bin/nvcc")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix_path}" "-DTORCHAMP_WAY=${WAY}"
  "-DTORCHAMP_SOURCE=${source}" ${args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure failed (${WAY})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK}/build" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "build failed (${WAY})")
endif()
execute_process(COMMAND "${WORK}/build/app" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "as a subproject: scaled 8")
  message(FATAL_ERROR "app exited with ${rc} (${WAY})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --install "${WORK}/build" --prefix "${WORK}/prefix"
  RESULT_VARIABLE rc)
file(GLOB_RECURSE installed "${WORK}/prefix/*")
if(NOT rc EQUAL 0 OR installed)
  message(FATAL_ERROR "the parent's install step failed or installed torchamp: ${installed}")
endif()
file(REMOVE "${WORK}/torchamp")
file(REMOVE_RECURSE "${WORK}")
