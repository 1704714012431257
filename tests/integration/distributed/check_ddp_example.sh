#!/bin/bash
# example.ddp_train: docs/distributed.md's DistributedDataParallel example,
# whose group is torchamp::init_process_group() (env://, torchrun's agent
# store), launched twice:
#   1. torchrun --standalone --nproc-per-node 2;
#   2. two nodes: two torchrun agents on loopback, one process each, meeting
#      at a c10d rendezvous (--nnodes 2 --node-rank 0|1 --rdzv-backend c10d).
# Both times both ranks skip step 10 (an overflow in one rank's data) and end
# with the same weights, the same in both runs.
#   check_ddp_example.sh TORCHRUN EXAMPLE
set -uo pipefail
torchrun=$1 example=$2
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo

check() {  # check NAME OUTPUT RC
  echo "$2"
  [ "$3" = 0 ] || { echo "FAIL ($1): torchrun exited $3"; exit 1; }
  [ "$(grep -c 'step 10 skipped' <<<"$2")" = 2 ] || { echo "FAIL ($1): not both ranks skipped step 10"; exit 1; }
  [ "$(grep -c ': done, ' <<<"$2")" = 2 ] || { echo "FAIL ($1): not both ranks finished"; exit 1; }
  [ "$(grep -o 'scale .*, weight sum .*' <<<"$2" | sort -u | wc -l)" = 1 ] ||
    { echo "FAIL ($1): the ranks end with different scales or weights"; exit 1; }
  echo "ok ($1): both ranks skipped step 10 and ended with the same scale and weights"
}

out=$("$torchrun" --standalone --nproc-per-node 2 --no-python "$example" 2>&1)
check "one node" "$out" $?
one=$(grep -o 'scale .*, weight sum .*' <<<"$out" | sort -u)

# A free port for the rendezvous (and the next one, which a LibTorch 1.13
# rank 0 serves its own store on: see src/compat/compat.h).
port=$(python3 "$(dirname "$0")/../tools/two_free_ports.py" 29600)
node() {
  "$torchrun" --nnodes 2 --nproc-per-node 1 --node-rank "$1" --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "torchamp-$$" --no-python "$example" 2>&1
}
node 1 >"${TMPDIR:-/tmp}/ddp-node1.$$" &
pid1=$!
out=$(node 0)
rc0=$?
wait $pid1
rc1=$?
out="$out
$(cat "${TMPDIR:-/tmp}/ddp-node1.$$")"
rm -f "${TMPDIR:-/tmp}/ddp-node1.$$"
check "two nodes" "$out" $((rc0 | rc1))
two=$(grep -o 'scale .*, weight sum .*' <<<"$out" | sort -u)
[ "$one" = "$two" ] || { echo "FAIL: one node ended with '$one', two nodes with '$two'"; exit 1; }
echo "ok: one node and two nodes end alike: $two"
