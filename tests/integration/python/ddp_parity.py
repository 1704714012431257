"""torchamp::DistributedDataParallel against Python's DistributedDataParallel.

    python -m torch.distributed.run --standalone --nproc-per-node N ddp_parity.py DIST_WORKER WORK

Each rank trains the model of tests/integration/tools/ddp_scenarios.h's ddp-train (same
initial weights and batches, computed with the same ops; SGD with momentum in
two parameter groups; 1 KiB buckets; gradients set to None between steps) with
Python's DDP, then starts its C++ twin, DIST_WORKER ddp-train: the C++ class
over a group that torchamp::init_process_group forms (file://). Rank 0
compares: the parameters after 5 steps bit for bit, and the buckets after the
rebuild.
"""
import datetime
import gc
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

GLOBAL_BATCH = 12
worker, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)


def wave(shape, freq, phase, amp):
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float32).mul(freq).add(phase).sin().mul(amp).reshape(shape)


model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
with torch.no_grad():
    for i, p in enumerate(model.parameters()):
        p.copy_(wave(p.shape, 0.37 + 0.01 * i, 0.1 * i, 0.3))
params = list(model.parameters())
opt = torch.optim.SGD([{"params": params[:2], "lr": 0.05}, {"params": params[2:], "lr": 0.1}],
                      lr=0.1, momentum=0.9)
ddp = DistributedDataParallel(model, bucket_cap_mb=1.0 / 1024)
per = GLOBAL_BATCH // world
for step in range(5):
    x = wave((GLOBAL_BATCH, 16), 0.13, float(step), 1.0)[rank * per:(rank + 1) * per]
    y = wave((GLOBAL_BATCH, 4), 0.07, 2.0 * step, 1.0)[rank * per:(rank + 1) * per]
    opt.zero_grad(set_to_none=True)
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()

index = {p.data_ptr(): i for i, p in enumerate(params)}
buckets = [[index[p.data_ptr()] for p in b.parameters()]
           for b in ddp.reducer._get_zeros_like_grad_buckets()]
python_lines = ["param %.9g" % v for p in params for v in p.detach().flatten().tolist()]
python_lines += ["buckets %d" % len(buckets)] + ["bucket " + " ".join(map(str, b)) for b in buckets]

cpp_out = os.path.join(work, f"cpp.{world}.{rank}")
store = os.path.join(work, f"store.{world}")
if rank == 0 and os.path.exists(store):
    os.remove(store)
dist.barrier()
code = subprocess.run([worker, "ddp-train", str(rank), str(world), store, cpp_out],
                      timeout=120).returncode
with open(cpp_out) as f:
    cpp_lines = f.read().splitlines()
dist.barrier()

ok = code == 0
if rank == 0:
    py_params = [l for l in python_lines if l.startswith("param ")]
    cpp_params = [l for l in cpp_lines if l.startswith("param ")]
    same = sum(a == b for a, b in zip(py_params, cpp_params))
    worst = max((abs(float(a[6:]) - float(b[6:])) for a, b in zip(py_params, cpp_params)),
                default=float("inf"))
    bit_for_bit = len(py_params) == len(cpp_params) and same == len(py_params)
    print(f"{world} ranks, torch {torch.__version__}: {same} of {len(py_params)} parameters "
          f"bit for bit equal (C++ {len(cpp_params)}), largest difference {worst:.3g}")
    py_buckets = [l for l in python_lines if l.startswith("bucket")]
    cpp_buckets = [l for l in cpp_lines if l.startswith("bucket")]
    print(f"buckets: Python {py_buckets}, C++ {cpp_buckets}")
    ok = ok and bit_for_bit and py_buckets == cpp_buckets
    print("PASS" if ok else "FAIL")
dist.barrier()
# DDP holds the process group: drop it before the interpreter finalises (see
# consumer_ddp_parity.py: Gloo's work thread reaching for the GIL then aborts).
del ddp, opt
gc.collect()
dist.destroy_process_group()
sys.exit(0 if ok else 1)
