# Fails unless the page README (README.md or a docs/ page) holds EXAMPLE
# verbatim in a ```cpp block, so the example a page shows is the one a test
# compiles and runs.
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "```cpp\n${example}```" found)
if(found EQUAL -1)
  message(FATAL_ERROR "${README} does not contain ${EXAMPLE} verbatim in a ```cpp block")
endif()
