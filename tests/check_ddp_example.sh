#!/bin/bash
# example.ddp_train: docs/distributed.md's DistributedDataParallel example under
# torchrun --nproc-per-node 2: both ranks skip step 10 (an overflow in one
# rank's data) and end with the same weights.
#   check_ddp_example.sh TORCHRUN EXAMPLE
set -uo pipefail
out=$(OMP_NUM_THREADS=1 "$1" --standalone --nproc-per-node 2 --no-python "$2" 2>&1)
rc=$?
echo "$out"
[ $rc = 0 ] || { echo "FAIL: torchrun exited $rc"; exit 1; }
[ "$(grep -c 'step 10 skipped' <<<"$out")" = 2 ] || { echo "FAIL: not both ranks skipped step 10"; exit 1; }
[ "$(grep -c ': done, ' <<<"$out")" = 2 ] || { echo "FAIL: not both ranks finished"; exit 1; }
[ "$(grep -o 'scale .*, weight sum .*' <<<"$out" | sort -u | wc -l)" = 1 ] ||
  { echo "FAIL: the ranks end with different scales or weights"; exit 1; }
echo "ok: both ranks skipped step 10 and ended with the same scale and weights"
