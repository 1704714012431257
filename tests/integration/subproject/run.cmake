# Configures, builds and runs tests/integration/subproject with torchamp brought in WAY
# (add_subdirectory, find_torch_first or fetchcontent; see its CMakeLists.txt),
# LibTorch found through the parent's own CMAKE_PREFIX_PATH. Then checks that
# the parent's install step installs nothing of torchamp.
#
# WORK is a folder whose path is the same in every clone (tests/CMakeLists.txt:
# under TORCHAMP_SUBPROJECT_DIR, one a leg, the three ways sharing it in turn),
# and the sources lie at WORK/torchamp: a link to ROOT, the checkout, for the
# add_subdirectory ways, the fetched copy for fetchcontent. The unity sources
# CMake writes #include their files by absolute path, and ccache reuses an
# object only for the same text and command line, so in one path, built in one
# folder (WORK/build/torchamp), the second and third ways hit the first's
# objects, and a clone in another folder hits them all (under the clone's own
# path it compiled the library again, about 95 s a way and leg). A lock keeps
# two runs on one machine from sharing WORK; a passing run removes it.
get_filename_component(parent "${WORK}" DIRECTORY)
file(MAKE_DIRECTORY "${parent}")
file(LOCK "${WORK}.lock" GUARD PROCESS TIMEOUT 1800)
# The links themselves, before the folder (a failed fetchcontent run leaves a
# folder at WORK/torchamp, which REMOVE passes over).
file(REMOVE "${WORK}/torchamp" "${WORK}/checkout")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
if(NOT WAY STREQUAL "fetchcontent")
  file(CREATE_LINK "${ROOT}" "${WORK}/torchamp" SYMBOLIC)
endif()
# LibTorch through a link too where it lies in the checkout (the wheel's, in
# .deps/), so that its -isystem paths are also the same in every clone and way.
file(CREATE_LINK "${ROOT}" "${WORK}/checkout" SYMBOLIC)
string(REPLACE "${ROOT}/" "${WORK}/checkout/" prefix_path "${TORCH_PREFIX_PATH}")
string(REPLACE "|" ";" prefix_path "${prefix_path}")
set(source "${WORK}/torchamp")
set(args "")
# The library is compiled here once a leg (ccache cannot match its objects
# with the main build's: another config.h folder, other relative paths), as a
# unity build, a setting a parent may make: the library in a few translation
# units, LibTorch's headers parsed a few times, not 30. A clean clone's run
# (2026-12-06) took 514 s and 425 s for two ways without it, 172 s for one
# with it. The library's own build is not a unity build, so
# both are compiled.
list(APPEND args -DCMAKE_UNITY_BUILD=ON)
if(WAY STREQUAL "fetchcontent")
  # A local copy of what a release archive holds, fetched by URL into
  # WORK/torchamp.
  set(source "${WORK}/torchamp-src")
  file(MAKE_DIRECTORY "${source}")
  file(COPY "${ROOT}/CMakeLists.txt" "${ROOT}/cmake" "${ROOT}/include" "${ROOT}/src"
       DESTINATION "${source}")
  list(APPEND args "-DTORCHAMP_FETCH_DIR=${WORK}/torchamp")
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
file(REMOVE "${WORK}/torchamp" "${WORK}/checkout")
file(REMOVE_RECURSE "${WORK}")
