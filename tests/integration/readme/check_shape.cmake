cmake_minimum_required(VERSION 3.18)
# Fails if the README (-DREADME=) grows past 400 lines or holds a table wider
# than 7 columns: the front page stays short enough to read, and its tables
# fit a terminal; detail goes to docs/.
file(READ "${README}" text)
string(REGEX MATCHALL "\n" newlines "${text}")
list(LENGTH newlines count)
if(count GREATER 400)
  message(FATAL_ERROR "${README}: ${count} lines, more than 400: move detail to docs/")
endif()
string(REPLACE ";" "," text "${text}")  # no list separators inside a line
string(REPLACE "\n" ";" lines "${text}")
set(number 0)
foreach(line IN LISTS lines)
  math(EXPR number "${number} + 1")
  if(line MATCHES "^\\|")
    string(REGEX REPLACE "`[^`]*`" "x" cells "${line}")  # a | inside code is no column
    string(REGEX REPLACE "[^|]" "" bars "${cells}")
    string(LENGTH "${bars}" n)
    math(EXPR columns "${n} - 1")
    if(columns GREATER 7)
      message(FATAL_ERROR "${README}:${number}: a table of ${columns} columns, more than 7: ${line}")
    endif()
  endif()
endforeach()
message(STATUS "${README}: ${count} lines, tables of at most 7 columns")
