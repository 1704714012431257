"""Helpers shared by the Python interoperability tests."""
import importlib

import torch


def load_from_cpp(path):
    """torch.load of what torch::pickle_save wrote. LibTorch tags its dicts and
    lists with torch.jit._pickle.restore_type_tag, which the weights_only
    loader (the default from PyTorch 2.6) refuses unless allowed by name."""
    if hasattr(torch.serialization, "safe_globals"):
        tags = importlib.import_module("torch.jit._pickle")
        with torch.serialization.safe_globals([tags.restore_type_tag]):
            return torch.load(path)
    return torch.load(path)
