"""The Python checkpoint snippet of docs/checkpoints.md, pasted as it is.

Run: python3 test_readme_snippet.py PAGE CHECKPOINT_EXAMPLE WORKDIR

Takes the ```python block after the page's <!-- readme-python-checkpoint -->
marker and runs it in WORKDIR with this Python, where examples/checkpoint has
already written to_python.pt (from a state Python saved). Exits 77 (skipped)
on PyTorch before 2.6, for which the page gives the plain torch.load.
"""
import os
import subprocess
import sys

import torch

from interop_util import TORCH_MINOR, check_same_version_as_libtorch

MARKER = "<!-- readme-python-checkpoint -->"


def snippet(readme):
    text = open(readme).read()
    assert MARKER in text, f"no {MARKER} in {readme}"
    block = text.split(MARKER, 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]


def main():
    readme, example, work = sys.argv[1:4]
    check_same_version_as_libtorch()
    code = snippet(readme)
    if TORCH_MINOR < (2, 6):
        print(f"skipped: the snippet is for PyTorch 2.6 and later, this is {torch.__version__}")
        return 77
    os.makedirs(work, exist_ok=True)
    # C++ -> Python needs a to_python.pt: C++ writes it from a Python state.
    source = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=100)
    torch.save(source.state_dict(), os.path.join(work, "from_python.pt"))
    subprocess.run([example, "from_python.pt", "to_python.pt"], cwd=work, check=True)
    out = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True)
    print(out.stdout, out.stderr)
    if out.returncode != 0 or "loaded scale 512.0" not in out.stdout:
        print(f"FAILED: the snippet of {readme}, pasted as it is, did not load the C++ checkpoint")
        return 1
    print(f"the Python snippet of {readme} ran as pasted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
