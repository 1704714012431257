# torchamp_add_python_module(TARGET SOURCES...): a Python extension module
# against this LibTorch's libtorch_python, for TORCHAMP_PYTHON's interpreter
# (whose torch must be this LibTorch's). Where the LibTorch has no Gloo C++
# headers (the pip wheels), programs take their Gloo process group from
# Python's torch.distributed through such a module. Sets ${TARGET}_BUILT to
# ON in the caller when it could be built (a libtorch_python and Python's
# headers were found), else OFF.
function(torchamp_add_python_module target)
  set(${target}_BUILT OFF PARENT_SCOPE)
  if(NOT TORCHAMP_PYTHON)
    return()
  endif()
  find_library(TORCHAMP_TORCH_PYTHON_LIBRARY torch_python
    PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
  execute_process(
    COMMAND ${TORCHAMP_PYTHON} -c
      "import sysconfig; print(sysconfig.get_paths()['include'] + ';' + sysconfig.get_config_var('EXT_SUFFIX'))"
    OUTPUT_VARIABLE _py OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _py_rc)
  if(NOT TORCHAMP_TORCH_PYTHON_LIBRARY OR NOT _py_rc EQUAL 0)
    return()
  endif()
  list(GET _py 0 _py_include)
  list(GET _py 1 _py_suffix)
  add_library(${target} MODULE ${ARGN})
  set_target_properties(${target} PROPERTIES PREFIX "" SUFFIX "${_py_suffix}"
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/python)
  target_include_directories(${target} PRIVATE ${_py_include})
  # Python's symbols come from the interpreter that loads the module.
  target_link_libraries(${target} PRIVATE torchamp::torchamp ${TORCHAMP_TORCH_PYTHON_LIBRARY})
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  set(${target}_BUILT ON PARENT_SCOPE)
endfunction()
