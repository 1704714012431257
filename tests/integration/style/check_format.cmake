# Fails if clang-format would change any C++ file of the repository. The
# repository is formatted with clang-format 14; other majors format differently.
execute_process(COMMAND "${CLANG_FORMAT}" --version OUTPUT_VARIABLE version
  ERROR_VARIABLE version_err RESULT_VARIABLE version_rc)
if(NOT version MATCHES "version 14\\.")
  message(FATAL_ERROR "${CLANG_FORMAT} is not clang-format 14 (exit ${version_rc}: ${version}${version_err}); "
    "use the clang-format 14 that scripts/test installs with pip (clang-format==14.0.6)")
endif()
file(GLOB_RECURSE files RELATIVE "${ROOT}"
  "${ROOT}/include/*.h" "${ROOT}/src/*.h" "${ROOT}/src/*.cpp" "${ROOT}/tests/*.h"
  "${ROOT}/tests/*.cpp" "${ROOT}/tests/*.c" "${ROOT}/examples/*.cpp" "${ROOT}/apps/*.cpp" "${ROOT}/apps/*.h"
  "${ROOT}/bench/*.cpp")
set(bad "")
foreach(f IN LISTS files)
  execute_process(COMMAND "${CLANG_FORMAT}" --dry-run --Werror "${ROOT}/${f}"
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND bad "${f}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "clang-format would change: ${bad}\nRun: clang-format -i <files>")
endif()
list(LENGTH files n)
message(STATUS "${n} files formatted")
