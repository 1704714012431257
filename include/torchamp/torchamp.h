#pragma once

/// \file
/// Everything torchamp offers: dynamic loss scaling and autocast for the
/// LibTorch C++ frontend.

#include <torchamp/config.h>

#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>
#if TORCHAMP_WITH_DISTRIBUTED
#include <torchamp/data_parallel.h>
#include <torchamp/distributed.h>
#include <torchamp/process_group.h>
#endif
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>
#include <torchamp/paddle.h>
#include <torchamp/scale_schedule.h>
#include <torchamp/version.h>
