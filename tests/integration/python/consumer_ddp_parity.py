"""A user's C++ DDP program (tests/integration/consumer_ddp) against Python's DDP.

    consumer_ddp_parity.py CONSUMER WORK [NPROC]

Runs CONSUMER (built against the installed torchamp with find_package) under
torchrun (this Python's torch.distributed.run) on NPROC ranks (default 2),
and this file's own twin the same way: the same model, data and 8 steps with
torch.nn.parallel.DistributedDataParallel and torch.amp.GradScaler("cpu"),
an overflow on one rank at step 3. Two optimizers, a run of each:

  fused     C++: torchamp's fused AdamW; Python: torch.optim.AdamW(fused=True).
            Their arithmetic differs (LibTorch's AdamW formula against ATen's
            fused kernel, which uses lerp), so the parameters are compared
            within PyTorch's float32 tolerance, and the scales exactly.
  libtorch  C++: LibTorch's torch::optim::AdamW; Python: LibTorchAdamW below,
            LibTorch's step written with the same ATen operations. Parameters
            and scales bit for bit: what is left to differ is DDP, the
            GradScaler and the group.

Every rank of a run must end with the same parameters, bit for bit.
Exit 77 where this torch has no CPU GradScaler (before 2.3).
"""
import gc
import math
import os
import subprocess
import sys

import torch

TWIN = "--python-twin"


def wave(shape, freq, phase, amp):
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float32).mul(freq).add(phase).sin().mul(amp).reshape(shape)


class LibTorchAdamW(torch.optim.Optimizer):
    """torch::optim::AdamW::step (torch/csrc/api/src/optim/adamw.cpp), op for op."""

    def __init__(self, params, lr, weight_decay, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p),
                                 exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / bias_correction1)


def twin(prefix, fused):
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(wave(p.shape, 0.37 + 0.01 * i, 0.1 * i, 0.3))
    ddp = DistributedDataParallel(model)
    if fused:
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01, fused=True)
    else:
        opt = LibTorchAdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024, growth_interval=2)
    global_batch = 12
    per = global_batch // world
    with open(f"{prefix}.{rank}", "w") as out:
        for step in range(8):
            x = wave((global_batch, 8), 0.13, float(step), 1.0)[rank * per:(rank + 1) * per].clone()
            y = wave((global_batch, 4), 0.07, 2.0 * step, 1.0)[rank * per:(rank + 1) * per]
            if step == 3 and rank == world - 1:
                x[0][0] = float("inf")
            scaler.scale(nn.functional.mse_loss(ddp(x), y)).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            out.write(f"step {step} scale {scaler.get_scale():g}\n")
        for p in model.parameters():
            for v in p.detach().flatten().tolist():
                out.write(f"param {v.hex()}\n")
    # DDP holds the process group: drop it while the interpreter is whole.
    # Left to finalisation, Gloo's work thread may reach for the GIL then, and
    # Python 3.11 ends such a thread with a forced unwind: std::terminate
    # ("terminate called without an active exception"), 1 run in 6 here.
    del ddp, opt, scaler
    gc.collect()
    dist.destroy_process_group()


def hexfloat(line):
    """C's %a and Python's float.hex() spell some numbers differently."""
    if line.startswith("param "):
        return "param " + float.fromhex(line[6:]).hex()
    return line


def read(prefix, nproc):
    out = []
    for r in range(nproc):
        with open(f"{prefix}.{r}") as f:
            out.append([hexfloat(l) for l in f.read().splitlines()])
    return out


def values(lines):
    return [float.fromhex(l[6:]) for l in lines if l.startswith("param ")]


def has_libuv_store():
    from torch.distributed import TCPStore
    try:
        TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)
        return True
    except RuntimeError as e:
        if "libuv" not in str(e):
            raise
        return False


def torchrun(cmd, env, nproc):
    return subprocess.run(cmd, env=env, timeout=300).returncode


def like_torchrun(cmd, env, nproc):
    """cmd's program (after --no-python, or a Python file) on nproc ranks with
    the variables torchrun sets for its workers."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    program = cmd[cmd.index("--nproc-per-node") + 2:]
    program = program[1:] if program[0] == "--no-python" else [sys.executable] + program
    ranks = []
    for r in range(nproc):
        rank_env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc),
                        RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0",
                        ROLE_RANK=str(r), ROLE_WORLD_SIZE=str(nproc), GROUP_WORLD_SIZE="1")
        ranks.append(subprocess.Popen(program, env=rank_env))
    codes = [p.wait(timeout=300) for p in ranks]
    return next((c for c in codes if c != 0), 0)


def main():
    consumer, work = sys.argv[1], sys.argv[2]
    nproc = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 3):
        print(f"torch {torch.__version__}: no CPU GradScaler in Python before 2.3")
        return 77
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc)]
    launch = torchrun
    if not has_libuv_store():
        # Debian 13's torch 2.6 has no libuv, and its torchrun's rendezvous
        # asks for it unconditionally: it cannot start. Start the ranks with
        # the environment torchrun gives them (env://), the classic store.
        print(f"torch {torch.__version__} has no libuv TCPStore, so its torchrun cannot "
              "start: the ranks are started with torchrun's environment instead", flush=True)
        launch = like_torchrun
        env["USE_LIBUV"] = "0"
    ok = True
    for kind in ("fused", "libtorch"):
        cpp, py = os.path.join(work, f"cpp-{kind}"), os.path.join(work, f"py-{kind}")
        for r in range(nproc):
            for prefix in (cpp, py):
                if os.path.exists(f"{prefix}.{r}"):
                    os.remove(f"{prefix}.{r}")
        for cmd in (run + ["--no-python", consumer, cpp, kind], run + [__file__, TWIN, py, kind]):
            print("==", " ".join(cmd), flush=True)
            rc = launch(cmd, env, nproc)
            if rc != 0:
                print(f"FAIL: exit {rc}")
                return 1
        c, p = read(cpp, nproc), read(py, nproc)
        ranks_agree = all(x == c[0] for x in c) and all(x == p[0] for x in p)
        scales_c = [l for l in c[0] if l.startswith("step ")]
        scales_p = [l for l in p[0] if l.startswith("step ")]
        skipped = any(a.split()[-1] == b.split()[-1] for a, b in zip(scales_p, scales_p[1:]))
        vc, vp = values(c[0]), values(p[0])
        same = sum(a == b for a, b in zip(vc, vp))
        worst = max((abs(a - b) for a, b in zip(vc, vp)), default=float("inf"))
        close = len(vc) == len(vp) == 212 and all(
            abs(a - b) <= 1e-5 + 1.3e-6 * abs(b) for a, b in zip(vc, vp))
        print(f"{kind}: every rank of each run equal: {ranks_agree}; scales {scales_c == scales_p} "
              f"({'; '.join(scales_p)}); {same} of {len(vp)} parameters bit for bit equal, "
              f"largest difference {worst:.3g}")
        good = ranks_agree and skipped and scales_c == scales_p and close
        if kind == "libtorch":
            good = good and same == len(vp)
        print(f"{kind}: {'PASS' if good else 'FAIL'}")
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == TWIN:
        twin(sys.argv[2], sys.argv[3] == "fused")
    else:
        sys.exit(main())
