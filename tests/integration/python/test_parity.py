"""Parity with PyTorch's own CPU GradScaler (torch.amp.GradScaler("cpu"), 2.3+).

Run: python test_parity.py PARITY_TOOL WORKDIR

Random sequences (TORCHAMP_PARITY_SEQUENCES, default 1000; seed
TORCHAMP_PARITY_SEED, default 0) of what a training loop does with a scaler:
several SGD optimizers with different options (momentum, dampening, nesterov,
weight decay) and, from PyTorch 2.4, AdamW(fused=True), Adam(fused=True) and
SGD(fused=True) ones (torchamp's fused AdamW, Adam and SGD on ATen's path,
FusedOptions().aten_kernels, on the C++ side: the path a CUDA step takes,
here on CPU tensors), float32 and bfloat16 parameters, gradients set as
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
import bisect
import math
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
# Python's AdamW, Adam and SGD with fused=True on CPU tensors (2.4+): some
# optimizers are those, against torchamp::optim's on ATen's path.
FUSED = TORCH_MINOR >= (2, 4)
FUSED_KINDS = ("adamw_fused", "adam_fused", "sgd_fused")


def sgd_options(rng):
    momentum = rng.choice([0.0, 0.9])
    nesterov = momentum > 0 and rng.random() < 0.3
    return {
        "lr": rng.choice([0.1, 0.01, 1e-3]),
        "momentum": momentum,
        "dampening": 0.0 if nesterov else rng.choice([0.0, 0.1]),
        "weight_decay": rng.choice([0.0, 1e-2]),
        "nesterov": nesterov,
    }


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
        kind = rng.choice(FUSED_KINDS) if FUSED and rng.random() < 0.45 else "sgd"
        if kind == "sgd" or kind == "sgd_fused":
            opts.append(dict(sgd_options(rng), kind=kind))
        else:
            opts.append({
                "kind": kind,
                "lr": rng.choice([0.1, 0.01, 1e-3]),
                "betas": list(rng.choice([(0.9, 0.999), (0.8, 0.99)])),
                "weight_decay": rng.choice([0.0, 1e-2]),
                "amsgrad": rng.random() < 0.3,
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
        for group, o in zip(params, opts):
            # Python's fused SGD with momentum cannot take a gradient that
            # comes later than the others' (a momentum buffer list of tensors
            # and None: _fused_sgd_ raises TypeError in 2.13): every one, always.
            always = is_fused_sgd_with_momentum(o)
            g_list = []
            for p in group:
                if not always and rng.random() < 0.1:
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


class Packed:
    """A sequence's gradients and parameters after each step, packed as
    parity_tool.cpp's Packed packs torchamp's: every float32 tensor's elements
    in one tensor, every bfloat16 one's in another, and their layout as text.
    One comparison a dtype and sequence instead of one a tensor: the load and
    the comparison of 135,000 separate tensors were most of this test's time."""

    CODES = {torch.float32: "f", torch.bfloat16: "b"}

    def __init__(self):
        self.layout = []
        self.parts = {dtype: [] for dtype in self.CODES}
        self.where = {dtype: [] for dtype in self.CODES}  # (offset, what, shape) a tensor
        self.size = {dtype: 0 for dtype in self.CODES}

    def add(self, groups, name, step):
        self.layout.append(name[0] + " ")
        for o, group in enumerate(groups):
            for j, t in enumerate(group):
                if t is None:
                    self.layout.append("- ")
                    continue
                self.layout.append(self.CODES[t.dtype] + "x".join(str(d) for d in t.shape) + " ")
                self.where[t.dtype].append((self.size[t.dtype], f"step {step}: {name}[{o}][{j}]",
                                            t.shape))
                self.size[t.dtype] += t.numel()
                self.parts[t.dtype].append(t.detach().reshape(-1).clone())

    def joined(self, dtype):
        return torch.cat(self.parts[dtype]) if self.parts[dtype] else torch.empty(0, dtype=dtype)

    def tensor_at(self, dtype, index):
        """What the element `index` of joined(dtype) belongs to: (what, offset, shape)."""
        k = bisect.bisect_right([w[0] for w in self.where[dtype]], index) - 1
        offset, what, shape = self.where[dtype][k]
        return what, offset, shape


FIRST_STEP_SKIPS = [0]  # fused SGD first steps skipped (run_python)


def is_fused_sgd_with_momentum(o):
    return o["kind"] == "sgd_fused" and o["momentum"] > 0


def run_python(seq):
    """PyTorch's GradScaler and SGD over one sequence: each step's scale,
    growth tracker and skip decisions, and its gradients (as unscaled) and
    parameters, packed."""
    params = [[p.clone().requires_grad_() for p in group] for group in seq["params"]]
    def make(group, o):
        if o["kind"] in ("adamw_fused", "adam_fused"):
            cls = torch.optim.AdamW if o["kind"] == "adamw_fused" else torch.optim.Adam
            return cls(group, lr=o["lr"], betas=o["betas"], weight_decay=o["weight_decay"],
                       amsgrad=o["amsgrad"], fused=True)
        extra = {"fused": True} if o["kind"] == "sgd_fused" else {}
        return torch.optim.SGD(group, lr=o["lr"], momentum=o["momentum"],
                               dampening=o["dampening"], weight_decay=o["weight_decay"],
                               nesterov=o["nesterov"], **extra)
    opts = [make(group, o) for group, o in zip(params, seq["opts"])]
    cfg = seq["cfg"]
    scaler = torch.amp.GradScaler("cpu", **cfg)
    steps, packed = [], Packed()
    for k, step in enumerate(seq["steps"]):
        for group, grads in zip(params, step["grads"]):
            for p, g in zip(group, grads):
                p.grad = None if g is None else scaler.scale(g)
        for i in step["unscale"]:
            scaler.unscale_(opts[i])
        stepped = []
        for i in step["step"]:
            fresh = is_fused_sgd_with_momentum(seq["opts"][i]) and not opts[i].state
            scaler.step(opts[i])
            stepped.append(not found_inf(scaler, opts[i]))  # what step() decided
            if fresh and not stepped[-1]:
                # PyTorch's fused SGD makes its momentum buffers with
                # empty_like before the kernel sees the flag, and keeps them
                # when the step is skipped: the next step then uses
                # uninitialized memory as momentum (2.13; found by this test,
                # and known in the wild). torchamp, like the unfused SGD,
                # makes none: the comparison drops them.
                opts[i].state.clear()
                FIRST_STEP_SKIPS[0] += 1
        packed.add([[p.grad for p in group] for group in params], "grads", k)
        if step["new_scale"] is None:
            scaler.update()
        else:
            scaler.update(step["new_scale"])
        if step["reload"]:
            fresh = torch.amp.GradScaler("cpu")
            fresh.load_state_dict(scaler.state_dict())
            scaler = fresh
        steps.append({
            "scale": scaler.get_scale(),
            "growth_tracker": scaler._get_growth_tracker(),
            "stepped": stepped,
        })
        packed.add(params, "params", k)
    return steps, packed


def bits(t):
    """A tensor's bytes as integers, so NaN payloads and signed zeros count."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype]
    return t.contiguous().view(view)


class ParityWithPyTorch(unittest.TestCase):
    def test_torchamp_matches_pytorch_bit_for_bit(self):
        rng = random.Random(SEED)
        torch.manual_seed(SEED)
        sequences = [make_sequence(rng) for _ in range(SEQUENCES)]
        # torchamp twice in one run of the tool: the scaler's state on the host
        # (the CPU default), and in tensors (device_state: the path a CUDA
        # scaler takes).
        spec = os.path.join(WORK, "parity_spec.pt")
        out = os.path.join(WORK, "parity_cpp.pt")
        torch.save({"sequences": sequences}, spec)
        subprocess.run([TOOL, spec, out], check=True)
        both = load_from_cpp(out)
        runs = {False: both["host_state"], True: both["device_state"]}
        for cpp in runs.values():
            self.assertEqual(len(cpp), len(sequences))
        pythons = [run_python(seq) for seq in sequences]
        for device_state, cpp in runs.items():
            with self.subTest(device_state=device_state):
                self.compare(sequences, pythons, cpp, device_state)

    def compare(self, sequences, pythons, cpp, device_state):
        steps = skipped = grown = backed_off = reloads = tensors = nan_payloads = 0
        for s, (seq, theirs) in enumerate(zip(sequences, cpp)):
            py_steps, packed = pythons[s]
            self.assertEqual(len(theirs["steps"]), len(py_steps), f"sequence {s}")
            prev_scale = seq["cfg"]["init_scale"]
            for k, (py, cc) in enumerate(zip(py_steps, theirs["steps"])):
                where = f"sequence {s} step {k}"
                self.assertEqual(py["scale"], cc["scale"], where + ": scale")
                self.assertEqual(py["growth_tracker"], cc["growth_tracker"], where + ": tracker")
                self.assertEqual(py["stepped"], list(cc["stepped"]), where + ": skip decisions")
                steps += 1
                skipped += py["stepped"].count(False)
                if seq["steps"][k]["new_scale"] is None:
                    grown += py["scale"] > prev_scale
                    backed_off += py["scale"] < prev_scale
                reloads += seq["steps"][k]["reload"]
                prev_scale = py["scale"]
            # Every gradient (as unscaled) and parameter after every step: the
            # same dtypes, shapes and absent gradients, then the same bits.
            self.assertEqual("".join(packed.layout), theirs["layout"],
                             f"sequence {s}: the tensors' dtypes, shapes or absent gradients")
            for dtype in Packed.CODES:
                a, b = packed.joined(dtype), theirs[str(dtype).split(".")[1]]
                self.assertEqual(a.dtype, b.dtype, f"sequence {s}")
                nan = torch.isnan(a)
                wrong = (torch.isnan(b) != nan) | ((bits(a) != bits(b)) & ~nan)
                if bool(wrong.any()):
                    index = int(wrong.nonzero()[0])
                    what, offset, shape = packed.tensor_at(dtype, index)
                    n = math.prod(shape)
                    self.fail(f"sequence {s} {what}, element {index - offset}: python "
                              f"{a[index].item()!r} (bits {int(bits(a)[index])}), torchamp "
                              f"{b[index].item()!r} (bits {int(bits(b)[index])}); the tensors: "
                              f"python {a[offset:offset + n].view(shape)} "
                              f"torchamp {b[offset:offset + n].view(shape)}")
                nan_payloads += int((bits(a)[nan] != bits(b)[nan]).sum())
                tensors += len(packed.where[dtype])
        fused = {k: sum(o["kind"] == k for seq in sequences for o in seq["opts"])
                 for k in FUSED_KINDS}
        print(f"parity ({'state in tensors' if device_state else 'state on the host'}): "
              f"{len(sequences)} sequences (fused optimizers among them: "
              f"{', '.join(f'{n} {k[:-6]}' for k, n in fused.items())}), {steps} steps, "
              f"{skipped} skipped optimizer steps ({FIRST_STEP_SKIPS[0]} of them a fused "
              f"SGD's first: its momentum dropped in Python), "
              f"{grown} growths, {backed_off} backoffs, {reloads} reloads, {tensors} "
              f"tensors compared bit for bit: no difference (NaN payloads aside: {nan_payloads} "
              f"NaN elements with another bit pattern)")
        # The sequences exercise what they claim to.
        self.assertGreater(skipped, 0)
        self.assertGreater(grown, 0)
        self.assertGreater(backed_off, 0)
        self.assertGreater(reloads, 0)
        self.assertTrue(all(n > 0 for n in fused.values()) or not FUSED)


if __name__ == "__main__":
    check_same_version_as_libtorch()
    if TORCH_MINOR < (2, 3):
        print("PyTorch", torch.__version__, "has no CPU GradScaler (2.3+): nothing to compare")
        sys.exit(77)
    os.makedirs(WORK, exist_ok=True)
    unittest.main()
