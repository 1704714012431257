"""torchamp-train's time per training step on 1, 2 and 3 processes.

    python3 bench/bench_train_parallel.py APP [--epochs N] [--repeats R]

APP: build/apps/torchamp-train/torchamp-train (Debian's LibTorch) or
build-2.13/apps/torchamp-train/torchamp-train (the wheel's). Each run is the default task's fp16+scaler and
bf16+scaler modes for N epochs (global batch 128); the ranks are started as
torchrun starts them (its environment; OMP_NUM_THREADS=1 per rank, as
torchrun sets). The table gives rank 0's mean training step (forward to
update, collectives included; the median over R runs) and its ratio to the
1-process run measured in the same invocation, on the same machine state.
"""
import argparse
import csv
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("app")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--repeats", type=int, default=3)
opts = parser.parse_args()
MODES = ["fp16+scaler", "bf16+scaler"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world, parallel, threads):
    out = tempfile.mkdtemp(prefix="bench-train-")
    args = [opts.app, "--epochs", str(opts.epochs), "--modes", ",".join(MODES), "--out", out]
    if world > 1:
        args += ["--parallel", parallel]
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if world > 1:
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            sys.exit(f"{args} failed ({p.returncode}): {err[-2000:]}")
    with open(os.path.join(out, "summary.csv")) as f:
        ms = {row["mode"]: float(row["train_step_ms"]) for row in csv.DictReader(f)}
    shutil.rmtree(out)
    return ms


configs = [(1, "-", 1), (1, "-", 2), (2, "data", 1), (3, "data", 1), (2, "sharded", 1),
           (3, "sharded", 1)]
results = {c: [] for c in configs}
for _ in range(opts.repeats):  # interleaved: a slow spell of the machine hits every config
    for c in configs:
        results[c].append(run(*c))
nproc = os.cpu_count()
print(f"{os.path.basename(opts.app)}, {opts.epochs} epochs x {MODES}, median of {opts.repeats}, "
      f"{nproc} CPU cores\n")
print("| processes | parallel | threads each | " +
      " | ".join(f"{m} ms/step | vs 1 process (1 thread)" for m in MODES) + " |")
print("|---|---|---|" + "---|---|" * len(MODES))
base = {m: statistics.median(r[m] for r in results[(1, "-", 1)]) for m in MODES}
for c in configs:
    cells = []
    for m in MODES:
        ms = statistics.median(r[m] for r in results[c])
        cells.append(f"{ms:.2f} | {ms / base[m]:.2f}x")
    print(f"| {c[0]} | {c[1]} | {c[2]} | " + " | ".join(cells) + " |")
