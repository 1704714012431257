# Configures, builds and runs tests/integration/subproject with torchamp brought in WAY
# (add_subdirectory, find_torch_first or fetchcontent; see its CMakeLists.txt),
# LibTorch found through the parent's own CMAKE_PREFIX_PATH. Then checks that
# the parent's install step installs nothing of torchamp.
#
# WORK is the way's own folder in the leg's build folder (tests/CMakeLists.txt),
# removed when the way passes, kept when it fails. torchamp's sources lie at
# WORK/torchamp: a copy of the files its build needs (CMakeLists.txt, cmake/,
# include/, src/), made here for the add_subdirectory ways and fetched by URL
# from such a copy at WORK/torchamp-src for fetchcontent. torchamp builds in
# WORK/torchamp/build, the parent in WORK/build.
#
# Why there: the checkout's own build compiles the library in a folder one
# level below the sources (build/, build-2.13/), and so does this one. Under
# ccache's base_dir at the checkout (scripts/lib.sh exports it) the command
# lines are then the same text ("-I../include ... -c ../src/x.cpp") and the
# sources the same bytes, so the library compiles from the leg's own objects;
# on a cold cache it compiled once more a leg before (93-122 s, 2026-12-07).
# That holds with the Makefile generator (it compiles in each target's
# folder; Ninja compiles in the parent's), with LibTorch outside the checkout
# (its -isystem paths absolute, as pip's venv under ~/.cache and Debian's are)
# and with CCACHE_BASEDIR set; without them the library just compiles again.
get_filename_component(parent "${WORK}" DIRECTORY)
file(MAKE_DIRECTORY "${parent}")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(source "${WORK}/torchamp")
set(args "")
if(WAY STREQUAL "fetchcontent")
  # The copy is fetched by URL into WORK/torchamp.
  set(source "${WORK}/torchamp-src")
  list(APPEND args "-DTORCHAMP_FETCH_DIR=${WORK}/torchamp")
endif()
# An empty build/ in it too, which fetchcontent needs: its download step
# removes WORK/torchamp, with the binary folder it made there, before it
# copies, and the steps after it run in that folder. (Harmless for the
# add_subdirectory ways.)
file(MAKE_DIRECTORY "${source}/build")
file(COPY "${ROOT}/CMakeLists.txt" "${ROOT}/cmake" "${ROOT}/include" "${ROOT}/src"
     DESTINATION "${source}")
if(CUDA_ROOT)
  list(APPEND args "-DCUDA_TOOLKIT_ROOT_DIR=${CUDA_ROOT}" "-DCUDAToolkit_ROOT=${CUDA_ROOT}"
       "-DCMAKE_CUDA_COMPILER=${CUDA_ROOT}/bin/nvcc")
endif()
string(REPLACE "|" ";" prefix_path "${TORCH_PREFIX_PATH}")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE}" -B "${WORK}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix_path}" "-DTORCHAMP_WAY=${WAY}"
  "-DTORCHAMP_SOURCE=${source}" "-DTORCHAMP_BINARY_DIR=${WORK}/torchamp/build" ${args}
  RESULT_VARIABLE rc)
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
file(REMOVE_RECURSE "${WORK}")
