// The checkout's path, on this file's compile line alone: on test_errors.cpp's
// (a 10 s compile) or the target's (every test file, through the precompiled
// header's), it made them miss ccache in a clone in another folder, since
// ccache's base_dir does not rewrite a path inside a -D value.
const char* torchamp_test_source_dir();
const char* torchamp_test_source_dir() {
  return TORCHAMP_SOURCE_DIR;
}
