#!/usr/bin/env bash
# The installed package without CMake, as a Makefile, Meson or Bazel user
# builds: install the build into a prefix, move the prefix (nothing may
# depend on where it was installed), and with `pkg-config --cflags --libs
# torchamp` alone and no torchamp -D:
#   1. torchamp.h declares everything this build has (process groups and DDP
#      where it was built with them) and says how it was built (config.h);
#   2. the README's quickstart builds with a plain compiler line and runs;
#   3. examples/ddp_train.cpp builds the same way; without torchrun's
#      environment it prints the typed error and exits 2; under torchrun on
#      2 ranks both ranks skip step 10 and end with the same weights;
#   4. with another LibTorch's headers first, config.h stops the compile
#      with an error naming both versions.
#
# Usage: check_pkg_config.sh BUILD WORK SOURCE CXX TORCHRUN|"" OTHER_TORCH_PREFIX|"" [LAUNCHER]
# (LAUNCHER: the build's compiler launcher, ccache, for the compile lines.)
set -uo pipefail
build=$1 work=$2 source=$3 cxx=$4 torchrun=$5 other=$6 launcher=${7:-}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/stage" >/dev/null || fail "cmake --install failed"
mv "$work/stage" "$work/moved"
prefix=$work/moved
pc=$(find "$prefix" -name torchamp.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || fail "no pkgconfig/torchamp.pc under $prefix"
export PKG_CONFIG_PATH=$(dirname "$pc")
unset LD_LIBRARY_PATH
cflags=$(pkg-config --cflags torchamp) || fail "pkg-config --cflags torchamp failed"
libs=$(pkg-config --libs torchamp) || fail "pkg-config --libs torchamp failed"
echo "pkg-config --cflags: $cflags"
echo "pkg-config --libs: $libs"
grep -q -- '-DTORCHAMP' <<<"$cflags" && fail "the flags define a TORCHAMP_ macro: $cflags"
version=$(sed -n 's/^#define TORCHAMP_VERSION "\(.*\)"/\1/p' "$source/include/torchamp/version.h")
[ "$(pkg-config --modversion torchamp)" = "$version" ] ||
  fail "pkg-config --modversion: $(pkg-config --modversion torchamp), expected $version"
config=$(find "$prefix" -path '*/torchamp/config.h' | head -1)
[ -n "$config" ] || fail "no torchamp/config.h installed under $prefix"
distributed=$(sed -n 's/^#define TORCHAMP_WITH_DISTRIBUTED \([01]\)$/\1/p' "$config")
[ -n "$distributed" ] || fail "$config has no TORCHAMP_WITH_DISTRIBUTED"

# A program from one source file, as a Makefile builds it: a compile line
# with the pkg-config cflags (through LAUNCHER where the build has one: a
# compile, unlike a link, is what ccache can reuse), then a link line.
build_program() {  # OUTPUT SOURCE
  # shellcheck disable=SC2086  # the flags are words; an empty launcher is none
  $launcher "$cxx" -c -o "$1.o" "$2" $cflags && "$cxx" -o "$1" "$1.o" $cflags $libs
}

# 1. Every declaration of this build, from torchamp.h with no -D.
cat >"$work/headers.cpp" <<'EOF'
#include <torchamp/torchamp.h>

#include <iostream>

#ifndef TORCHAMP_WITH_DISTRIBUTED
#error "torchamp/torchamp.h did not bring torchamp/config.h"
#endif
int main() {
  torchamp::GradScaler scaler;
  (void)scaler;
#if TORCHAMP_WITH_DISTRIBUTED
  auto* init = &torchamp::init_process_group;
  (void)init;
  static_assert(sizeof(torchamp::DistributedDataParallel) > 0, "DDP declared");
#endif
  std::cout << "torchamp " << TORCHAMP_VERSION << " on LibTorch " << TORCHAMP_TORCH_VERSION
            << ", distributed " << TORCHAMP_WITH_DISTRIBUTED << ", gloo " << TORCHAMP_WITH_GLOO
            << ", kernels " << TORCHAMP_KERNEL_ISAS << "\n";
}
EOF
build_program "$work/headers" "$work/headers.cpp" || fail "torchamp.h alone did not build"
out=$("$work/headers") || fail "the header probe did not run: $out"
echo "$out"
grep -q "distributed $distributed" <<<"$out" || fail "the probe saw another build: $out"

# 2. The quickstart.
build_program "$work/quickstart" "$source/examples/quickstart.cpp" ||
  fail "the quickstart did not build with the pkg-config flags"
out=$("$work/quickstart" 2>&1) || fail "the quickstart failed: $out"
grep -q "clipped gradient norm" <<<"$out" || fail "the quickstart printed: $out"
echo "ok: the quickstart built with g++ and pkg-config, and ran"

# 3. The DDP example.
if [ "$distributed" = 1 ]; then
  build_program "$work/ddp_train" "$source/examples/ddp_train.cpp" ||
    fail "ddp_train did not build with the pkg-config flags"
  out=$(env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "$work/ddp_train" 2>&1)
  rc=$?
  echo "$out"
  [ $rc = 2 ] || fail "ddp_train without torchrun exited $rc, expected 2"
  grep -q "ddp_train: .*environment variable RANK expected, but not set" <<<"$out" ||
    fail "ddp_train without torchrun did not print the typed error"
  grep -q "Exception raised from\|terminate called" <<<"$out" &&
    fail "ddp_train without torchrun printed a stack trace or aborted"
  echo "ok: ddp_train without torchrun: the message and exit 2"
  if [ -n "$torchrun" ]; then
    # Two free ports in a row below the ephemeral range, not --standalone's
    # one: a LibTorch 1.13 rank 0 serves its own store on the next port
    # (src/compat/compat.h), which a client socket of the agent's store could
    # hold (seen once: "Address already in use").
    port=$(python3 "$source/tests/integration/tools/two_free_ports.py" 30700)
    out=$(OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo "$torchrun" --master-addr 127.0.0.1 \
      --master-port "$port" --nproc-per-node 2 --no-python "$work/ddp_train" 2>&1)
    rc=$?
    echo "$out"
    [ $rc = 0 ] || fail "ddp_train under torchrun exited $rc"
    [ "$(grep -c 'step 10 skipped' <<<"$out")" = 2 ] || fail "not both ranks skipped step 10"
    [ "$(grep -c ': done, ' <<<"$out")" = 2 ] || fail "not both ranks finished"
    [ "$(grep -o 'scale .*, weight sum .*' <<<"$out" | sort -u | wc -l)" = 1 ] ||
      fail "the ranks end with different scales or weights"
    echo "ok: ddp_train built with g++ and pkg-config trains on 2 ranks under torchrun"
  fi
fi

# 4. Another LibTorch's headers first: config.h names both versions.
if [ -n "$other" ]; then
  # TORCH_VERSION's string (2.10 on: in torch/headeronly/version.h).
  other_version=$(cat "$other/include/torch/headeronly/version.h" \
    "$other/include/torch/csrc/api/include/torch/version.h" 2>/dev/null |
    sed -n '/#define TORCH_VERSION [\\"]/,/"/s/.*"\([0-9.]*\)".*/\1/p' | head -1)
  [ -n "$other_version" ] || fail "no TORCH_VERSION in $other's torch/version.h"
  built=$(sed -n 's/^#define TORCHAMP_TORCH_VERSION "\(.*\)"/\1/p' "$config")
  echo '#include <torchamp/grad_scaler.h>' >"$work/other.cpp"
  other_dirs=(-isystem "$other/include/torch/csrc/api/include")
  # (/usr/include is the compiler's own: named again, libstdc++'s #include_next breaks.)
  [ "$other" = /usr ] || other_dirs+=(-isystem "$other/include")
  # shellcheck disable=SC2086
  out=$("$cxx" -fsyntax-only -Wfatal-errors "${other_dirs[@]}" "$work/other.cpp" $cflags 2>&1)
  rc=$?
  echo "$out" | head -8
  [ $rc != 0 ] || fail "another LibTorch's headers compiled without an error"
  grep -q "torchamp was built against LibTorch $built" <<<"$out" ||
    fail "the error does not name the LibTorch torchamp was built against ($built)"
  grep -q "but this program compiles against LibTorch $other_version's headers" <<<"$out" ||
    fail "the error does not name the other LibTorch ($other_version)"
  echo "ok: LibTorch $other_version's headers stop the compile, naming $built and $other_version"
fi
echo "ok: the installed package works without CMake"
