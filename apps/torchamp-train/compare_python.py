#!/usr/bin/env python3
"""The same training run in Python, beside a torchamp-train run.

Usage: compare_python.py RUN_DIR [--check] [--loss-rtol R]

Reads a torchamp-train run folder (options.txt, initial.pt: the C++ side's
initial weights and split, metrics.csv, summary.csv), trains every CPU mode of
it again with PyTorch's own torch.autocast and torch.amp.GradScaler("cpu")
(and fused=True optimizers where the C++ run used torchamp's fused ones),
from the same initial weights, on the same batches in the same order, and
measures what the C++ side measures (per-activation float16 underflow by the
same hooks). Writes RUN_DIR/python-metrics.csv, then compares the two runs
step by step and prints their time per training step side by side.

--check: exit 1 unless every mode's scale history and skip decisions are
identical and every step's loss agrees within --loss-rtol (relative, default
1e-3). Exit 77 when this torch has no CPU GradScaler (before 2.3).
"""
import argparse
import csv
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "common"))
from twin import load_from_cpp, read_run_options  # noqa: E402

import torch
import torch.nn.functional as F

TORCH_MINOR = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


class Net(torch.nn.Module):
    """The C++ side's network, shaped by its saved parameters (fc0..fcN, out)."""

    def __init__(self, params, activation):
        super().__init__()
        hidden = sorted((k for k in params if k.startswith("fc") and k.endswith(".weight")),
                        key=lambda k: int(k[2:].split(".")[0]))
        self.names = [k.split(".")[0] for k in hidden] + ["out"]
        for name in self.names:
            w = params[name + ".weight"]
            self.add_module(name, torch.nn.Linear(w.shape[1], w.shape[0]))
        self.load_state_dict(params)
        self.act = torch.sigmoid if activation == "sigmoid" else torch.tanh

    def forward(self, x, stats=None):
        for i, name in enumerate(self.names):
            x = getattr(self, name)(x)
            if name != "out":
                x = self.act(x)
            if stats is not None and x.requires_grad:
                x.register_hook(stats[i].add)
        return x


class Underflow:
    """As the C++ side: entries of a gradient zero (and subnormal) in float16."""

    def __init__(self):
        self.total = self.flushed = self.subnormal = 0

    def add(self, grad):
        h = grad.detach().to(torch.half).to(torch.float)
        self.total += h.numel()
        self.flushed += int(h.eq(0).sum())
        self.subnormal += int(h.ne(0).logical_and(h.abs().lt(6.103515625e-05)).sum())

    def fraction(self, n):
        return n / self.total if self.total else 0.0


def make_optimizer(params, cfg):
    lr, fused = float(cfg["lr"]), cfg["fused"] == "1"
    kw = {"fused": True} if fused else {}
    if cfg["optimizer"] == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=1e-4, **kw)
    if cfg["optimizer"] == "adam":
        return torch.optim.Adam(params, lr=lr, **kw)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, **kw)


def train_mode(mode, init, cfg):
    """One mode, as apps/torchamp-train/train.cpp's train_mode does it."""
    seed, epochs, batch = int(cfg["seed"]), int(cfg["epochs"]), int(cfg["batch-size"])
    lr = float(cfg["lr"])
    net = Net(init["params"], init["activation"])
    opt = make_optimizer(list(net.parameters()), cfg)
    scaled = mode.endswith("+scaler")
    scaler = torch.amp.GradScaler("cpu", init_scale=float(cfg["init-scale"]),
                                  growth_interval=int(cfg["growth-interval"]), enabled=scaled)
    dtype = {"fp16": torch.half, "fp16+scaler": torch.half, "bf16+scaler": torch.bfloat16}.get(mode)
    x_train, y_train = init["x_train"], init["y_train"]
    x_test, y_test = init["x_test"], init["y_test"]
    n = x_train.shape[0]
    per_epoch = (n + batch - 1) // batch
    total = per_epoch * epochs
    rows, skipped, step, train_seconds = [], 0, 0, 0.0
    for epoch in range(epochs):
        gen = torch.Generator().manual_seed(seed * 1000003 + epoch)
        order = torch.randperm(n, generator=gen)
        for b in range(per_epoch):
            start = time.perf_counter()
            idx = order[b * batch:min(n, (b + 1) * batch)]
            x, y = x_train.index_select(0, idx), y_train.index_select(0, idx)
            if init["cosine"]:
                for group in opt.param_groups:
                    group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * step / total))
            opt.zero_grad()
            stats = [Underflow() for _ in net.names]
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                logits = net(x, stats)
            loss = F.cross_entropy(logits.float(), y)
            before = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)
            if scaled:
                scaler.update()
            train_seconds += time.perf_counter() - start
            if scaled and scaler.get_scale() < before:  # a backoff: this step found an inf
                skipped += 1
            step += 1
            flushed = sum(s.flushed for s in stats)
            seen = sum(s.total for s in stats)
            rows.append({"step": step - 1, "mode": mode, "loss": loss.item(),
                         "scale": scaler.get_scale(), "skipped": skipped,
                         "underflow_fraction": flushed / seen if seen else 0.0})
    with torch.no_grad():
        accuracy = net(x_test).argmax(1).eq(y_test).double().mean().item()
    return rows, 1e3 * train_seconds / max(step, 1), accuracy


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--loss-rtol", type=float, default=1e-3)
    args = ap.parse_args()
    if TORCH_MINOR < (2, 3):
        print(f"torch {torch.__version__} has no CPU GradScaler (torch.amp.GradScaler('cpu') "
              "came with 2.3): nothing to compare")
        return 77
    cfg = read_run_options(args.run_dir)
    init = load_from_cpp(os.path.join(args.run_dir, "initial.pt"))
    cpp = read_csv(os.path.join(args.run_dir, "metrics.csv"))
    cpp_summary = {r["mode"]: r for r in read_csv(os.path.join(args.run_dir, "summary.csv"))}
    # The <dtype>-params modes have no Python counterpart: PyTorch's optimizers
    # keep no master weights (torchamp's would have to be written again in Python).
    skipped = [m for m in cfg["modes"].split(",") if "-params" in m]
    if skipped:
        print(f"not compared (no master weights in PyTorch's optimizers): {', '.join(skipped)}")
    modes = [m for m in cfg["modes"].split(",") if not m.startswith("cuda") and m not in skipped]
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads: task {cfg['task']}, "
          f"{cfg['epochs']} epochs, batch {cfg['batch-size']}, "
          f"{'fused ' if cfg['fused'] == '1' else ''}{cfg['optimizer']}, lr {cfg['lr']}")
    ok = True
    table = []
    out_rows = []
    for mode in modes:
        rows, ms, accuracy = train_mode(mode, init, cfg)
        out_rows += rows
        theirs = [r for r in cpp if r["mode"] == mode]
        # The leading steps on which the runs agree: the same scale after
        # update() and the same skip decisions; and, separately, losses
        # within the tolerance.
        same_scale, same_loss, worst, first = 0, 0, 0.0, None
        for c, p in zip(theirs, rows):
            if float(c["scale"]) != float(f"{p['scale']:.9g}"):
                first = (f"step {p['step']}: scale {c['scale']} in C++, {p['scale']:.9g} "
                         "in Python")
            elif int(c["skipped"]) != p["skipped"]:
                first = (f"step {p['step']}: {c['skipped']} skipped steps in C++, "
                         f"{p['skipped']} in Python")
            if first:
                break
            same_scale += 1
        for c, p in zip(theirs, rows):
            closs = float(c["loss"])
            rel = abs(closs - p["loss"]) / max(abs(closs), 1e-12)
            if rel > args.loss_rtol:
                first = first or f"step {p['step']}: losses {closs:.9g} and {p['loss']:.9g}"
                break
            same_loss += 1
            worst = max(worst, rel)
        if first is None and len(theirs) != len(rows):
            first = f"{len(theirs)} C++ steps, {len(rows)} Python steps"
        ok = ok and first is None
        cms = float(cpp_summary[mode]["train_step_ms"]) if mode in cpp_summary else float("nan")
        cacc = float(cpp_summary[mode]["test_accuracy"]) if mode in cpp_summary else float("nan")
        table.append((mode, cms, ms, f"{same_scale}/{len(rows)}", f"{same_loss}/{len(rows)}", worst,
                      rows[-1]["skipped"] if rows else 0, cacc, accuracy,
                      "" if first is None else first))
    with open(os.path.join(args.run_dir, "python-metrics.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out_rows[0].keys()) if out_rows else ["step"])
        w.writeheader()
        for r in out_rows:
            w.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"\n| mode | C++ (torchamp) ms/step | Python (PyTorch) ms/step | Python / C++ "
          f"| same scale and skips | losses within {args.loss_rtol:g} | max loss difference there "
          f"| skipped (Python) | test accuracy C++ / Python | first difference |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode, cms, pms, scales, losses, worst, skipped, cacc, pacc, first in table:
        print(f"| {mode} | {cms:.3f} | {pms:.3f} | {pms / cms:.2f}x | {scales} | {losses} "
              f"| {worst:.1e} | {skipped} | {100 * cacc:.2f}% / {100 * pacc:.2f}% "
              f"| {first or 'none'} |")
    print("\n(same scale and skips, losses within: the leading steps on which the runs agree so, "
          "of all steps; losses relative)")
    print(f"\nwrote {os.path.join(args.run_dir, 'python-metrics.csv')}")
    if args.check and not ok:
        print("the runs differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
