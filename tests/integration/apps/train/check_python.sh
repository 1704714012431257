#!/usr/bin/env bash
# The same run in C++ (torchamp-train) and in Python (compare_python.py:
# torch.autocast + torch.amp.GradScaler, fused=True where the C++ side uses
# torchamp's fused optimizers), from the C++ side's initial weights and on
# its batch order: identical scale histories and skip decisions, losses
# within 1e-3 (relative) at every step. Exit 77 (skip) where the Python torch
# has no CPU GradScaler (before 2.3).
#
# Usage: check_train_python.sh APP PYTHON SCRIPT WORKDIR
set -euo pipefail
app=$1 python=$2 script=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
# Growth every 5 steps: backoffs and growths in every scaled mode. From scale
# 1e9 the first steps overflow; not so for fused SGD: PyTorch's (2.13)
# leaves its momentum buffers uninitialised (torch.empty_like) when the
# scaler skips its first step and steps with them later; torchamp's does
# what the stock SGD does (see docs/demo.md).
for variant in "--optimizer adam --init-scale 1e9" "--optimizer adam --fused --init-scale 1e9" \
  "--optimizer sgd --fused --init-scale 65536"; do
  name=$(echo "$variant" | tr -d ' -.')
  # shellcheck disable=SC2086
  "$app" --task deep --epochs 8 --growth-interval 5 $variant \
    --out "$work/$name" >/dev/null
  rc=0
  "$python" "$script" "$work/$name" --check --loss-rtol 1e-3 || rc=$?
  [ "$rc" -ne 77 ] || exit 77
  [ "$rc" -eq 0 ] || { echo "FAIL: $variant: the C++ and Python runs differ" >&2; exit 1; }
  skipped=$(awk -F, '$2 == "fp16+scaler" { s = $5 } END { print s }' "$work/$name/metrics.csv")
  [ "${skipped:-0}" -gt 0 ] || { echo "FAIL: $variant: no step was skipped" >&2; exit 1; }
done
