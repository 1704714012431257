#!/usr/bin/env python3
"""The same GPT run in Python, beside a torchamp-gpt run.

Usage: gpt_python.py RUN_DIR [--threads N] [--check] [--loss-atol A] [--profile N]

Reads a torchamp-gpt run folder (options.txt, initial.pt: the C++ side's
initial weights) and trains every CPU mode of it again with PyTorch's own
torch.autocast, torch.optim.AdamW(fused=True) (nanoGPT's two groups) and
torch.amp.GradScaler (fp16; GradScaler(enabled=False) elsewhere): the same
model (module names and order as apps/torchamp-gpt/model.cpp), the same
initial weights, the same batches (the same counter-based offsets), the same
dropout seeds and the same learning-rate schedule. Writes
RUN_DIR/python-metrics.csv and RUN_DIR/python-summary.csv in the C++ side's
columns; `torchamp-gpt --report RUN_DIR` then prints both runs' table and
plots both runs' curves.

The bf16-params mode runs bfloat16 parameters without master weights: the
fused AdamW of PyTorch has none (torchamp's keeps float32 masters); that is
C++'s bf16-nearest, which this script runs the same way. C++'s bf16-sr
(stochastic rounding) has no PyTorch counterpart and is not run here.

--check: exit 1 unless the two runs agree on step 0's loss within --loss-atol
(default 1e-5) in every mode both ran, and on every step's scale and skip
count in fp16+scaler. Exit 77 when this torch lacks what a mode needs (CPU
float16 autocast and GradScaler: 2.3 and newer).

--profile N: each mode's last N steps under torch.profiler (CPU, and CUDA in
the CUDA modes), each marked "step", not counted in tokens/s, into
RUN_DIR/python-trace-MODE.json: torchamp-gpt --profile's trace of the Python
side (profile_report.py RUN_DIR compares them).
"""
import argparse
import csv
import ctypes
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "common"))
from twin import load_from_cpp, read_run_options  # noqa: E402

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

MASK = (1 << 64) - 1

# mode -> (autocast dtype or None, parameter dtype, GradScaler, device). C++'s
# "+graph" modes (its step captured in a CUDA graph) have the eager mode's
# twin: Python's eager step is what they are measured against.
MODES = {
    "fp32": (None, torch.float32, False, "cpu"),
    "bf16": (torch.bfloat16, torch.float32, False, "cpu"),
    "bf16-params": (None, torch.bfloat16, False, "cpu"),
    "bf16-nearest": (None, torch.bfloat16, False, "cpu"),  # C++'s twin of Python's bf16-params
    "fp16+scaler": (torch.float16, torch.float32, True, "cpu"),
    "cuda-fp16+scaler": (torch.float16, torch.float32, True, "cuda"),
    "cuda-bf16": (torch.bfloat16, torch.float32, False, "cuda"),
}


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def offsets(seed, stream, step, first, count, length, context):
    """corpus.cpp's offsets(): the start of each window of a (micro-)batch."""
    base = splitmix64(splitmix64(seed) ^ ((stream << 62) & MASK) ^ (step & MASK))
    return [splitmix64(base ^ g) % (length - context) for g in range(first, first + count)]


class Block(torch.nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1 = torch.nn.LayerNorm(d)
        self.attn_in = torch.nn.Linear(d, 3 * d)
        self.attn_out = torch.nn.Linear(d, d)
        self.ln_2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.proj = torch.nn.Linear(4 * d, d)
        self.resid_drop = torch.nn.Dropout(dropout)
        self.mlp_drop = torch.nn.Dropout(dropout)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.attn_in(x).split(d, 2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        return self.resid_drop(self.attn_out(y.transpose(1, 2).contiguous().view(b, t, d)))

    def forward(self, x):
        h = x + self.attention(self.ln_1(x))
        return h + self.mlp_drop(self.proj(F.gelu(self.fc(self.ln_2(h)))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, context, layers, heads, d, dropout, checkpoint_layers=False):
        super().__init__()
        self.checkpoint_layers = checkpoint_layers
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(context, d)
        self.drop = torch.nn.Dropout(dropout)
        self.blocks = torch.nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            if self.checkpoint_layers and self.training:
                # torch.utils.checkpoint, as torchamp::checkpoint: the block
                # again in backward, with the same RNG state (dropout masks).
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the tied head


def lr_at(o, step):
    """train.cpp's lr_at(): linear warmup, then a cosine to min_lr."""
    lr, min_lr, warmup, steps = o["lr"], o["min_lr"], o["warmup"], o["steps"]
    if step < warmup:
        return lr * float(step + 1) / float(warmup + 1)
    ratio = min(1.0, float(step - warmup) / float(max(1, steps - warmup)))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def pin_mkl_to_one_thread():
    """What the C++ side does under --deterministic (apps/common/support.cpp)."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        fn = getattr(ctypes.CDLL(lib, mode=os.RTLD_NOLOAD), "MKL_Set_Num_Threads_Local")
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int]
    fn(1)
    return True


def peak_rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024.0
    return 0.0


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) / 1024.0
    return 0.0


def reset_peak_rss():
    """As the C++ side: glibc hands back what the last mode freed, then VmHWM resets."""
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:  # as the C++ side, a container that refuses it only loses the reset
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def read_options(run_dir):
    raw = read_run_options(run_dir)
    o = dict(raw)
    for k in ("layers", "heads", "d_model", "context", "vocab", "batch_size", "accum", "steps",
              "warmup", "eval_every", "eval_batches", "growth_interval", "seed", "world",
              "checkpoint_layers", "deterministic"):
        o[k] = int(raw[k])
    for k in ("dropout", "lr", "min_lr", "weight_decay", "clip", "init_scale"):
        o[k] = float(raw[k])
    o["modes"] = raw["modes"].split(",")
    return o


def load_corpus(path, context):
    """corpus.cpp's Corpus::load: sorted byte vocabulary, 90/10 split."""
    with open(path, "rb") as f:
        data = f.read()
    chars = sorted(set(data))
    table = torch.zeros(256, dtype=torch.long)
    table[torch.tensor(chars, dtype=torch.long)] = torch.arange(len(chars))
    ids = table[torch.frombuffer(bytearray(data), dtype=torch.uint8).long()]
    n_train = len(data) * 9 // 10
    return chars, ids[:n_train].clone(), ids[n_train:].clone()


def batch(split, starts, context):
    return (torch.stack([split[s:s + context] for s in starts]),
            torch.stack([split[s + 1:s + context + 1] for s in starts]))


def g17(v):
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else "%.17g" % v


def train_mode(name, o, init, train, val, vocab, profile, run_dir):
    autocast, param_dtype, scaled, device = MODES[name]
    cuda = device == "cuda"
    reset_peak_rss()  # as the C++ side: before the model is made
    start_rss = rss_mb()
    model = GPT(vocab, o["context"], o["layers"], o["heads"], o["d_model"], o["dropout"],
                bool(o["checkpoint_layers"]))
    model.load_state_dict(init)
    model.to(device=device, dtype=param_dtype)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(0.9, 0.95), eps=1e-8, fused=True)
    scaler = torch.amp.GradScaler(device, init_scale=o["init_scale"],
                                  growth_interval=o["growth_interval"], enabled=scaled)
    B, T, accum, world = o["batch_size"], o["context"], o["accum"], o["world"]

    def loss_of(split, starts):
        x, y = batch(split, starts, T)
        x, y = x.to(device), y.to(device)
        with torch.autocast(device, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            out = model(x)
        return F.cross_entropy(out.float().view(-1, out.size(-1)), y.view(-1))

    def validate():
        model.eval()
        with torch.no_grad():
            total = sum(loss_of(val, offsets(o["seed"], 1, 0, e * B, B, len(val), T)).item()
                        for e in range(o["eval_batches"]))
        model.train()
        return total / o["eval_batches"]

    rows, seconds, skipped, val_loss, loss = [], 0.0, 0, float("nan"), float("nan")
    one = torch.ones((), device=device)
    scale = scaler.get_scale() if scaled else 1.0
    model.train()
    profiler, mark, timed = None, None, 0
    for step in range(o["steps"]):
        lr = lr_at(o, step)
        for group in opt.param_groups:
            group["lr"] = lr
        if profile and step == o["steps"] - profile:  # as torchamp-gpt --profile: the last steps
            activities = [torch.profiler.ProfilerActivity.CPU]
            if cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            profiler = torch.profiler.profile(activities=activities)
            profiler.__enter__()
        if profiler:
            mark = torch.profiler.record_function("step")
            mark.__enter__()
        t0 = time.perf_counter()
        loss = 0.0 if not cuda else None
        # Every rank's micro-batches of the C++ run, in one process: the same
        # global batch (DDP averages the ranks' gradients, as / world here).
        for m in range(accum):
            for rank in range(world):
                micro = m * world + rank
                torch.manual_seed((o["seed"] * 1000003 + step * 1009 + micro) & MASK)
                starts = offsets(o["seed"], 0, step, micro * B, B, len(train), T)
                part = loss_of(train, starts) / accum
                if world > 1:
                    scaler.scale(part / world).backward()
                else:
                    scaler.scale(part).backward()
                if cuda:  # summed on the device, read once a step (as the C++ side)
                    loss = part.detach() if loss is None else loss + part.detach()
                else:
                    loss += part.item() / world
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        before = scale
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if cuda:  # the loss and the scale in one read back
            loss, scale = torch.stack([loss.float(), scaler.scale(one)]).tolist()
        else:
            scale = scaler.get_scale() if scaled else 1.0
        if step == 0:
            first_seconds = time.perf_counter() - t0
        elif not profiler:
            seconds += time.perf_counter() - t0
            timed += 1
        if profiler:
            mark.__exit__(None, None, None)
            if step + 1 == o["steps"]:  # before the last evaluation
                profiler.__exit__(None, None, None)
                profiler.export_chrome_trace(os.path.join(run_dir, "python-trace-%s.json" % name))
        if scaled and scale < before:
            skipped += 1
        val_loss = float("nan")
        if (step + 1) % o["eval_every"] == 0 or step + 1 == o["steps"]:
            val_loss = validate()
        rows.append([name, step, g17(loss), g17(val_loss), g17(scale), skipped, g17(lr)])
        if (step + 1) % max(1, o["steps"] // 10) == 0 or step + 1 == o["steps"]:
            print("%-12s step %5d/%d  loss %.4f  %7.0f tokens/s  scale %g  skipped %d (Python)"
                  % (name, step + 1, o["steps"], loss,
                     timed * B * accum * world * T / seconds if timed else 0.0, scale, skipped),
                  flush=True)
    params = sum(p.numel() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    tensors = sum(p.numel() * p.element_size() * 2 for p in model.parameters())
    # Over the steps after the first and before those profiled (the C++ side's
    # measure); the first alone where it ran alone.
    steps = timed
    if steps < 1:
        steps, seconds = 1, first_seconds
    summary = [name, g17(val_loss), g17(loss), skipped, g17(scaler.get_scale() if scaled else 1.0),
               g17(steps * B * accum * world * T / seconds), g17(1e3 * seconds / steps),
               g17(peak_rss_mb()), g17((state + tensors) / params), params, "-", g17(start_rss)]
    return rows, summary


def check(run_dir, atol):
    def read(name):
        with open(os.path.join(run_dir, name)) as f:
            return list(csv.DictReader(f))

    cpp, py = read("metrics.csv"), read("python-metrics.csv")
    ok = True
    for mode in sorted({r["mode"] for r in py}):
        a = [r for r in cpp if r["mode"] == mode]
        b = [r for r in py if r["mode"] == mode]
        d0 = abs(float(a[0]["loss"]) - float(b[0]["loss"]))
        print("%s: step 0 loss C++ %s Python %s (|diff| %.3g)" % (mode, a[0]["loss"], b[0]["loss"], d0))
        if mode in ("fp32", "fp16+scaler") and not d0 <= atol:
            print("FAIL: %s: step 0's losses differ by more than %g" % (mode, atol))
            ok = False
        if mode in ("fp16+scaler", "cuda-fp16+scaler"):
            sa = [(float(r["scale"]), int(r["skipped"])) for r in a]
            sb = [(float(r["scale"]), int(r["skipped"])) for r in b]
            if sa != sb:
                first = next(i for i, (x, y) in enumerate(zip(sa, sb)) if x != y)
                print("FAIL: %s: scale/skips differ from step %d: C++ %s, Python %s"
                      % (mode, first, sa[first], sb[first]))
                ok = False
            else:
                print("%s: the same scale and skip count at all %d steps (%d skipped)"
                      % (mode, len(sa), sa[-1][1]))
    return ok


def missing_features(fp16):
    """What the twin needs and this torch lacks (torch 1.13 lacks all three)."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return "scaled_dot_product_attention"
    try:
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
    except (TypeError, RuntimeError):
        return "fused CPU AdamW"
    if fp16 and not hasattr(torch.amp, "GradScaler"):
        return "CPU GradScaler"
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (default: the C++ run's, from runtime.txt)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--loss-atol", type=float, default=1e-5)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="each mode's last N steps under torch.profiler, into python-trace-MODE.json")
    args = ap.parse_args()
    o = read_options(args.run_dir)
    if not 0 <= args.profile < o["steps"]:
        ap.error("--profile %d: it must be at least 0 and less than the run's %d steps"
                 % (args.profile, o["steps"]))
    threads = args.threads
    runtime = os.path.join(args.run_dir, "runtime.txt")
    if threads == 0 and os.path.exists(runtime):
        with open(runtime) as f:
            threads = int(dict(l.strip().split("=", 1) for l in f if "=" in l).get("threads", 0))
    if threads > 0:
        torch.set_num_threads(threads)
    pinned = o["deterministic"] and pin_mkl_to_one_thread()
    modes = [m for m in o["modes"] if m in MODES
             and (MODES[m][3] == "cpu" or torch.cuda.is_available())]
    missing = missing_features("fp16+scaler" in modes)
    if missing:
        print("this torch (%s) has no %s: nothing to compare with" % (torch.__version__, missing))
        return 77
    init = load_from_cpp(os.path.join(args.run_dir, "initial.pt"))
    chars, train, val = load_corpus(o["data"], o["context"])
    vocab = init["wte.weight"].size(0)
    print("gpt_python.py, torch %s: %d + %d characters (%d distinct); %d thread(s)%s"
          % (torch.__version__, len(train), len(val), len(chars), torch.get_num_threads(),
             ", MKL pinned to one" if pinned else ""), flush=True)
    metrics, summaries = [], []
    for name in modes:
        rows, summary = train_mode(name, o, init, train, val, vocab, args.profile, args.run_dir)
        metrics += rows
        summaries.append(summary)
    with open(os.path.join(args.run_dir, "python-metrics.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["mode", "step", "loss", "val_loss", "scale", "skipped", "lr"])
        w.writerows(metrics)
    with open(os.path.join(args.run_dir, "python-summary.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["mode", "val_loss", "train_loss", "skipped", "final_scale", "tokens_per_s",
                    "step_ms", "peak_rss_mb", "bytes_per_param", "params", "weights",
                    "start_rss_mb"])
        w.writerows(summaries)
    if args.check:
        return 0 if check(args.run_dir, args.loss_atol) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
