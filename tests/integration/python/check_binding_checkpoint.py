"""Python reads the scaler checkpoint a binding wrote through torchamp's C ABI
(torchamp_scaler_save): torch.load gives the state dict whose values the
binding's trace printed on its `final` lines, and PyTorch's own GradScaler
loads it.

    check_binding_checkpoint.py SCALER_PT TRACE
"""
import struct
import sys

import torch

from interop_util import check_same_version_as_libtorch, load_from_cpp

check_same_version_as_libtorch()
state = load_from_cpp(sys.argv[1])
final = {}
for line in open(sys.argv[2]):
    words = line.split()
    if words and words[0] == "final":
        key, kind, value = words[1], words[2], words[3]
        final[key] = struct.unpack("<d", struct.pack("<Q", int(value, 16)))[0] if kind == "1" else int(value)
assert final, "no final lines in " + sys.argv[2]
assert set(state) == set(final), (sorted(state), sorted(final))
for key, value in final.items():
    assert state[key] == value, (key, state[key], value)
if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(state)
    assert scaler.get_scale() == final["scale"], (scaler.get_scale(), final["scale"])
    print("torch.amp.GradScaler loaded it: scale", scaler.get_scale())
else:
    print("torch.load read it (this torch has no CPU GradScaler to load it into)")
