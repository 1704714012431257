#!/usr/bin/env bash
# torchamp-train's exact resume: a run killed with SIGKILL (mid-epoch, and
# while writing a checkpoint) and resumed with the same command line and
# --resume writes the same metrics.csv, byte for byte, and the same table
# values as the uninterrupted run, every time (the first kill is repeated).
#
# Usage: check_train_resume.sh APP WORKDIR
set -euo pipefail
app=$1
work=$2
# Two threads (scripts/test runs the tests on one): exact on one thread says
# little, MKL's and ATen's splits across threads are what could differ.
export OMP_NUM_THREADS=2
rm -rf "$work"
mkdir -p "$work"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# The table's values without the time columns (summary.csv's first 8).
values() { cut -d, -f1-8 "$1/summary.csv"; }

same_as() {  # same_as REFERENCE RESUMED
  cmp "$1/metrics.csv" "$2/metrics.csv" || fail "$2/metrics.csv differs from $1's"
  [ "$(values "$1")" = "$(values "$2")" ] || fail "$2/summary.csv differs from $1's"
}

# Scale 1e9 and growth every 5 steps: backoffs and growths in a few epochs,
# so the checkpoints hold a non-trivial scale and growth tracker.
for variant in "--optimizer adam" "--optimizer sgd --fused"; do
  # shellcheck disable=SC2206
  args=(--task deep --epochs 6 --modes fp32,fp16+scaler,bf16+scaler --init-scale 1e9
        --growth-interval 5 $variant)
  name=$(echo "$variant" | tr -d ' -')
  "$app" "${args[@]}" --out "$work/$name-full" >"$work/full.log"
  ! grep -q "starts again\|resuming" "$work/full.log" ||
    fail "a new folder's banner says it resumes or starts again: $(head -3 "$work/full.log")"
  skips=$(grep -c ',fp16+scaler,' "$work/$name-full/metrics.csv")
  [ "$skips" -gt 0 ] || fail "no fp16+scaler rows"

  # Killed while writing its third checkpoint (step 15 of the first mode, mid-epoch):
  # the temporary file is there, the second checkpoint still in place.
  rc=0
  TORCHAMP_TRAIN_KILL_IN_CHECKPOINT=3 "$app" "${args[@]}" --checkpoint-every 5 \
    --out "$work/$name-killed" >/dev/null || rc=$?
  [ "$rc" -eq 137 ] || fail "expected death by SIGKILL (137), got $rc"
  [ -f "$work/$name-killed/checkpoint.pt.tmp" ] || fail "no half-written checkpoint"
  "$app" "${args[@]}" --checkpoint-every 5 --resume "$work/$name-killed" >"$work/resume.log" ||
    fail "resume failed: $(cat "$work/resume.log")"
  grep -q "resuming at mode 1/3, step 10" "$work/resume.log" ||
    fail "did not resume from the last complete checkpoint: $(head -3 "$work/resume.log")"
  same_as "$work/$name-full" "$work/$name-killed"

  # Again and again, on two threads: a resume that is exact
  # only when the machine is lucky is not exact (TORCHAMP_RESUME_REPEATS
  # kills and resumes in all, default 5 per variant; set it higher to soak).
  for i in $(seq 2 "${TORCHAMP_RESUME_REPEATS:-5}"); do
    rm -rf "$work/$name-again"
    TORCHAMP_TRAIN_KILL_IN_CHECKPOINT=3 "$app" "${args[@]}" --checkpoint-every 5 \
      --out "$work/$name-again" >/dev/null || true
    "$app" "${args[@]}" --checkpoint-every 5 --resume "$work/$name-again" >/dev/null ||
      fail "resume $i failed"
    cmp "$work/$name-full/metrics.csv" "$work/$name-again/metrics.csv" ||
      fail "kill and resume $i: $work/$name-again/metrics.csv differs from $name-full's"
  done

  # Killed in the second mode, then in the third (a checkpoint every 7 steps
  # is mid-epoch: 12 steps an epoch).
  TORCHAMP_TRAIN_KILL_IN_CHECKPOINT=14 "$app" "${args[@]}" --checkpoint-every 7 \
    --out "$work/$name-twice" >/dev/null || true
  TORCHAMP_TRAIN_KILL_IN_CHECKPOINT=10 "$app" "${args[@]}" --checkpoint-every 7 \
    --resume "$work/$name-twice" >"$work/resume.log" || true
  grep -q "resuming at mode 2/3" "$work/resume.log" || fail "$(head -3 "$work/resume.log")"
  "$app" "${args[@]}" --checkpoint-every 7 --resume "$work/$name-twice" >"$work/resume.log"
  grep -q "resuming at mode 3/3" "$work/resume.log" || fail "$(head -3 "$work/resume.log")"
  same_as "$work/$name-full" "$work/$name-twice"
done

# The master weights (and bfloat16 remainders) are in the checkpoint: killed
# mid-way through bf16-params and resumed, and then in fp16-params+scaler.
args=(--task deep --epochs 6 --modes bf16-params,fp16-params+scaler --init-scale 1e9
      --growth-interval 5)
"$app" "${args[@]}" --out "$work/params-full" >/dev/null
kill_and_resume() {  # kill_and_resume CHECKPOINT EXPECTED-RESUME-LINE
  rm -rf "$work/params"
  TORCHAMP_TRAIN_KILL_IN_CHECKPOINT=$1 "$app" "${args[@]}" --checkpoint-every 5 \
    --out "$work/params" >/dev/null || true
  "$app" "${args[@]}" --checkpoint-every 5 --resume "$work/params" >"$work/resume.log" ||
    fail "resume failed: $(cat "$work/resume.log")"
  grep -q "$2" "$work/resume.log" || fail "$(head -3 "$work/resume.log")"
  same_as "$work/params-full" "$work/params"
}
kill_and_resume 3 "resuming at mode 1/2, step 10"
kill_and_resume 20 "resuming at mode 2/2"

# A kill from outside, mid-run, at whatever step it lands.
args=(--task deep --epochs 40 --modes fp16+scaler --init-scale 1e9 --growth-interval 5)
"$app" "${args[@]}" --out "$work/outside-full" >/dev/null
"$app" "${args[@]}" --checkpoint-every 7 --out "$work/outside" >/dev/null &
pid=$!
for _ in $(seq 600); do
  lines=0
  [ ! -f "$work/outside/metrics.csv" ] || lines=$(wc -l <"$work/outside/metrics.csv")
  [ "$lines" -lt 150 ] || break
  sleep 0.05
done
kill -KILL "$pid" 2>/dev/null || fail "the run ended before it could be killed"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 137 ] || fail "the run was not killed (exit $rc)"
"$app" "${args[@]}" --checkpoint-every 7 --resume "$work/outside" >"$work/resume.log"
grep "resuming at" "$work/resume.log"
same_as "$work/outside-full" "$work/outside"

# Options that disagree with the run's own are refused, naming the option.
rc=0
"$app" --task deep --lr 0.5 --resume "$work/outside" >"$work/bad.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q -- "--lr is 0.5 here but 0.01" "$work/bad.log" ||
  fail "mismatched --lr: exit $rc, $(cat "$work/bad.log")"
# Resuming a finished run, or --out on it with its options, changes nothing,
# says so and prints its table.
cp "$work/outside/metrics.csv" "$work/before.csv"
"$app" --resume "$work/outside" >"$work/done.log"
grep -q "| fp16+scaler | " "$work/done.log" || fail "no table for a finished run"
grep -q "has finished" "$work/done.log" || fail "--resume of a finished run: $(cat "$work/done.log")"
"$app" "${args[@]}" --out "$work/outside" >"$work/done.log"
grep -q "has finished" "$work/done.log" && grep -q "| fp16+scaler | " "$work/done.log" ||
  fail "--out on a finished run: $(cat "$work/done.log")"
cmp "$work/before.csv" "$work/outside/metrics.csv" || fail "resuming a finished run changed it"
# --out on a run folder with other options is refused, naming the option.
rc=0
"$app" "${args[@]}" --lr 0.5 --out "$work/outside" >"$work/bad.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q -- "holds a run whose --lr is 0.01, but this one's is 0.5" "$work/bad.log" ||
  fail "--out with another --lr: exit $rc, $(cat "$work/bad.log")"
# --out on a killed run with its options continues it (what a torchrun restart does).
rc=0
TORCHAMP_TRAIN_KILL_AT_STEP=40 "$app" "${args[@]}" --checkpoint-every 7 --out "$work/again-out" \
  >/dev/null || rc=$?
[ "$rc" -eq 137 ] || fail "the --out run was not killed (exit $rc)"
"$app" "${args[@]}" --checkpoint-every 7 --out "$work/again-out" >"$work/resume.log"
grep -q "resuming at mode 1/" "$work/resume.log" || fail "--out did not resume: $(cat "$work/resume.log")"
same_as "$work/outside-full" "$work/again-out"
# A run folder written before the apps shared one (its options in config.txt,
# no finished marker) still continues, and then holds today's names.
rc=0
TORCHAMP_TRAIN_KILL_AT_STEP=40 "$app" "${args[@]}" --checkpoint-every 7 --out "$work/old-names" \
  >/dev/null || rc=$?
[ "$rc" -eq 137 ] || fail "the old-names run was not killed (exit $rc)"
mv "$work/old-names/options.txt" "$work/old-names/config.txt"
"$app" "${args[@]}" --checkpoint-every 7 --out "$work/old-names" >"$work/resume.log"
grep -q "resuming at mode 1/" "$work/resume.log" ||
  fail "a folder with config.txt did not resume: $(cat "$work/resume.log")"
[ -f "$work/old-names/options.txt" ] && [ ! -e "$work/old-names/config.txt" ] &&
  [ -f "$work/old-names/finished" ] || fail "the old folder was not renamed and marked finished"
same_as "$work/outside-full" "$work/old-names"
echo "exact resume: all runs identical to the uninterrupted ones"
