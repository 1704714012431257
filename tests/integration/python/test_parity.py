"""Parity with PyTorch's own CPU GradScaler (torch.amp.GradScaler("cpu"), 2.3+).

Run: python test_parity.py PARITY_TOOL WORKDIR

Random sequences (TORCHAMP_PARITY_SEQUENCES, default 1000; seed
TORCHAMP_PARITY_SEED, default 0) of what a training loop does with a scaler:
several SGD optimizers with different options (momentum, dampening, nesterov,
weight decay) and, from PyTorch 2.4, AdamW(fused=True) ones (torchamp's fused
AdamW on ATen's path, FusedOptions().aten_kernels, on the C++ side), float32 and bfloat16 parameters, gradients set as
scaler.scale(raw) with inf/NaN injected at random steps and tensors, some
gradients absent, unscale_ before step for some optimizers, some optimizers
not stepped, update() or update(new_scale), and state_dict/load_state_dict
into a fresh scaler midway. Python's GradScaler runs each sequence here;
tests/integration/tools/parity_tool.cpp runs the same sequences through
torchamp::GradScaler (twice: its state on the host, and in tensors with
GradScalerOptions().device_state, the path a CUDA scaler takes) and an SGD that performs torch.optim.SGD's single-tensor
operations in C++ (a torch::optim::SGD subclass). After every step the two
must agree bit for bit: the scale, the growth tracker, which optimizers
stepped, every gradient (as unscaled) and every parameter, with one
exception: the bit pattern of a NaN. ATen's own CPU kernels write a bfloat16
NaN as 0xFFFF in their vectorised body and 0x7FC0 in their scalar tail (so
PyTorch's result depends on the element's position and the machine's vector
width); torchamp writes 0x7FC0. NaNs must be in the same places; the test
counts payload differences and prints the count.

Not LibTorch's own C++ SGD: its bfloat16 update rounds differently from
Python's in the last bit (this test found it), and its Adam uses mul_/add_
where Python uses lerp_; the scaler is what is compared here.
"""
import os
import random
import subprocess
import sys
import unittest

import torch

from interop_util import TORCH_MINOR, check_same_version_as_libtorch, load_from_cpp

TOOL, WORK = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
SEQUENCES = int(os.environ.get("TORCHAMP_PARITY_SEQUENCES", "1000"))
SEED = int(os.environ.get("TORCHAMP_PARITY_SEED", "0"))
# Python's AdamW(fused=True) on CPU tensors (2.4+): some optimizers are that,
# against torchamp::optim::AdamW on ATen's path.
FUSED_ADAMW = TORCH_MINOR >= (2, 4)


def make_sequence(rng):
    """One random sequence: configuration, initial parameters, steps."""
    growth_factor = rng.choice([2.0, 2.0, 4.0, 1.5, 3.0])
    backoff_factor = rng.choice([0.5, 0.5, 0.25, 0.75, 0.3])
    cfg = {
        "init_scale": rng.choice([65536.0, 1024.0, 2.0 ** 24, 3.0, 1e-3, 3e38]),
        "growth_factor": growth_factor,
        "backoff_factor": backoff_factor,
        "growth_interval": rng.choice([1, 2, 3, 5]),
    }
    dtype = rng.choice([torch.float32, torch.float32, torch.bfloat16])
    opts, params = [], []
    for _ in range(rng.randint(1, 3)):
        if FUSED_ADAMW and rng.random() < 0.3:
            opts.append({
                "kind": "adamw_fused",
                "lr": rng.choice([0.1, 0.01, 1e-3]),
                "betas": list(rng.choice([(0.9, 0.999), (0.8, 0.99)])),
                "weight_decay": rng.choice([0.0, 1e-2]),
                "amsgrad": rng.random() < 0.3,
            })
        else:
            momentum = rng.choice([0.0, 0.9])
            nesterov = momentum > 0 and rng.random() < 0.3
            opts.append({
                "lr": rng.choice([0.1, 0.01, 1e-3]),
                "momentum": momentum,
                "dampening": 0.0 if nesterov else rng.choice([0.0, 0.1]),
                "weight_decay": rng.choice([0.0, 1e-2]),
                "nesterov": nesterov,
            })
        group = []
        for _ in range(rng.randint(1, 4)):
            shape = rng.choice([(1,), (7,), (3, 5), (64,), (2, 3, 4)])
            # A parameter's dtype may differ from the sequence's (mixed lists).
            pdtype = dtype if rng.random() < 0.8 else torch.float32
            group.append(torch.randn(shape).to(pdtype))
        params.append(group)
    steps = []
    for _ in range(rng.randint(3, 25)):
        grads = []
        for group in params:
            g_list = []
            for p in group:
                if rng.random() < 0.1:
                    g_list.append(None)
                    continue
                g = (torch.randn(p.shape) * rng.choice([1e-3, 1.0, 30.0])).to(p.dtype)
                if rng.random() < 0.08:
                    flat = g.view(-1)
                    flat[rng.randrange(flat.numel())] = rng.choice(
                        [float("inf"), float("-inf"), float("nan")])
                g_list.append(g)
            if all(g is None for g in g_list):  # every stepped optimizer has a gradient
                g_list[0] = torch.randn(group[0].shape).to(group[0].dtype)
            grads.append(g_list)
        n = len(params)
        stepped = [i for i in range(n) if i == 0 or rng.random() < 0.85]
        rng.shuffle(stepped)
        unscale = [i for i in stepped if rng.random() < 0.4]
        new_scale = None
        if rng.random() < 0.08:
            new_scale = rng.choice([1.0, 256.0, 1000.0, 0.125, 12345.678])
        steps.append({
            "grads": grads,
            "unscale": unscale,
            "step": stepped,
            "new_scale": new_scale,
            "reload": rng.random() < 0.1,
        })
    return {"cfg": cfg, "opts": opts, "params": params, "steps": steps}


def found_inf(scaler, opt):
    state = scaler._per_optimizer_states[id(opt)]
    return sum(v.item() for v in state["found_inf_per_device"].values()) != 0


def run_python(seq):
    """PyTorch's GradScaler and SGD over one sequence; the trace after each step."""
    params = [[p.clone().requires_grad_() for p in group] for group in seq["params"]]
    opts = [torch.optim.AdamW(group, lr=o["lr"], betas=o["betas"], weight_decay=o["weight_decay"],
                              amsgrad=o["amsgrad"], fused=True)
            if o.get("kind") == "adamw_fused" else
            torch.optim.SGD(group, lr=o["lr"], momentum=o["momentum"], dampening=o["dampening"],
                            weight_decay=o["weight_decay"], nesterov=o["nesterov"])
            for group, o in zip(params, seq["opts"])]
    cfg = seq["cfg"]
    scaler = torch.amp.GradScaler("cpu", **cfg)
    trace = []
    for step in seq["steps"]:
        for group, grads in zip(params, step["grads"]):
            for p, g in zip(group, grads):
                p.grad = None if g is None else scaler.scale(g)
        for i in step["unscale"]:
            scaler.unscale_(opts[i])
        stepped = []
        for i in step["step"]:
            scaler.step(opts[i])
            stepped.append(not found_inf(scaler, opts[i]))  # what step() decided
        grads_after = [[p.grad.detach().clone() if p.grad is not None else None for p in group]
                       for group in params]
        if step["new_scale"] is None:
            scaler.update()
        else:
            scaler.update(step["new_scale"])
        if step["reload"]:
            fresh = torch.amp.GradScaler("cpu")
            fresh.load_state_dict(scaler.state_dict())
            scaler = fresh
        trace.append({
            "scale": scaler.get_scale(),
            "growth_tracker": scaler._get_growth_tracker(),
            "stepped": stepped,
            "grads": grads_after,
            "params": [[p.detach().clone() for p in group] for group in params],
        })
    return trace


def bits(t):
    """A tensor's bytes as integers, so NaN payloads and signed zeros count."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype]
    return t.contiguous().view(view)


class ParityWithPyTorch(unittest.TestCase):
    def test_torchamp_matches_pytorch_bit_for_bit(self):
        rng = random.Random(SEED)
        torch.manual_seed(SEED)
        sequences = [make_sequence(rng) for _ in range(SEQUENCES)]
        # torchamp twice: the scaler's state on the host (the CPU default),
        # and in tensors (device_state: the path a CUDA scaler takes).
        runs = {}
        for device_state in (False, True):
            spec = os.path.join(WORK, f"parity_spec_{int(device_state)}.pt")
            out = os.path.join(WORK, f"parity_cpp_{int(device_state)}.pt")
            torch.save({"sequences": sequences, "device_state": device_state}, spec)
            subprocess.run([TOOL, spec, out], check=True)
            runs[device_state] = load_from_cpp(out)["traces"]
            self.assertEqual(len(runs[device_state]), len(sequences))
        pythons = [run_python(seq) for seq in sequences]
        for device_state, cpp in runs.items():
            with self.subTest(device_state=device_state):
                self.compare(sequences, pythons, cpp, device_state)

    def compare(self, sequences, pythons, cpp, device_state):

        steps = skipped = grown = backed_off = reloads = tensors = nan_payloads = 0
        for s, (seq, theirs) in enumerate(zip(sequences, cpp)):
            ours_py = pythons[s]
            self.assertEqual(len(theirs), len(ours_py), f"sequence {s}")
            prev_scale = seq["cfg"]["init_scale"]
            for k, (py, cc) in enumerate(zip(ours_py, theirs)):
                where = f"sequence {s} step {k}"
                self.assertEqual(py["scale"], cc["scale"], where + ": scale")
                self.assertEqual(py["growth_tracker"], cc["growth_tracker"], where + ": tracker")
                self.assertEqual(py["stepped"], list(cc["stepped"]), where + ": skip decisions")
                for name in ("grads", "params"):
                    for o, (pg, cg) in enumerate(zip(py[name], cc[name])):
                        for j, (a, b) in enumerate(zip(pg, cg)):
                            what = f"{where}: {name}[{o}][{j}]"
                            if a is None or b is None:
                                self.assertTrue(a is None and b is None, what)
                                continue
                            self.assertEqual(a.dtype, b.dtype, what)
                            nan = torch.isnan(a)
                            self.assertTrue(torch.equal(nan, torch.isnan(b)), f"{what}: NaN places")
                            # The message only on a failure: printing every tensor
                            # compared took more than half of this test's time.
                            if not torch.equal(bits(a)[~nan], bits(b)[~nan]):
                                self.fail(f"{what}: python {a} torchamp {b}")
                            nan_payloads += int((bits(a)[nan] != bits(b)[nan]).sum())
                            tensors += 1
                steps += 1
                skipped += py["stepped"].count(False)
                if seq["steps"][k]["new_scale"] is None:
                    grown += py["scale"] > prev_scale
                    backed_off += py["scale"] < prev_scale
                reloads += seq["steps"][k]["reload"]
                prev_scale = py["scale"]
        fused = sum(o.get("kind") == "adamw_fused" for seq in sequences for o in seq["opts"])
        print(f"parity ({'state in tensors' if device_state else 'state on the host'}): "
              f"{len(sequences)} sequences ({fused} fused AdamW optimizers among them), {steps} steps, {skipped} skipped optimizer "
              f"steps, {grown} growths, {backed_off} backoffs, {reloads} reloads, {tensors} "
              f"tensors compared bit for bit: no difference (NaN payloads aside: {nan_payloads} "
              f"NaN elements with another bit pattern)")
        # The sequences exercise what they claim to.
        self.assertGreater(skipped, 0)
        self.assertGreater(grown, 0)
        self.assertGreater(backed_off, 0)
        self.assertGreater(reloads, 0)
        self.assertTrue(fused > 0 or not FUSED_ADAMW)


if __name__ == "__main__":
    check_same_version_as_libtorch()
    if TORCH_MINOR < (2, 3):
        print("PyTorch", torch.__version__, "has no CPU GradScaler (2.3+): nothing to compare")
        sys.exit(77)
    os.makedirs(WORK, exist_ok=True)
    unittest.main()
