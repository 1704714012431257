#!/usr/bin/env python3
"""Activation checkpointing: torchamp (C++) against Python's torch.utils.checkpoint.

    python bench/bench_checkpoint.py build-2.13/bench/bench_checkpoint [--rounds 5] [--threads 1]

Runs, in one invocation and alternately, the C++ benchmark (bench_checkpoint.cpp:
torchamp::checkpoint_sequential) and the same training step in this Python's torch
(the wheel whose LibTorch the C++ side links): a deep MLP (16 x Linear(512, 512) + GELU,
batch 4096) under bfloat16 autocast, forward and backward, without checkpointing and
with 4 segments. Each process measures its modes interleaved; the ratios (memory with
checkpointing / without, time with / without) come from one process each. Peak memory
is each step's peak resident set above its start (see bench_checkpoint.cpp), with
MALLOC_MMAP_THRESHOLD_ set for both languages alike.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

SHAPE = dict(layers=16, width=512, batch=4096, segments=4)


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def python_worker(rounds, threads):
    import torch
    from torch.utils.checkpoint import checkpoint_sequential

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers = []
    for _ in range(SHAPE["layers"]):
        layers += [torch.nn.Linear(SHAPE["width"], SHAPE["width"]), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(SHAPE["batch"], SHAPE["width"], requires_grad=True)
    modes = {"plain": None, "use_reentrant=False": False, "use_reentrant=True": True}

    def step(reentrant):
        model.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if reentrant is None:
                out = model(x)
            else:
                out = checkpoint_sequential(model, SHAPE["segments"], x, use_reentrant=reentrant)
        out.float().pow(2).mean().backward()

    for r in modes.values():
        step(r)
    ms = {m: [] for m in modes}
    peak = {m: [] for m in modes}
    for _ in range(rounds):
        for m, r in modes.items():
            base = status_kb("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            t0 = time.perf_counter()
            step(r)
            ms[m].append((time.perf_counter() - t0) * 1e3)
            peak[m].append((status_kb("VmHWM") - base) / 1024)
    for m in modes:
        print(f"mode {m} peak_mb {statistics.median(peak[m]):.1f} ms {statistics.median(ms[m]):.1f}")


def parse(text):
    rows = {}
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "mode":
            rows[f[1]] = {"peak_mb": float(f[3]), "ms": float(f[5])}
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cpp", nargs="?", help="the bench_checkpoint program")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--python-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.python_worker:
        python_worker(a.rounds, a.threads)
        return
    if not a.cpp:
        ap.error("the bench_checkpoint program is required")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(a.threads))
    common = ["--rounds", str(a.rounds), "--threads", str(a.threads)]
    cpp_args = [a.cpp] + common + [x for k, v in SHAPE.items() for x in (f"--{k}", str(v))]
    cpp = parse(subprocess.run(cpp_args, env=env, check=True, capture_output=True, text=True).stdout)
    py = parse(subprocess.run([sys.executable, __file__, "--python-worker"] + common, env=env,
                              check=True, capture_output=True, text=True).stdout)
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    print(f"deep MLP {SHAPE['layers']} x Linear({SHAPE['width']}) + GELU, batch {SHAPE['batch']}, "
          f"bfloat16 autocast, {SHAPE['segments']} segments, {a.threads} thread(s), "
          f"torch {torch.__version__}, medians of {a.rounds}")
    print()
    print("| step | peak memory MB | of no checkpointing | time ms | of no checkpointing |")
    print("|---|---|---|---|---|")
    for name, rows, plain, mode in (
            ("C++, no checkpointing", cpp, "plain", "plain"),
            ("C++, torchamp::checkpoint_sequential", cpp, "plain", "checkpoint"),
            ("Python, no checkpointing", py, "plain", "plain"),
            ("Python, checkpoint_sequential(use_reentrant=False)", py, "plain", "use_reentrant=False"),
            ("Python, checkpoint_sequential(use_reentrant=True)", py, "plain", "use_reentrant=True")):
        r, p = rows[mode], rows[plain]
        print(f"| {name} | {r['peak_mb']:.0f} | {r['peak_mb'] / p['peak_mb']:.2f} | "
              f"{r['ms']:.0f} | {r['ms'] / p['ms']:.2f} |")


if __name__ == "__main__":
    main()
