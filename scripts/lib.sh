# Shared set-up for scripts/test and scripts/demo (sourced, not run).
#
# Installs what is missing (idempotent: installed packages are skipped,
# apt-get update runs only when something is missing), then configures and
# builds. Debian's packages come from the list for this release
# (scripts/deps/debian-<VERSION_ID>.txt, chosen from /etc/os-release); the
# wheel leg's LibTorch comes from pip, into a virtual environment under .deps/.

TORCHAMP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The one list of Debian packages for this machine's release.
torchamp_deps_file() {
  local id="" version_id=""
  if [ -r /etc/os-release ]; then
    id=$(. /etc/os-release && echo "${ID:-}")
    version_id=$(. /etc/os-release && echo "${VERSION_ID:-}")
  fi
  local file="$TORCHAMP_ROOT/scripts/deps/${id}-${version_id}.txt"
  if [ "$id" != debian ] || [ ! -f "$file" ]; then
    echo "error: no package list for '${id:-unknown} ${version_id:-?}' (/etc/os-release);" \
      "supported: $(cd "$TORCHAMP_ROOT/scripts/deps" && ls debian-*.txt | sed 's/\.txt$//' | tr '\n' ' ')" >&2
    return 1
  fi
  echo "$file"
}

# Package names of a list file: comments and blank lines dropped.
torchamp_read_deps() {
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "$1" | grep -v '^$'
}

torchamp_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "error: need root (or sudo) to run: $*" >&2
    return 1
  fi
}

torchamp_install_deps() {
  local file pkg missing=()
  file=$(torchamp_deps_file)
  for pkg in $(torchamp_read_deps "$file"); do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "== dependencies ($(basename "$file")): all installed"
    return 0
  fi
  echo "== installing ($(basename "$file")): ${missing[*]}"
  torchamp_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  torchamp_as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The wheel leg's LibTorch and clang-format 14 (the style test), for
# torchamp_wheel_venv: scripts/test and scripts/demo share one venv.
TORCHAMP_WHEEL=(2.13.0 clang-format==14.0.6)

# A virtual environment with PyTorch VERSION from pip (the python3 on PATH);
# prints its directory. Its torch/ folder is a complete C++ LibTorch. Extra
# pip requirements may follow the version. It lives in the user's cache,
# ${TORCHAMP_VENV_DIR:-${XDG_CACHE_HOME:-~/.cache}/torchamp/venv}/torch-VERSION-pyX.Y,
# one for every checkout on the machine, and .deps/torch-VERSION links to it:
# pip runs once a machine instead of once a clone (24 s), and LibTorch's
# headers have one path in every clone, so a clone in another folder hits
# ccache's direct mode (under the clone, their path differed per folder and
# every file of the wheel leg ran the preprocessor again). A
# .deps/torch-VERSION that is a folder (the layout before 2026-12-06) is
# used as it is.
torchamp_wheel_venv() {
  local version="$1"
  shift
  local link="$TORCHAMP_ROOT/.deps/torch-$version"
  local want="torch==$version $*"
  local venv cache py
  if [ -d "$link" ] && [ ! -L "$link" ]; then
    venv=$link
  else
    cache=${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}
    py=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    venv="${TORCHAMP_VENV_DIR:-${cache:-$TORCHAMP_ROOT/.deps}/torchamp/venv}/torch-$version-py$py"
  fi
  mkdir -p "$(dirname "$venv")" "$(dirname "$link")"
  # One pip at a time (two checkouts' scripts/test started together).
  (
    flock 9
    if [ "$(cat "$venv/.torchamp-requirements" 2>/dev/null)" != "$want" ] ||
      ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
      echo "== pip: $want into $venv" >&2
      [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2
      # shellcheck disable=SC2086
      "$venv/bin/pip" install -q $want >&2
      echo "$want" >"$venv/.torchamp-requirements"
    fi
  ) 9>"$venv.lock" || return 1
  [ "$venv" = "$link" ] || ln -sfn "$venv" "$link"
  echo "$venv"
}

# CMake arguments for a venv's LibTorch, one per line: none for a CPU build.
# Where pip has no CPU build of torch for this Python (PyPI's Linux x86-64
# wheels are CUDA builds: Debian 13's Python 3.13 gets one), the wheel's CMake
# config needs a CUDA toolkit (nvcc, cudart) to configure, even for CPU-only
# use. pip then also brings NVIDIA's toolkit of the version the wheel pins
# (cuda-toolkit[nvcc,nvvm,crt,cudart,cccl]) into the same venv, plus the two links CMake and
# nvcc look for (unversioned lib*.so names, lib64), and these arguments point
# CMake at it. Nothing outside the venv is touched.
torchamp_wheel_cuda_args() {
  local venv="$1" info major version site root f req stamp
  info=$("$venv/bin/python" - <<'PY'
import importlib.metadata as md, os, re, torch
if torch.version.cuda:
    req = [r for r in (md.requires("torch") or []) if r.startswith("cuda-toolkit")]
    m = re.search(r"==\s*([0-9][0-9.]*)", req[0]) if req else None
    print(torch.version.cuda.split(".")[0], m.group(1) if m else torch.version.cuda,
          os.path.dirname(os.path.dirname(torch.__file__)))
PY
  ) || return 1
  [ -n "$info" ] || return 0
  read -r major version site <<<"$info"
  root="$site/nvidia/cu$major"
  # cccl: CUDA's own headers include <nv/target> (libcu++), which c10d's NCCL
  # headers reach through cuda_fp16.h (failed in a Debian 13 root without it).
  # nvvm and crt: nvcc's wheel asks for them unpinned, and cuda-toolkit 13.0.2
  # (torch 2.11's) does not pin them, so pip took the newest (13.5's cicc
  # writes PTX 9.5, which 13.0's ptxas refuses: CMake's CUDA compiler check
  # failed); the toolkit's own extras pin them to its release. The
  # stamp names what was installed, so a venv made before is mended.
  req="cuda-toolkit[nvcc,nvvm,crt,cudart,cccl]==$version"
  stamp="$root/.torchamp-toolkit"
  if [ ! -x "$root/bin/nvcc" ] || [ ! -e "$root/include/nv/target" ] ||
    [ "$(cat "$stamp" 2>/dev/null)" != "$req" ]; then
    echo "== pip: this Python's torch is a CUDA $version build (no CPU wheel for it);" \
      "its CMake config needs a CUDA toolkit: $req" >&2
    "$venv/bin/pip" install -q "$req" >&2 || { echo "error: pip could not install $req" >&2; return 1; }
    echo "$req" >"$stamp"
  fi
  [ -x "$root/bin/nvcc" ] && [ -d "$root/lib" ] && [ -e "$root/include/nv/target" ] ||
    { echo "error: no CUDA toolkit at $root after pip installed it" >&2; return 1; }
  for f in "$root"/lib/lib*.so.*; do
    [ -e "${f%%.so.*}.so" ] || ln -s "$(basename "$f")" "${f%%.so.*}.so"
  done
  [ -e "$root/lib64" ] || ln -s lib "$root/lib64"
  printf '%s\n' "-DCUDA_TOOLKIT_ROOT_DIR=$root" "-DCUDAToolkit_ROOT=$root" \
    "-DCMAKE_CUDA_COMPILER=$root/bin/nvcc"
}

# The LibTorch inside a venv's torch wheel, as a CMake prefix: the torch/
# folder itself (CMake finds share/cmake/Torch under it, and looks for the
# libraries in its lib/ first). Not torch.utils.cmake_prefix_path
# (torch/share/cmake): with that, TorchConfig's find_library calls search the
# system first and mix in Debian's libc10 when libtorch-dev is installed.
torchamp_wheel_prefix() {
  "$1/bin/python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null
}

torchamp_build() {
  local build_dir="${TORCHAMP_BUILD_DIR:-$TORCHAMP_ROOT/build}"
  # ccache: PCH-friendly settings, and base_dir at the checkout's root, so
  # that paths inside it are hashed relative to each compile's working
  # directory: a clone in another folder (CI's, a second worktree) hits the
  # objects this one built, and the package.subproject tests, which build a
  # copy of the library one level below its sources as this build lies below
  # the checkout, hit this build's objects (tests/integration/subproject/run.cmake).
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$TORCHAMP_ROOT}"
  cmake -S "$TORCHAMP_ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$build_dir" -j "$(nproc)"
}
