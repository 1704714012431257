# Fails unless README.md holds examples/quickstart.cpp verbatim in a ```cpp
# block, so the example the README shows is the one a test compiles and runs.
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "```cpp\n${example}```" found)
if(found EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim in a ```cpp block")
endif()
