"""torchamp-train over a Gloo process group that Python forms.

    torchrun --nproc-per-node N torchamp-train-py [torchamp-train options]

The pip wheels' LibTorch ships no Gloo C++ headers, so a torchamp-train built
against one cannot form a Gloo group itself. This launcher (the wheel build
writes it as build-2.13/apps/torchamp-train/torchamp-train-py) forms it with
torch.distributed from torchrun's environment (env://) and runs the same C++
program, built as the torchamp_train_ext module, over it. Standalone (no
WORLD_SIZE) it is one process, exactly as the executable.
"""
import datetime
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy
import torch.distributed as dist  # noqa: E402

import torchamp_train_ext  # noqa: E402


def timeout_seconds(argv):
    """--timeout's value (the C++ side parses and checks it again)."""
    for i, a in enumerate(argv):
        if a.startswith("--timeout="):
            return float(a.split("=", 1)[1])
        if a == "--timeout" and i + 1 < len(argv):
            return float(argv[i + 1])
    return 300.0


error = torchamp_train_ext.launch_error()
if error:
    print("error: " + error, file=sys.stderr)
    sys.exit(2)
group = None
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    try:
        seconds = timeout_seconds(sys.argv)
    except ValueError:
        seconds = 300.0
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
    group = dist.distributed_c10d._get_default_group()
code = torchamp_train_ext.main(["torchamp-train-py"] + sys.argv[1:], group)
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # no teardown collective with ranks that may be gone
