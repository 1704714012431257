"""One rank of a distributed scaler test over Python's Gloo process group.

    dist_worker.py SCENARIO RANK WORLD STORE_FILE OUT_FILE

The same command line and scenarios as tests/tools/dist_worker.cpp, for a
LibTorch without Gloo's C++ headers (a pip wheel): torch.distributed builds a
real Gloo process group over loopback from a FileStore, and the C++ scenario
(tests/tools/dist_scenarios.h, built as the torchamp_dist_ext module) runs
with it through torchamp::set_process_group.
"""
import datetime
import os
import sys

import torch.distributed as dist

import torchamp_dist_ext

scenario, rank, world, store, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
group = None
if scenario != "single" and not scenario.endswith("-local"):  # references: no group
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=5))
    group = dist.distributed_c10d._get_default_group()
code = torchamp_dist_ext.run(scenario, rank, world, group, out)
sys.stdout.flush()
os._exit(code)  # no teardown collective with ranks that may be gone
