"""Helpers shared by the Python interoperability tests."""
import importlib
import os

import torch

# (major, minor) of the Python torch; Debian's says 1.13.0a0 where its LibTorch says 1.13.0.
TORCH_MINOR = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def check_same_version_as_libtorch():
    """The Python torch must be the LibTorch under test (TORCHAMP_LIBTORCH_VERSION), major.minor."""
    expected = os.environ.get("TORCHAMP_LIBTORCH_VERSION")
    assert not expected or TORCH_MINOR == tuple(int(x) for x in expected.split(".")[:2]), (
        "Python torch", torch.__version__, "is not the LibTorch under test", expected)


def load_from_cpp(path):
    """torch.load of what torch::pickle_save wrote. LibTorch tags its dicts and
    lists with torch.jit._pickle.restore_type_tag, which the weights_only
    loader (the default from PyTorch 2.6) refuses unless allowed by name."""
    if hasattr(torch.serialization, "safe_globals"):
        tags = importlib.import_module("torch.jit._pickle")
        with torch.serialization.safe_globals([tags.restore_type_tag]):
            return torch.load(path)
    return torch.load(path)
