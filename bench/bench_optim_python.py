#!/usr/bin/env python3
"""Python's own optimizer steps beside torchamp's, in one invocation.

    python bench/bench_optim_python.py build-2.13/bench/bench_optim [--rounds 9] [--threads 1]

Times torch.optim.AdamW(fused=True) and AdamW(foreach=True), each with
torch.amp.GradScaler("cpu") (scaler.step + scaler.update, as a training loop
calls them), on bench_optim's cases (1 x 64M and 10,000 x 100 float32
parameters), every variant once per round and medians over the rounds, then
runs `bench_optim --interleaved` (torchamp's AdamW + scaler and ATen's
_fused_adamw_ driven from C++) and prints both, then the README's speed
table made of them (its "vs" columns: their time over torchamp's; the
masters': float32's over theirs). The scale alternates 2 and
0.5 as in bench_optim: a fused step writes the gradients back divided by it.
"""
import argparse
import statistics
import subprocess
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402

CASES = [("1x64M", 1, 64 << 20), ("10000x100", 10000, 100)]


def make(tensors, elements):
    torch.manual_seed(0)
    ps = []
    for _ in range(tensors):
        p = torch.nn.Parameter(torch.randn(elements))
        p.grad = torch.randn(elements) * 1e-3
        ps.append(p)
    return ps


def variant(tensors, elements, **kw):
    ps = make(tensors, elements)
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, **kw)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    scaler.scale(torch.ones(()))  # creates its scale tensor, as the first scale(loss) does
    state = {"i": 1}

    def step():
        scaler.step(opt)
        scaler.update(2.0 if state["i"] & 1 else 0.5)
        state["i"] += 1

    step()  # the first step creates the state
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_optim")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s), medians of rounds "
          "(every variant once per round)")
    print()
    print("| case | Python AdamW(fused=True) + GradScaler ms | Python AdamW(foreach=True) + GradScaler ms |")
    print("|---|---|---|")
    python_fused = {}
    for name, tensors, elements in CASES:
        vs = {"fused": variant(tensors, elements, fused=True),
              "foreach": variant(tensors, elements, foreach=True)}
        ms = {k: [] for k in vs}
        rounds = a.rounds if tensors == 1 else 3 * a.rounds
        for r in range(rounds):
            for k in (list(vs) if r % 2 == 0 else list(vs)[::-1]):
                t0 = time.perf_counter()
                vs[k]()
                ms[k].append((time.perf_counter() - t0) * 1e3)
        print(f"| {name} | {statistics.median(ms['fused']):.2f} | "
              f"{statistics.median(ms['foreach']):.2f} |")
        python_fused[name] = statistics.median(ms["fused"])
        del vs
    print()
    out = subprocess.run([a.bench_optim, f"--threads={a.threads}", "--interleaved"],
                         check=True, capture_output=True, text=True).stdout
    print("\n".join(line for line in out.splitlines() if line.strip()))
    readme_table(out, python_fused)


def readme_table(out, python_fused):
    """The README's speed table, from bench_optim's first interleaved table and Python's rows."""
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break  # the next table
        rows[cells[0]] = dict(zip(header, cells))
    print()
    print("| case | torchamp AdamW + scaler | vs LibTorch's AdamW | vs ATen's `_fused_adamw_` | "
          "vs Python's `AdamW(fused=True)` | bf16 / fp16 masters + scaler, of float32 |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        ours = float(row["fp32 AdamW+scaler ms"])
        print(f"| {name} | {ours:.1f} ms | {row['torchamp vs LibTorch']} | "
              f"{row['torchamp vs ATen']} | {python_fused[name] / ours:.2f}x | "
              f"{row['bf16 master +scaler']} / {row['fp16 master +scaler']} |")


if __name__ == "__main__":
    main()
