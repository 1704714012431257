# Turns README.md's snippets into a GoogleTest file that torchamp_tests
# compiles, so a snippet that no longer compiles breaks the build.
#
#   cmake -DREADME=README.md -DPRELUDE=snippet_prelude.inc -DOUT=readme_snippets.cpp -P snippets.cmake
#
# A snippet is a ```cpp block right after a `<!-- snippet -->` line. Each
# becomes the body of its own function, after the statements of PRELUDE (the
# model, optimizer and data it assumes); its #include lines go to the top of
# the file. A snippet that names DistributedDataParallel is compiled where
# torchamp is built with distributed support. Every other ```cpp block of the
# README must be an example file shown verbatim (tests/integration/readme/check_example.cmake
# checks those): a block that is neither fails here, so no C++ on the front
# page goes unchecked.
file(READ "${README}" text)
# Lines, keeping empty ones and brackets (CMake lists would drop or split them).
string(REPLACE ";" "<SEMI>" text "${text}")
string(REPLACE "[" "<LB>" text "${text}")
string(REPLACE "]" "<RB>" text "${text}")
string(REPLACE "\n" ";" lines "${text}")

set(includes "")
set(functions "")
set(table "")
set(n 0)
set(state outside)  # outside | marked | snippet | verbatim | fenced
set(verbatim_blocks "")
set(heading "")
foreach(line IN LISTS lines)
  if(state STREQUAL "fenced")  # another language's block: shell comments are no headings
    if(line STREQUAL "```")
      set(state outside)
    endif()
  elseif(state STREQUAL "snippet" OR state STREQUAL "verbatim")
    if(line STREQUAL "```")
      if(state STREQUAL "snippet")
        math(EXPR n "${n} + 1")
        string(REPLACE "\"" "'" quoted_heading "${heading}")
        if(body MATCHES "DistributedDataParallel")
          # Compiled only: it needs a process group of several ranks.
          string(APPEND functions "#if TORCHAMP_WITH_DISTRIBUTED\n")
          set(runner "nullptr")
        else()
          set(runner "&readme::snippet_${n}")
        endif()
        string(APPEND functions "// ${heading}\nvoid snippet_${n}() {\n"
                                "#include \"${PRELUDE}\"\n${body}}\n")
        if(runner STREQUAL "nullptr")
          string(APPEND functions "#endif\n")
        endif()
        string(APPEND functions "\n")
        string(APPEND table "    {\"${quoted_heading}\", ${runner}},\n")
      endif()
      set(state outside)
    elseif(state STREQUAL "snippet" AND line MATCHES "^#include ")
      string(APPEND includes "${line}\n")
    elseif(state STREQUAL "snippet")
      string(APPEND body "${line}\n")
    endif()
  elseif(line MATCHES "^#+ (.*)$")
    set(heading "${CMAKE_MATCH_1}")
    set(state outside)
  elseif(line STREQUAL "<!-- snippet -->")
    set(state marked)
  elseif(line STREQUAL "```cpp")
    set(body "")
    if(state STREQUAL "marked")
      set(state snippet)
    else()
      set(state verbatim)
      list(APPEND verbatim_blocks "${heading}")
    endif()
  elseif(line MATCHES "^```")
    set(state fenced)
  elseif(NOT line STREQUAL "")
    set(state outside)
  endif()
endforeach()

# The ```cpp blocks without a marker: exactly the verbatim examples the
# readme.example.* tests check (tests/CMakeLists.txt counts them: VERBATIM).
list(LENGTH verbatim_blocks n_verbatim)
if(NOT n_verbatim EQUAL VERBATIM)
  message(FATAL_ERROR "${README} has ${n_verbatim} ```cpp blocks without <!-- snippet --> "
                      "(under: ${verbatim_blocks}); expected ${VERBATIM} verbatim example(s)")
endif()
if(n EQUAL 0)
  message(FATAL_ERROR "${README} has no <!-- snippet --> block")
endif()

string(CONCAT content "// Generated from ${README} by tests/integration/readme/snippets.cmake: do not edit.\n"
            "#include <torch/torch.h>\n#include <torchamp/torchamp.h>\n${includes}\n"
            "#include <gtest/gtest.h>\n\n"
            "// Snippets are fragments of a program: their results often go unused.\n"
            "#pragma GCC diagnostic ignored \"-Wunused-variable\"\n"
            "#pragma GCC diagnostic ignored \"-Wunused-but-set-variable\"\n\n"
            "namespace readme {\n${functions}}  // namespace readme\n\n")
string(APPEND content
  "// Every snippet compiles (or the build fails); those that need no process\n"
  "// group also run, on the prelude's model and data, without throwing.\n"
  "TEST(Readme, SnippetsRunAsShown) {\n"
  "  struct Snippet {\n    const char* section;\n    void (*run)();\n  };\n"
  "  const Snippet snippets[] = {\n${table}  };\n"
  "  int ran = 0;\n"
  "  for (const Snippet& s : snippets) {\n"
  "    if (s.run == nullptr) continue;\n"
  "    SCOPED_TRACE(s.section);\n"
  "    EXPECT_NO_THROW(s.run());\n"
  "    ++ran;\n"
  "  }\n"
  "  EXPECT_GT(ran, 0);\n"
  "}\n")
string(REPLACE "<SEMI>" ";" content "${content}")
string(REPLACE "<LB>" "[" content "${content}")
string(REPLACE "<RB>" "]" content "${content}")
# Rewrite only on change: an unchanged README rebuilds nothing.
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
message(STATUS "${README}: ${n} snippets, ${n_verbatim} verbatim example(s)")
