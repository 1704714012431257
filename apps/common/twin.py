"""What both apps' Python twins share (apps/torchamp-train/compare_python.py,
apps/torchamp-gpt/gpt_python.py): reading a C++ run folder."""

import importlib
import os

import torch


def load_from_cpp(path):
    """torch.load of what torch::pickle_save wrote (LibTorch tags its dicts
    with torch.jit._pickle.restore_type_tag, which the weights_only loader,
    the default from 2.6, must be allowed to call)."""
    if hasattr(torch.serialization, "safe_globals"):
        tags = importlib.import_module("torch.jit._pickle")
        with torch.serialization.safe_globals([tags.restore_type_tag]):
            return torch.load(path)
    return torch.load(path)


def read_run_options(run_dir):
    """A run folder's options (apps/common/run_folder.h): options.txt, or
    config.txt in a torchamp-train folder written before the apps shared one."""
    name = "options.txt" if os.path.exists(os.path.join(run_dir, "options.txt")) else "config.txt"
    with open(os.path.join(run_dir, name)) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
