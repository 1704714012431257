#pragma once

// std::filesystem::remove_all without calling it. PyTorch 2.11's wheels
// export a statically linked copy of libstdc++'s filesystem functions from
// libtorch.so (pytorch/pytorch#133437); a program linked to it binds its
// calls to that copy, whose remove_all crashes (a call through a null
// pointer) on any folder that holds a file. glibc's nftw walks the tree
// instead, deepest first, and C's remove() takes each entry.

#include <ftw.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <system_error>

namespace torchamp_apps {

/// Removes `path` and everything under it; nothing where it does not exist.
/// Throws std::system_error naming the path where an entry cannot go.
inline void remove_tree(const std::string& path) {
  // An entry gone meanwhile is no failure (nftw would stop at it).
  const auto remove_one = [](const char* p, const struct stat*, int, struct FTW*) {
    return std::remove(p) == 0 || errno == ENOENT ? 0 : -1;
  };
  if (nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    const int error = errno;
    if (error != ENOENT) {  // ENOENT here: no `path` at all
      throw std::system_error(error, std::generic_category(), "cannot remove " + path);
    }
  }
}

}  // namespace torchamp_apps
