cmake_minimum_required(VERSION 3.18)
# Fails if a file of the library includes a layer above its own
# (docs/design.md: a layer uses the ones above it in the table, never the
# reverse). Run with -DROOT=<repository>.
#
# Ranks, lowest first. A source folder may include its own files, the
# private headers of lower folders ("kernels/kernels.h") and the public
# headers up to its own rank; a public header only lower-ranked ones.
# config.h and version.h are rank 0: anything may include them.
set(folder_rank compat:0 schedule:1 kernels:2 scaler:3 paddle:4 autocast:5 optim:8
    distributed:9 checkpoint:10 c:11)
set(header_rank config:0 version:0 scale_schedule:1 amp_step:2 grad_scaler:3 paddle:4
    autocast:5 process_group:6 distributed:7 optim:8 data_parallel:9 checkpoint:10 torchamp:11)

function(rank_of list name out)
  foreach(entry IN LISTS ${list})
    string(REPLACE ":" ";" pair "${entry}")
    list(GET pair 0 key)
    list(GET pair 1 value)
    if(key STREQUAL name)
      set(${out} ${value} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

set(bad "")
set(checked 0)
file(GLOB_RECURSE sources RELATIVE "${ROOT}/src" "${ROOT}/src/*.h" "${ROOT}/src/*.cpp")
file(GLOB headers RELATIVE "${ROOT}/include/torchamp" "${ROOT}/include/torchamp/*.h")
foreach(file IN LISTS sources headers)
  if(file IN_LIST headers)
    set(path "${ROOT}/include/torchamp/${file}")
    get_filename_component(name "${file}" NAME_WE)
    rank_of(header_rank ${name} own)
    set(folder "")
  else()
    set(path "${ROOT}/src/${file}")
    string(REGEX REPLACE "/.*" "" folder "${file}")
    rank_of(folder_rank ${folder} own)
  endif()
  if(own STREQUAL "")
    list(APPEND bad "${file}: in no layer of this check (add it to check_layers.cmake)")
    continue()
  endif()
  file(STRINGS "${path}" lines REGEX "^#include [\"<]")
  foreach(line IN LISTS lines)
    math(EXPR checked "${checked} + 1")
    if(line MATCHES "^#include <torchamp/([a-z_]+)\\.h>")
      rank_of(header_rank ${CMAKE_MATCH_1} theirs)
      if(theirs STREQUAL "" OR theirs GREATER own OR
         (folder STREQUAL "" AND theirs EQUAL own AND NOT theirs EQUAL 0))
        list(APPEND bad "${file} (rank ${own}): ${line}")
      endif()
    elseif(line MATCHES "^#include \"([a-z_]+)/" AND NOT folder STREQUAL "")
      set(target_folder ${CMAKE_MATCH_1})
      rank_of(folder_rank ${target_folder} theirs)
      if(theirs STREQUAL "" OR theirs GREATER own OR
         (theirs EQUAL own AND NOT target_folder STREQUAL folder))
        list(APPEND bad "${file} (rank ${own}): ${line}")
      endif()
    endif()
  endforeach()
endforeach()
if(bad)
  string(REPLACE ";" "\n  " bad "${bad}")
  message(FATAL_ERROR "includes that climb a layer (docs/design.md):\n  ${bad}")
endif()
list(LENGTH sources n_sources)
list(LENGTH headers n_headers)
message(STATUS "${n_sources} sources and ${n_headers} headers, ${checked} includes: none climbs")
