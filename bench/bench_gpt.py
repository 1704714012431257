#!/usr/bin/env python3
"""torchamp-gpt's modes against float32, against Python's same run and against
the machine's matmul ceiling, in one invocation (issue 48's targets).

    PY bench/bench_gpt.py APP [--steps N] [--sizes gpt10m,small] [--threads 1,2]
                              [--fp16-sizes small] [--out DIR]

APP: build-2.13/apps/torchamp-gpt/torchamp-gpt (PY: that wheel's venv Python,
.deps/torch-2.13.0/bin/python, whose torch runs the Python side:
apps/torchamp-gpt/gpt_python.py on the same run folder, so the same initial
weights, batches, schedule and thread count).

For each size, thread count and mode: one C++ run (a process a mode, each from
the same seed: the same initial weights and batches), then the same run in
Python on its run folder; one thread runs
--deterministic (MKL pinned to one thread, as the tests), more threads
--nondeterministic (every BLAS call on all of them, as a user times it).
fp16+scaler runs only on --fp16-sizes: without AMX-FP16 ATen's CPU float16
matmul is ~10x slower than float32 (the same kernel on both sides; see the
ceiling column). Then, on the first size and one thread, fp32 and bf16
without and with --checkpoint-layers, alternately (--checkpoint-rounds), and
bf16 once more with glibc's heap trimming raised for both languages: peak
memory and step time with against without.

Columns: tokens/s over the steps after the first (oneDNN's set-up), on both
sides; vs fp32 (same language, same run); vs Python; peak MB (the process's
resident peak during the mode) and train MB (that peak less the resident
memory as the mode began: weights, gradients, optimizer state, activations);
ceiling: the model's FLOPs per second (6 N + 12 L T d per token, nanoGPT's
estimate) over a 2048x768 @ 768x3072 matmul's in that dtype, measured here.
Ratios come from one invocation on one machine state; the machine is shared.
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWIN = os.path.join(ROOT, "apps", "torchamp-gpt", "gpt_python.py")
SHAPES = {"gpt10m": (6, 384, 256), "small": (4, 128, 128), "tiny": (2, 32, 32)}  # L, d, T
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-params": torch.bfloat16,
         "fp16+scaler": torch.float16}

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("app")
parser.add_argument("--steps", type=int, default=10, help="steps a mode on gpt10m")
parser.add_argument("--small-steps", type=int, default=60, help="steps a mode on the others")
parser.add_argument("--sizes", default="gpt10m,small")
parser.add_argument("--threads", default="1,2")
parser.add_argument("--fp16-sizes", default="small")
parser.add_argument("--out", default="")
parser.add_argument("--checkpoint-rounds", type=int, default=2,
                    help="alternate runs without and with --checkpoint-layers")
parser.add_argument("--checkpoint-steps", type=int, default=6, help="steps a checkpointing run")
opts = parser.parse_args()


def matmul_flops(dtype, threads):
    torch.set_num_threads(threads)
    a = torch.randn(2048, 768).to(dtype)
    b = torch.randn(768, 3072).to(dtype)
    for _ in range(2):
        a @ b
    n, t0 = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < 0.5:
        a @ b
        n += 1
    return 2.0 * 2048 * 768 * 3072 * n / (time.perf_counter() - t0)


def read_csv(path):
    with open(path) as f:
        return {r["mode"]: r for r in csv.DictReader(f)}


def cpp_run(out, size, threads, modes, extra=(), steps=None, env_extra=None):
    steps = steps or (opts.steps if size == "gpt10m" else opts.small_steps)
    args = [opts.app, "--size", size, "--steps", str(steps), "--warmup", "2",
            "--eval-every", str(steps), "--eval-batches", "2", "--sample", "0",
            "--threads", str(threads), "--modes", ",".join(modes), "--out", out]
    args += ["--deterministic"] if threads == 1 else ["--nondeterministic"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(env_extra or {}))
    print("== " + " ".join(args[1:]), flush=True)
    subprocess.run(args + list(extra), check=True, env=env, stdout=subprocess.DEVNULL)
    return read_csv(os.path.join(out, "summary.csv"))


def python_run(out, threads, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(env_extra or {}))
    print("== gpt_python.py (the same run in Python)", flush=True)
    subprocess.run([sys.executable, TWIN, out], check=True, env=env, stdout=subprocess.DEVNULL)
    return read_csv(os.path.join(out, "python-summary.csv"))


def flops_per_token(size, params):
    layers, d, context = SHAPES[size]
    return 6.0 * params + 12.0 * layers * context * d


def mb(row):
    return float(row["peak_rss_mb"]), float(row["peak_rss_mb"]) - float(row["start_rss_mb"])


work = opts.out or tempfile.mkdtemp(prefix="bench-gpt-")
os.makedirs(work, exist_ok=True)
threads_list = [int(t) for t in opts.threads.split(",")]
sizes = opts.sizes.split(",")
ceilings = {(d, t): matmul_flops(DTYPE[d], t) for d in DTYPE for t in threads_list}
results = []
for size in sizes:
    modes = ["fp32", "bf16", "bf16-params"]
    if size in opts.fp16_sizes.split(","):
        modes.append("fp16+scaler")
    for threads in threads_list:
        # One process a mode (the same seed: the same initial weights and
        # batches), so that each mode's peak memory is its own.
        cpp, py = {}, {}
        for m in modes:
            out = os.path.join(work, "%s-%dt-%s" % (size, threads, m))
            shutil.rmtree(out, ignore_errors=True)
            cpp[m] = cpp_run(out, size, threads, [m])[m]
            py[m] = python_run(out, threads).get(m)
        base_cpp, base_py = float(cpp["fp32"]["tokens_per_s"]), float(py["fp32"]["tokens_per_s"])
        for m in modes:
            c, p = cpp[m], py[m]
            tok = float(c["tokens_per_s"])
            ptok = float(p["tokens_per_s"]) if p else float("nan")
            flops = tok * flops_per_token(size, int(c["params"]))
            peak, train = mb(c)
            ppeak, ptrain = mb(p) if p else (float("nan"), float("nan"))
            row = dict(size=size, threads=threads, mode=m, val_loss=float(c["val_loss"]),
                       val_vs_fp32=float(c["val_loss"]) / float(cpp["fp32"]["val_loss"]),
                       tokens_per_s=tok, vs_fp32=tok / base_cpp, python_tokens_per_s=ptok,
                       python_vs_fp32=ptok / base_py, vs_python=tok / ptok, peak_mb=peak,
                       python_peak_mb=ppeak, train_mb=train, python_train_mb=ptrain,
                       ceiling=flops / ceilings[(m, threads)])
            results.append(row)

# Activation checkpointing on the first size, one thread: fp32 and bf16
# without and with --checkpoint-layers, alternately for --checkpoint-rounds
# rounds (the medians of the step times; the VM's noise between processes
# is 10-20%), on both sides; then bf16 once more with glibc's heap trimming
# and mmap threshold raised for both languages alike (MALLOC_*_ below): a
# checkpointed forward frees a block's activations at its end, and glibc
# returns them to the kernel, which zeroes fresh pages for the next block.
MALLOC_TUNED = {"MALLOC_TRIM_THRESHOLD_": str(1 << 32), "MALLOC_MMAP_THRESHOLD_": str(1 << 28),
                "MALLOC_TOP_PAD_": str(1 << 28)}
size, threads = sizes[0], threads_list[0]
checkpointed = []


def checkpoint_rounds(m, rounds, env_extra, tag):
    runs = {(who, ck): [] for who in ("C++", "Python") for ck in (False, True)}
    for r in range(rounds):
        for ck in (False, True):
            out = os.path.join(work, "%s-%dt-%s-%s-ck%d-r%d" % (size, threads, m, tag, ck, r))
            shutil.rmtree(out, ignore_errors=True)
            extra = ["--checkpoint-layers"] if ck else []
            runs[("C++", ck)].append(cpp_run(out, size, threads, [m], extra, opts.checkpoint_steps,
                                             env_extra)[m])
            runs[("Python", ck)].append(python_run(out, threads, env_extra)[m])
    for who in ("C++", "Python"):
        def med(ck, key):
            return statistics.median(float(row[key]) for row in runs[(who, ck)])
        checkpointed.append(dict(mode=m, who=who, tag=tag, rounds=rounds,
                                 peak=(med(False, "peak_rss_mb"), med(True, "peak_rss_mb")),
                                 train=(med(False, "peak_rss_mb") - med(False, "start_rss_mb"),
                                        med(True, "peak_rss_mb") - med(True, "start_rss_mb")),
                                 step=(med(False, "step_ms"), med(True, "step_ms"))))


for m in ("fp32", "bf16"):
    checkpoint_rounds(m, opts.checkpoint_rounds, None, "default")
checkpoint_rounds("bf16", 1, MALLOC_TUNED, "malloc-tuned")

print("\nmatmul 2048x768 @ 768x3072, GFLOP/s: " + ", ".join(
    "%s %dt %.0f" % (d, t, ceilings[(d, t)] / 1e9) for d in ("fp32", "bf16", "fp16+scaler")
    for t in threads_list))
print("\n| size | threads | mode | val loss (vs fp32) | tokens/s | vs fp32 | Python tokens/s | "
      "vs Python | peak MB (Python) | train MB (Python) | of matmul ceiling |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in results:
    print("| %s | %d | %s | %.4f (%.3f) | %.0f | %.2fx | %.0f | %.2fx | %.0f (%.0f) | %.0f (%.0f) | "
          "%.0f%% |" % (r["size"], r["threads"], r["mode"], r["val_loss"], r["val_vs_fp32"],
                        r["tokens_per_s"], r["vs_fp32"], r["python_tokens_per_s"], r["vs_python"],
                        r["peak_mb"], r["python_peak_mb"], r["train_mb"], r["python_train_mb"],
                        100 * r["ceiling"]))
print()
for c in checkpointed:
    (pk, ck_pk), (tr, ck_tr), (st, ck_st) = c["peak"], c["train"], c["step"]
    print("--checkpoint-layers, %s (%s, %s, %d thread, %s, median of %d): peak %.0f -> %.0f MB "
          "(%.2fx), train memory %.0f -> %.0f MB (%.2fx), step %.0f -> %.0f ms (%.2fx)"
          % (c["who"], size, c["mode"], threads, c["tag"], c["rounds"], pk, ck_pk, ck_pk / pk, tr,
             ck_tr, ck_tr / tr, st, ck_st, ck_st / st))
with open(os.path.join(work, "bench_gpt.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(results[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(results)
print("rows: " + os.path.join(work, "bench_gpt.csv"))
