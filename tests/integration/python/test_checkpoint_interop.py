"""Checkpoints cross between torchamp (C++) and a real Python torch.

Run: python3 test_checkpoint_interop.py CHECKPOINT_TOOL CHECKPOINT_EXAMPLE WORKDIR

Before 2.3, Python's torch.cuda.amp.GradScaler disables itself on a machine without CUDA
(amp_definitely_not_available()). Nothing it does in load_state_dict,
state_dict or the getters needs CUDA, so the test constructs it enabled by
patching that one availability check while constructing; every method used
afterwards is the unmodified PyTorch code. From 2.3 on the test uses
torch.amp.GradScaler("cpu") as it is. The Python torch must be the version of
the LibTorch under test (TORCHAMP_LIBTORCH_VERSION).
"""
import os
import subprocess
import sys
import unittest
from unittest import mock

import torch

from interop_util import TORCH_MINOR, check_same_version_as_libtorch, load_from_cpp

TOOL, EXAMPLE, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
del sys.argv[1:4]


def enabled_python_scaler(**kwargs):
    if TORCH_MINOR >= (2, 3):
        # PyTorch 2.3+ has a real CPU GradScaler: nothing to patch.
        scaler = torch.amp.GradScaler("cpu", **kwargs)
    else:
        import torch.cuda.amp.grad_scaler as grad_scaler_module

        with mock.patch.object(grad_scaler_module, "amp_definitely_not_available", lambda: False):
            scaler = torch.cuda.amp.GradScaler(**kwargs)
    assert scaler.is_enabled()
    return scaler


def run_tool(*args):
    out = subprocess.run([TOOL, *args], check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


class CheckpointInterop(unittest.TestCase):
    def test_cpp_state_dict_loads_into_python_grad_scaler(self):
        path = os.path.join(WORK, "from_cpp.pt")
        cpp = run_tool("write-state", path)
        state = load_from_cpp(path)
        self.assertEqual(state["scale"], 1024.0)
        self.assertIsInstance(state["_growth_tracker"], int)
        scaler = enabled_python_scaler()
        scaler.load_state_dict(state)
        self.assertEqual(scaler.get_scale(), float(cpp["scale"]))
        self.assertEqual(scaler.get_growth_factor(), float(cpp["growth_factor"]))
        self.assertEqual(scaler.get_backoff_factor(), float(cpp["backoff_factor"]))
        self.assertEqual(scaler.get_growth_interval(), int(cpp["growth_interval"]))
        self.assertEqual(scaler._get_growth_tracker(), int(cpp["growth_tracker"]))
        self.assertEqual(scaler._get_growth_tracker(), 3)

    def test_python_state_dict_loads_into_cpp(self):
        scaler = enabled_python_scaler(init_scale=2.0 ** 10, growth_factor=4.0,
                                       backoff_factor=0.125, growth_interval=9)
        state = scaler.state_dict()
        state["_growth_tracker"] = 5  # as after five clean steps
        path = os.path.join(WORK, "from_python.pt")
        torch.save(state, path)
        cpp = run_tool("read-state", path)
        self.assertEqual(float(cpp["scale"]), 1024.0)
        self.assertEqual(float(cpp["growth_factor"]), 4.0)
        self.assertEqual(float(cpp["backoff_factor"]), 0.125)
        self.assertEqual(int(cpp["growth_interval"]), 9)
        self.assertEqual(int(cpp["growth_tracker"]), 5)
        # Python's dict has none of our extra keys: they keep their defaults.
        self.assertEqual(int(cpp["backoff_interval"]), 1)
        self.assertEqual(cpp["dynamic"], "1")

    def test_every_key_survives_python_load_and_save_of_the_dict(self):
        # The dict itself through Python: torch.load, then torch.save of what
        # it returned, read back by C++. Every key of both schemas is at a
        # non-default value, so a dropped or retyped key shows.
        for write, read, types in (
                ("write-all-state", "read-state",
                 {"scale": float, "growth_factor": float, "backoff_factor": float,
                  "growth_interval": int, "_growth_tracker": int, "backoff_interval": int,
                  "_backoff_tracker": int, "dynamic": bool, "min_scale": float,
                  "max_consecutive_skips": int, "_consecutive_skips": int}),
                ("write-paddle-state", "read-paddle-state",
                 {"scale": torch.Tensor, "incr_ratio": float, "decr_ratio": float,
                  "incr_every_n_steps": int, "decr_every_n_nan_or_inf": int,
                  "incr_count": int, "decr_count": int, "use_dynamic_loss_scaling": bool})):
            with self.subTest(schema=write):
                path = os.path.join(WORK, write + ".pt")
                cpp = run_tool(write, path)
                state = load_from_cpp(path)
                self.assertEqual(sorted(state), sorted(types))
                for key, cls in types.items():
                    self.assertIsInstance(state[key], cls, key)
                back = os.path.join(WORK, write + "-from-python.pt")
                torch.save(dict(state), back)
                self.assertEqual(run_tool(read, back), cpp)

    def test_readme_round_trip_through_examples_checkpoint(self):
        # docs/checkpoints.md's two snippets: Python saves, examples/checkpoint.cpp
        # loads and writes back, Python loads.
        scaler = enabled_python_scaler(init_scale=512.0, growth_interval=100)
        from_python = os.path.join(WORK, "from_python_example.pt")
        to_python = os.path.join(WORK, "to_python_example.pt")
        torch.save(scaler.state_dict(), from_python)
        out = subprocess.run([EXAMPLE, from_python, to_python], check=True,
                             capture_output=True, text=True).stdout
        self.assertIn("loaded scale 512 growth_interval 100", out)
        back = enabled_python_scaler()
        back.load_state_dict(load_from_cpp(to_python))
        self.assertEqual(back.get_scale(), 512.0)
        self.assertEqual(back.get_growth_interval(), 100)


if __name__ == "__main__":
    check_same_version_as_libtorch()
    os.makedirs(WORK, exist_ok=True)
    unittest.main()
