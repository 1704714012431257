#pragma once

/// \file
/// torchamp's version (kept equal to the CMake project version).

#define TORCHAMP_VERSION_MAJOR 0
#define TORCHAMP_VERSION_MINOR 1
#define TORCHAMP_VERSION_PATCH 0
#define TORCHAMP_VERSION "0.1.0"
