"""torchamp::checkpoint against Python's torch.utils.checkpoint, bit for bit.

Run: python3 checkpoint_parity.py CHECKPOINT_PARITY_TOOL WORKDIR

The tool (tests/integration/tools/checkpoint_parity.cpp) trains one step of a model with
dropout under bfloat16 autocast (and in float32), checkpointed in C++, and
writes its parameters, data and gradients. Here the same model with those
parameters takes the same step through torch.utils.checkpoint, with
use_reentrant=False (Python's recommended form) and True, from the same
seeds. torchamp gives the non-reentrant gradients exactly; the reentrant
ones equal them too, except where the reentrant form gives none (every
checkpointed segment's parameters when the input needs no grad).
"""
import os
import subprocess
import sys
import unittest
import warnings

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from interop_util import TORCH_MINOR, check_same_version_as_libtorch, load_from_cpp

TOOL, WORK = sys.argv[1], sys.argv[2]
del sys.argv[1:3]


def make_model(params):
    """tests/integration/tools/checkpoint_parity.cpp's make_model(), with its parameters."""
    m = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.25), nn.Linear(64, 64),
                      nn.Tanh(), nn.Dropout(0.1), nn.Linear(64, 64), nn.ReLU(),
                      nn.Linear(64, 8))
    with torch.no_grad():
        for p, v in zip(m.parameters(), params):
            p.copy_(v)
    return m


def sequential(functions, segments, x, reentrant):
    """checkpoint_sequential; on 1.13, whose checkpoint_sequential has no
    use_reentrant, the same partition through checkpoint() (2.x's code)."""
    if TORCH_MINOR >= (2, 0):
        return checkpoint_sequential(functions, segments, x, use_reentrant=reentrant)
    children = list(functions.children())
    size = len(children) // segments

    def run(start, end):
        def forward(h):
            for j in range(start, end + 1):
                h = children[j](h)
            return h
        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        x = checkpoint(run(start, end), x, use_reentrant=reentrant)
    return run(end + 1, len(children) - 1)(x)


def grads(m, x):
    out = [p.grad for p in m.parameters()]
    if x.requires_grad:
        out.append(x.grad)
    return out


class CheckpointParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        check_same_version_as_libtorch()
        os.makedirs(WORK, exist_ok=True)
        path = os.path.join(WORK, "checkpoint_parity.pt")
        subprocess.run([TOOL, path], check=True)
        cls.cpp = load_from_cpp(path)

    def assert_bitwise(self, ours, theirs, what, allow_none_in_theirs=()):
        self.assertEqual(len(ours), len(theirs), what)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if i in allow_none_in_theirs:
                self.assertIsNone(b, f"{what}: Python's reentrant form gave tensor {i} a gradient")
                self.assertIsNotNone(a, f"{what}: tensor {i}")
                continue
            if b is None:
                self.assertIsNone(a, f"{what}: tensor {i}")
                continue
            self.assertIsNotNone(a, f"{what}: tensor {i} has no gradient in C++")
            self.assertEqual(a.dtype, b.dtype, f"{what}: tensor {i}")
            if not torch.equal(a, b):
                self.fail(f"{what}: tensor {i} differs, largest difference "
                          f"{(a - b).abs().max().item():.3g}")

    def sequential_case(self, amp, input_grad, reentrant):
        m = make_model(self.cpp["params"])
        x = self.cpp["x"].clone().requires_grad_(input_grad)
        torch.manual_seed(5)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # reentrant: "None of the inputs have requires_grad"
            y = sequential(m, 3, x, reentrant)
        y.float().pow(2).sum().backward()
        return grads(m, x)

    def test_checkpoint_sequential(self):
        for amp in (True, False):
            for input_grad in (False, True):
                name = ("sequential" + ("_bf16" if amp else "_fp32")
                        + ("_grad_input" if input_grad else "_plain_input"))
                ours = self.cpp[name]
                self.assert_bitwise(ours, self.sequential_case(amp, input_grad, False),
                                    name + " vs use_reentrant=False")
                # The reentrant form on a plain input: neither checkpointed
                # segment (Linear 0, then Linear 3, whose input comes out of
                # the first without grad) gets anything.
                none = () if input_grad else (0, 1, 2, 3)
                self.assert_bitwise(ours, self.sequential_case(amp, input_grad, True),
                                    name + " vs use_reentrant=True", none)

    def test_function_with_two_inputs_and_two_outputs(self):
        for reentrant in (False, True):
            m = make_model(self.cpp["params"])
            x = self.cpp["x"].clone().requires_grad_(True)
            b = self.cpp["b"]
            first = m[0]

            def fn(a, g):
                h = torch.dropout(first(a), 0.3, True) * g.sigmoid()
                return h.tanh(), h.sum(1)

            torch.manual_seed(5)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                u, v = checkpoint(fn, x, b, use_reentrant=reentrant)
            (u.float().pow(2).sum() + v.float().sum()).backward()
            self.assert_bitwise(self.cpp["function_two_outputs"], grads(m, x),
                                f"function_two_outputs vs use_reentrant={reentrant}")


if __name__ == "__main__":
    unittest.main()
