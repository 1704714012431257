"""Python's torch (of the LibTorch version under test) loads libtorchamp and
then ATen's AMP ops work on CPU tensors: below 2.3 through torchamp's kernels,
from 2.3 on through ATen's own (torchamp registers none there).
Run: python3 test_aten_amp_ops.py LIBTORCHAMP.so"""
import sys
import unittest

import torch

from interop_util import TORCH_MINOR, check_same_version_as_libtorch

LIB = sys.argv.pop(1)


class AtenAmpOpsFromPython(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.ops.load_library(LIB)

    def test_foreach_unscale_is_bitwise_the_reference(self):
        torch.manual_seed(0)
        inv = torch.full((1,), 1.0 / 3, dtype=torch.float32)
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            grads = [torch.randn(n).to(dtype) * 100 for n in (1, 1000, 100003)]
            expected = []
            for g in grads:
                opmath = torch.float64 if dtype == torch.float64 else torch.float32
                expected.append((g.to(opmath) * inv.to(opmath)).to(dtype))
            found = torch.zeros(1)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
            self.assertEqual(found.item(), 0.0)
            for g, e in zip(grads, expected):
                self.assertTrue(torch.equal(g, e), dtype)

    def test_foreach_unscale_flags_inf_and_nan(self):
        for bad in (float("inf"), float("-inf"), float("nan")):
            grads = [torch.ones(10), torch.ones(5)]
            grads[1][4] = bad
            found = torch.zeros(1)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((1,), 0.5))
            self.assertEqual(found.item(), 1.0)
            self.assertEqual(grads[0][0].item(), 0.5)

    def test_the_cpu_kernel_is_ours_only_below_2_3(self):
        for op in ("_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_"):
            table = torch._C._dispatch_dump_table("aten::" + op)
            cpu = [line for line in table.splitlines() if line.startswith("CPU:")]
            self.assertEqual(len(cpu), 1, table)
            self.assertEqual("aten_amp_ops_cpu.cpp" in cpu[0], TORCH_MINOR < (2, 3), cpu[0])

    def test_update_scale(self):
        scale = torch.full((1,), 8.0)
        tracker = torch.zeros(1, dtype=torch.int32)
        torch._amp_update_scale_(scale, tracker, torch.zeros(1), 2.0, 0.5, 2)
        self.assertEqual((scale.item(), tracker.item()), (8.0, 1))
        torch._amp_update_scale_(scale, tracker, torch.zeros(1), 2.0, 0.5, 2)
        self.assertEqual((scale.item(), tracker.item()), (16.0, 0))
        torch._amp_update_scale_(scale, tracker, torch.ones(1), 2.0, 0.5, 2)
        self.assertEqual((scale.item(), tracker.item()), (8.0, 0))

    def test_errors_are_runtime_errors(self):
        with self.assertRaisesRegex(RuntimeError, "inv_scale must be a 1-element tensor"):
            torch._amp_foreach_non_finite_check_and_unscale_(
                [torch.ones(2)], torch.zeros(1), torch.ones(2))


if __name__ == "__main__":
    check_same_version_as_libtorch()
    unittest.main()
