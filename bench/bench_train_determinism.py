"""What torchamp-train's reproducibility costs: the time per training step
with --deterministic (the default: MKL's calls on one thread, ATen's own
kernels on their usual threads) against --nondeterministic (MKL on its default
threads), per precision mode. Only the float32 matmuls of an MKL build (the
wheels') change; a LibTorch without MKL runs the same code both ways.

    python3 bench/bench_train_determinism.py APP [--epochs N] [--repeats R]

APP: build/apps/torchamp-train/torchamp-train (Debian's LibTorch) or
build-2.13/apps/torchamp-train/torchamp-train (the wheel's). The two settings
run alternately, R times each, on the default task's modes; the table gives
the median of summary.csv's train_step_ms (forward to update) per mode and
setting and their ratio, measured in the same invocation, on the same
machine state. It also runs the deterministic setting's command twice more
and says whether the metrics were identical.
"""
import argparse
import csv
import filecmp
import os
import shutil
import statistics
import subprocess
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("app")
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--repeats", type=int, default=5)
opts = parser.parse_args()
MODES = ["fp32", "fp16", "fp16+scaler", "bf16+scaler"]
SETTINGS = ["--deterministic", "--nondeterministic"]


def run(setting, keep=None):
    out = keep or tempfile.mkdtemp(prefix="bench-det-")
    subprocess.run([opts.app, "--epochs", str(opts.epochs), "--modes", ",".join(MODES),
                    setting, "--out", out], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.csv")) as f:
        steps = {row["mode"]: float(row["train_step_ms"]) for row in csv.DictReader(f)}
    if keep is None:
        shutil.rmtree(out)
    return steps


times = {s: {m: [] for m in MODES} for s in SETTINGS}
for _ in range(opts.repeats):
    for setting in SETTINGS:
        for mode, ms in run(setting).items():
            times[setting][mode].append(ms)

work = tempfile.mkdtemp(prefix="bench-det-same-")
a, b = os.path.join(work, "a"), os.path.join(work, "b")
run("--deterministic", a)
run("--deterministic", b)
same = filecmp.cmp(os.path.join(a, "metrics.csv"), os.path.join(b, "metrics.csv"), shallow=False)
shutil.rmtree(work)

print(f"{opts.app}: {opts.epochs} epochs, median of {opts.repeats}, "
      f"{os.cpu_count()} cores; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
print("| mode | --deterministic (MKL on 1 thread) | --nondeterministic (MKL threads) | cost |")
print("|---|---|---|---|")
for mode in MODES:
    det = statistics.median(times["--deterministic"][mode])
    non = statistics.median(times["--nondeterministic"][mode])
    print(f"| {mode} | {det:.3f} ms | {non:.3f} ms | {det / non:.2f}x |")
print(f"two more deterministic runs wrote {'identical' if same else 'DIFFERENT'} metrics")
