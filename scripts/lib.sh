# Shared set-up for scripts/test and scripts/demo (sourced, not run).
#
# Installs what is missing with apt (idempotent: installed packages are
# skipped, apt-get update runs only when something is missing), then
# configures and builds into build/.

TORCHAMP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian 12 packages the build, tests and demo need.
TORCHAMP_PACKAGES=(
  cmake make g++ pkg-config
  libtorch-dev          # LibTorch 1.13.1 (CPU), headers and CMake config
  libgtest-dev          # GoogleTest
  libbenchmark-dev      # Google Benchmark (bench/)
  python3-torch         # PyTorch, for interoperability tests
  libcli11-dev zlib1g-dev # torchamp-train: options, gzip data
  gnuplot-nox           # torchamp-train: plots
  clang libclang-rt-14-dev  # the libFuzzer target
  ccache clang-format
)

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
  local missing=() pkg
  for pkg in "${TORCHAMP_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "== dependencies: all installed"
    return 0
  fi
  echo "== installing: ${missing[*]}"
  torchamp_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  torchamp_as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

torchamp_build() {
  local build_dir="${TORCHAMP_BUILD_DIR:-$TORCHAMP_ROOT/build}"
  # ccache: PCH-friendly settings; the cache outlives clean clones.
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$TORCHAMP_ROOT}"
  cmake -S "$TORCHAMP_ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$build_dir" -j "$(nproc)"
}
