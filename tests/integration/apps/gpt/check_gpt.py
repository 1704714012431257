"""torchamp-gpt, the GPT main job, as a user runs it (tiny models, real text).

    check_gpt.py CASE APP WORK [EXTRA...]

CASE is one of:
  modes     every mode's loss falls; bf16 and float32 agree on the first
            steps' losses within 1e-2; the run folder holds what the README
            says; the same command again reports the finished run
  errors    a missing or empty corpus, a context longer than the data, a
            vocabulary that does not fit, --profile of every step, an --out
            of other options: exit 2,
            a message naming the value, nothing written
  resume    killed with SIGKILL (after a step, inside a checkpoint write, in
            the second mode, bf16-sr, and the third) and run again with the same command: metrics.csv
            and the table's values byte-identical to the uninterrupted run's
  parallel  EXTRA = TORCHRUN: 2 ranks under torchrun take the 1-rank run's
            (accum 2) scales and skips, with the same weights on both ranks
            (bf16-sr's stochastic rounding included);
            under --max-restarts 1 a rank of 3 killed after a checkpoint is
            restarted and the job ends byte-identical to an uninterrupted one
  python    EXTRA = PYTHON TWIN: the same run in Python (gpt_python.py
            --check): step 0's loss within 1e-5 in float32 and float16, the
            same scales and skips in fp16+scaler; both sides --profile'd, and
            profile_report.py shows the two side by side. Exit 77 (skip)
            without a CPU GradScaler in that torch
  device_step  EXTRA = 1 where LibTorch runs it (>= 2.4), else 0 (then it
            must be refused: exit 2, nothing written). --device-step, the
            CUDA modes' step on the CPU: the host step's scales and skips,
            its losses within rounding (fp32 1e-4, bfloat16 1e-2); in the
            profiled steps no host read outside ATen's kernels (the host
            step has some) and ATen's fused AdamW and AMP ops; killed and
            resumed, byte-identical; --dropout and an --out of the host
            step refused
  profile   --profile 2: each mode's trace holds 2 marked steps of ATen
            operators, tokens/s counts the others; profile_report.py's
            figures from that trace, and from a hand-made GPU trace whose
            answers are known (EXTRA = REPORT: profile_report.py)
"""
import csv
import json
import os
import shutil
import socket
import subprocess
import sys

CASE, APP, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
EXTRA = sys.argv[4:]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
failures = []
# A tiny model (2 layers, d 32, context 32) and enough steps for the loss
# to fall; scale 2^20 with growth every 4 steps: float16's gradients overflow
# at first and the scale backs off, then grows.
TINY = ["--size", "tiny", "--dropout", "0.1", "--steps", "30", "--warmup", "3", "--lr", "3e-3", "--eval-every", "10",
        "--eval-batches", "2", "--sample", "40", "--init-scale", "1048576",
        "--growth-interval", "4"]


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(args, env=None, expect=0):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run([APP] + args, capture_output=True, text=True, env=full_env)
    if expect is not None and p.returncode != expect:
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
        check(False, "%s exited %d, not %d" % (" ".join(args), p.returncode, expect))
    return p


def rows(path, mode=None):
    with open(path) as f:
        return [r for r in csv.DictReader(f) if mode is None or r["mode"] == mode]


def modes_of(out):
    return [r["mode"] for r in rows(os.path.join(out, "summary.csv"))]


def table_values(out):
    # summary.csv without the measured columns (tokens/s, step ms, peak MB).
    return [(r["mode"], r["val_loss"], r["train_loss"], r["skipped"], r["final_scale"],
             r["bytes_per_param"], r["params"], r["weights"])
            for r in rows(os.path.join(out, "summary.csv"))]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def case_modes():
    out = os.path.join(WORK, "run")
    p = run(TINY + ["--out", out])
    modes = modes_of(out)
    check("fp32" in modes and "bf16" in modes and "bf16-params" in modes and "bf16-sr" in modes,
          "the CPU modes ran: %s" % modes)
    per_param = {r["mode"]: float(r["bytes_per_param"]) for r in rows(os.path.join(out, "summary.csv"))}
    # Parameter, gradient (counted also where zero_grad freed it) and optimizer state.
    check(per_param["bf16-sr"] == 8.0 and per_param["bf16-params"] == 14.0
          and per_param["fp32"] == 16.0,
          "bytes a parameter: bf16-sr 8 (parameter, gradient and two bfloat16 moments), "
          "bf16-params 14 (float32 moments and the master's remainder), fp32 16: %s" % per_param)
    for mode in modes:
        losses = [float(r["loss"]) for r in rows(os.path.join(out, "metrics.csv"), mode)]
        first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
        check(len(losses) == 30 and last < first - 0.3,
              "%s: the loss falls (first steps %.3f, last steps %.3f)" % (mode, first, last))
    fp32 = [float(r["loss"]) for r in rows(os.path.join(out, "metrics.csv"), "fp32")][:3]
    bf16 = [float(r["loss"]) for r in rows(os.path.join(out, "metrics.csv"), "bf16")][:3]
    check(max(abs(a - b) for a, b in zip(fp32, bf16)) <= 1e-2,
          "bf16 and fp32 agree on the first 3 steps' losses within 1e-2: %s vs %s" % (fp32, bf16))
    if "fp16+scaler" in modes:
        fp16 = rows(os.path.join(out, "metrics.csv"), "fp16+scaler")
        scales = [float(r["scale"]) for r in fp16]
        check(int(fp16[-1]["skipped"]) > 0 and max(scales) > min(scales),
              "fp16+scaler: the scaler skipped %s steps, its scale moved %g..%g"
              % (fp16[-1]["skipped"], min(scales), max(scales)))
    for name in ("options.txt", "initial.pt", "metrics.csv", "summary.csv", "sample-fp32.txt",
                 "ranks/rank0.csv", "finished"):
        check(os.path.exists(os.path.join(out, name)), "the run folder holds " + name)
    if shutil.which("gnuplot"):
        check(os.path.getsize(os.path.join(out, "loss.png")) > 1000, "loss.png was drawn")
    check("| mode | val loss | tokens/s |" in p.stdout and "vs fp32" in p.stdout,
          "the table is printed")
    check("tokens/s" in p.stdout and "scale" in p.stdout, "progress lines are printed")
    again = run(TINY + ["--out", out])
    check("has finished" in again.stdout, "the same command again reports the finished run")
    rep = run(["--report", out])
    check("| fp32 |" in rep.stdout, "--report prints the table")


def case_errors():
    corpus = os.path.join(WORK, "small.txt")
    with open(corpus, "w") as f:
        f.write("In the beginning God created the heaven and the earth.\n" * 4)  # 224 chars
    empty = os.path.join(WORK, "empty.txt")
    open(empty, "w").close()
    out = os.path.join(WORK, "out")
    bad = [
        (["--data", os.path.join(WORK, "missing.txt")], "missing.txt", "a missing corpus"),
        (["--data", empty], "is empty", "an empty corpus"),
        (["--data", corpus, "--context", "300"], "--context 300", "a context longer than the data"),
        (["--data", corpus, "--vocab", "10"], "--vocab 10", "a vocabulary that does not fit"),
        (["--d-model", "30", "--heads", "4"], "--d-model 30", "heads that do not divide d"),
        (["--modes", "nosuch"], "nosuch", "an unknown mode"),
        (["--steps", "5", "--profile", "5"], "--profile 5", "every step profiled"),
    ]
    for args, needle, what in bad:
        p = run(TINY + args + ["--out", out], expect=2)
        check(p.returncode == 2 and needle in p.stderr,
              "%s: exit 2 naming it (%s)" % (what, p.stderr.strip().splitlines()[-1:]))
        check(not os.path.exists(out), "%s: nothing written" % what)
    # An --out holding another run's options: named, and the folder untouched.
    run(TINY + ["--steps", "2", "--modes", "fp32", "--out", out])
    before = {n: read(os.path.join(out, n)) for n in sorted(os.listdir(out))
              if os.path.isfile(os.path.join(out, n))}
    p = run(TINY + ["--steps", "3", "--modes", "fp32", "--out", out], expect=2)
    check("whose --steps is 2, but this one's is 3" in p.stderr, "another run's --out: exit 2 naming the option (%s)"
          % p.stderr.strip())
    after = {n: read(os.path.join(out, n)) for n in sorted(os.listdir(out))
             if os.path.isfile(os.path.join(out, n))}
    check(before == after, "another run's --out: left as it was")
    # On more than one process, no --out: refused before anything is made (each
    # rank would name its folder from its own clock).
    runs = os.path.join(WORK, "runs")
    p = subprocess.run([APP] + TINY, capture_output=True, text=True, cwd=WORK,
                       env=dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="2", RANK="1"))
    check(p.returncode == 2 and "give --out" in p.stderr,
          "two processes without --out: exit 2 naming --out (%s)" % p.stderr.strip()[-200:])
    check(not os.path.exists(runs), "two processes without --out: no folder made")


def case_resume():
    # bf16-sr second: its rounding generator must resume with the checkpoint.
    args = TINY + ["--steps", "16", "--modes",
                   "fp32,bf16-sr,fp16+scaler" if fp16_here() else "fp32,bf16-sr,bf16",
                   "--checkpoint-every", "5", "--sample", "0"]
    full = os.path.join(WORK, "full")
    p = run(args + ["--out", full])
    check("starts again" not in p.stdout and "resuming" not in p.stdout,
          "a new folder's banner neither resumes nor starts again")
    killed = os.path.join(WORK, "killed-before-a-checkpoint")
    run(args + ["--out", killed], env={"TORCHAMP_TRAIN_KILL_AT_STEP": "3"}, expect=-9)
    p = run(args + ["--out", killed])
    check("no checkpoint in %s yet: the run starts again" % killed in p.stdout,
          "a folder of the same options without a checkpoint says it starts again")
    kills = [("TORCHAMP_TRAIN_KILL_AT_STEP", "7", "after step 7 of the first mode", 5),
             ("TORCHAMP_TRAIN_KILL_IN_CHECKPOINT", "2", "inside its second checkpoint write", 5),
             ("TORCHAMP_TRAIN_KILL_AT_STEP", "28", "in the second mode, after step 12", 10),
             ("TORCHAMP_TRAIN_KILL_AT_STEP", "44", "in the third mode, after step 12", 10)]
    for var, value, what, step in kills:
        out = os.path.join(WORK, "killed-%s-%s" % (var[-4:], value))
        p = run(args + ["--out", out], env={var: value}, expect=None)
        check(p.returncode == -9, "killed %s (SIGKILL: %d)" % (what, p.returncode))
        q = run(args + ["--out", out])
        check(", step %d from" % step in q.stdout,
              "killed %s: resumed at step %d of its mode (%s)"
              % (what, step, [l for l in q.stdout.splitlines() if "resuming" in l]))
        check(read(os.path.join(full, "metrics.csv")) == read(os.path.join(out, "metrics.csv")),
              "killed %s: metrics.csv byte-identical to the uninterrupted run's" % what)
        check(table_values(full) == table_values(out),
              "killed %s: the table's values (and weights hashes) are the uninterrupted run's" % what)


def fp16_here():
    # --list-modes: one line a mode, "name available|unavailable summary".
    return any(l.split()[:2] == ["fp16+scaler", "available"]
               for l in run(["--list-modes"]).stdout.splitlines())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(torchrun_bin, n, args, env=None, restarts=0):
    cmd = [torchrun_bin, "--nproc-per-node", str(n), "--max-restarts", str(restarts),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:%d" % free_port(),
           "--no-python", APP] + args
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, env=full_env)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
    check(p.returncode == 0, "torchrun --nproc-per-node %d (%s): exit %d"
          % (n, "restarts %d" % restarts, p.returncode))
    return p


def decisions(out, mode):
    return [(r["step"], r["scale"], r["skipped"]) for r in rows(os.path.join(out, "metrics.csv"), mode)]


def case_parallel():
    torchrun_bin = EXTRA[0]
    mode = "fp16+scaler" if fp16_here() else "bf16"
    # bf16-sr too: its stochastic rounding must round alike on every rank
    # (where Gloo all-reduces bfloat16 gradients: LibTorch 2.2 and newer).
    sr = os.environ.get("TORCHAMP_GLOO_BF16") == "1"
    if not sr:
        print("bf16-sr not run on 2 ranks: this LibTorch's Gloo has no bfloat16 all-reduce (< 2.2)")
    base = TINY + ["--steps", "12", "--modes", "fp32," + ("bf16-sr," if sr else "") + mode,
                   "--sample", "0"]
    one = os.path.join(WORK, "one")
    run(base + ["--accum", "2", "--out", one])
    two = os.path.join(WORK, "two")
    torchrun(torchrun_bin, 2, base + ["--out", two])
    check(decisions(one, mode) == decisions(two, mode),
          "%s: 2 ranks x 1 micro-batch take the 1-rank, 2-micro-batch run's scales and skips" % mode)
    l1 = [float(r["loss"]) for r in rows(os.path.join(one, "metrics.csv"), "fp32")]
    l2 = [float(r["loss"]) for r in rows(os.path.join(two, "metrics.csv"), "fp32")]
    check(max(abs(a - b) for a, b in zip(l1, l2)) < 1e-3,
          "fp32: 2 ranks' losses = 1 rank's (max diff %.2g)" % max(abs(a - b) for a, b in zip(l1, l2)))
    r0 = open(os.path.join(two, "ranks", "rank0.csv")).read()
    r1 = open(os.path.join(two, "ranks", "rank1.csv")).read()
    check(r0 == r1 and r0.count("\n") == 1 + (3 if sr else 2),
          "both ranks end every mode with the same weights")
    # accumulation under no_sync on 2 ranks: the 1-rank run with 4 micro-batches.
    four = os.path.join(WORK, "four")
    run(base + ["--accum", "4", "--out", four])
    two_acc = os.path.join(WORK, "two-accum")
    torchrun(torchrun_bin, 2, base + ["--accum", "2", "--out", two_acc])
    check(decisions(four, mode) == decisions(two_acc, mode),
          "%s: 2 ranks x 2 micro-batches (no_sync) take the 1-rank, 4-micro-batch run's decisions" % mode)
    # A rank killed after step 7 (after the checkpoint at step 5), restarted by
    # torchrun. On 3 ranks, where a sum's last bits depend on the order DDP's
    # buckets add it in: the checkpoint keeps the rebuilt buckets.
    args = base + ["--checkpoint-every", "5"]
    clean = os.path.join(WORK, "clean")
    torchrun(torchrun_bin, 3, args + ["--out", clean])
    killed = os.path.join(WORK, "killed")
    torchrun(torchrun_bin, 3, args + ["--out", killed], restarts=1,
             env={"TORCHAMP_TRAIN_KILL_AT_STEP": "7",
                  "TORCHAMP_TRAIN_KILL_ONCE": os.path.join(WORK, "killed-once")})
    check(os.path.exists(os.path.join(WORK, "killed-once")), "a rank was killed")
    check(read(os.path.join(clean, "metrics.csv")) == read(os.path.join(killed, "metrics.csv")),
          "restarted by torchrun --max-restarts 1: metrics.csv byte-identical")
    check(table_values(clean) == table_values(killed),
          "restarted by torchrun: the same final weights and table values")


def case_python():
    python, twin = EXTRA[0], EXTRA[1]
    out = os.path.join(WORK, "run")
    modes = "fp32,bf16,bf16-params" + (",fp16+scaler" if fp16_here() else "")
    run(TINY + ["--steps", "12", "--modes", modes, "--sample", "0", "--profile", "2", "--out", out])
    p = subprocess.run([python, twin, out, "--check", "--threads", "1", "--profile", "2"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(p.stdout[-4000:], p.stderr[-3000:], sep="\n")
    if p.returncode == 77:
        sys.exit(77)
    check(p.returncode == 0, "gpt_python.py --check: the runs agree (both sides profiled)")
    rep = run(["--report", out])
    check("Python tokens/s" in rep.stdout, "--report shows both runs")
    where = subprocess.run([sys.executable, os.path.join(os.path.dirname(twin), "profile_report.py"),
                            out], capture_output=True, text=True)
    print(where.stdout[-3000:], where.stderr[-2000:])
    check(where.returncode == 0 and "where the time goes: fp32, 2 profiled step(s)" in where.stdout
          and "C++ eager          Python" in where.stdout
          and "Python, top operators" in where.stdout,
          "profile_report.py: C++ and Python side by side, 2 steps each")


def step_ops(trace):
    """The operators a trace's marked steps call themselves (not those nested
    in another operator: ATen's CPU fused kernels read their flags with item()),
    counted, and the names of every operator in them."""
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e.get("name") == "step"]
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"
                  and any(a <= e["ts"] < b for a, b in steps)),
                 key=lambda e: (e.get("tid"), e["ts"], -e["dur"]))
    top, end = {}, {}
    for e in ops:
        if e["ts"] >= end.get(e.get("tid"), -1.0):
            top[e["name"]] = top.get(e["name"], 0) + 1
            end[e.get("tid")] = e["ts"] + e["dur"]
    return top, {e["name"] for e in ops}


def case_device_step():
    supported = EXTRA[0] == "1"
    base = TINY + ["--dropout", "0", "--steps", "12", "--sample", "0", "--profile", "2"]
    dev = os.path.join(WORK, "device")
    if not supported:
        p = run(base + ["--device-step", "--out", dev], expect=2)
        check("--device-step does not run with this LibTorch" in p.stderr and not os.path.exists(dev),
              "this LibTorch has no ATen CPU fused AdamW: --device-step refused, nothing written (%s)"
              % p.stderr.strip()[-200:])
        return
    p = run(base + ["--device-step", "--dropout", "0.1", "--out", dev], expect=2)
    check("--dropout 0.1" in p.stderr and not os.path.exists(dev),
          "--device-step with dropout: exit 2 naming it, nothing written")
    fp16 = fp16_here()
    modes = ["fp32", "bf16", "bf16-sr"] + (["fp16+scaler"] if fp16 else [])
    args = base + ["--modes", ",".join(modes), "--checkpoint-every", "5"]
    host = os.path.join(WORK, "host")
    run(args + ["--out", host])
    run(args + ["--device-step", "--out", dev])
    reads = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero")
    for mode in modes:
        check(decisions(host, mode) == decisions(dev, mode),
              "%s: the host step's scales and skips at every step" % mode)
        a = [float(r["loss"]) for r in rows(os.path.join(host, "metrics.csv"), mode)]
        b = [float(r["loss"]) for r in rows(os.path.join(dev, "metrics.csv"), mode)]
        tol = 1e-2 if mode.startswith("bf16") else 1e-4
        diff = max(abs(x - y) for x, y in zip(a, b))
        check(len(a) == len(b) == 12 and diff <= tol,
              "%s: the host step's losses within %g (max diff %.2g)" % (mode, tol, diff))
        top, names = step_ops(os.path.join(dev, "trace-%s.json" % mode))
        host_top, host_names = step_ops(os.path.join(host, "trace-%s.json" % mode))
        found = {k: top[k] for k in reads if k in top}
        check(not found and any(k in host_top for k in reads),
              "%s: no host read in the device step's profiled steps (%s), some in the host "
              "step's (%s)" % (mode, found, {k: host_top[k] for k in reads if k in host_top}))
        want = {"aten::_fused_adamw_"} | ({"aten::_amp_update_scale_",
                                           "aten::_amp_foreach_non_finite_check_and_unscale_"}
                                          if mode == "fp16+scaler" else set())
        check(want <= names and "aten::_fused_adamw_" not in host_names,
              "%s: the device step runs %s (the host step torchamp's own kernels)"
              % (mode, sorted(want)))
    if fp16:
        fp = rows(os.path.join(dev, "metrics.csv"), "fp16+scaler")
        check(int(fp[-1]["skipped"]) > 0 and len({r["scale"] for r in fp}) > 2,
              "fp16+scaler: overflows skipped (%s), the scale backed off and grew" % fp[-1]["skipped"])
    # Killed after step 7 of the last mode (its checkpoint at step 5: the
    # scaler's state in tensors, ATen's step counts) and run again.
    killed = os.path.join(WORK, "killed")
    run(args + ["--device-step", "--out", killed],
        env={"TORCHAMP_TRAIN_KILL_AT_STEP": str(12 * (len(modes) - 1) + 7)}, expect=-9)
    q = run(args + ["--device-step", "--out", killed])
    check(", step 5 from" in q.stdout and
          read(os.path.join(dev, "metrics.csv")) == read(os.path.join(killed, "metrics.csv")),
          "killed in %s and resumed at step 5: metrics.csv byte-identical" % modes[-1])
    check(table_values(dev) == table_values(killed),
          "killed and resumed: the same final weights and table values")
    p = run(args + ["--out", killed], expect=2)
    check("whose --device-step is 1, but this one's is unset" in p.stderr,
          "the device step's --out continued without --device-step: exit 2 naming it (%s)"
          % p.stderr.strip()[-200:])


def case_profile():
    report = EXTRA[0]
    out = os.path.join(WORK, "run")
    run(TINY + ["--steps", "6", "--modes", "fp32,bf16", "--sample", "0", "--profile", "2",
                "--out", out])
    for mode in ("fp32", "bf16"):
        with open(os.path.join(out, "trace-%s.json" % mode)) as f:
            events = json.load(f)["traceEvents"]
        steps = [e for e in events if e.get("cat") == "user_annotation" and e.get("name") == "step"]
        ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
        check(len(steps) == 2 and {"aten::addmm", "aten::mm", "aten::copy_"} <= ops,
              "%s: trace-%s.json holds 2 marked steps of ATen operators (%d steps, %d operators)"
              % (mode, mode, len(steps), len(ops)))
    speed = {r["mode"]: float(r["tokens_per_s"]) for r in rows(os.path.join(out, "summary.csv"))}
    check(all(v > 0 for v in speed.values()), "tokens/s over the 3 steps not profiled: %s" % speed)
    where = subprocess.run([sys.executable, report, out], capture_output=True, text=True)
    print(where.stdout[-2000:], where.stderr[-2000:])
    check(where.returncode == 0 and "where the time goes: fp32, 2 profiled step(s)" in where.stdout
          and "host in operators" in where.stdout and "device busy" not in where.stdout
          and "C++ eager, top operators" in where.stdout,
          "profile_report.py: the CPU run's figures, no GPU rows")
    # A GPU's trace by hand, its figures known: two 10 ms steps; in them two
    # kernel launches, one graph launch and one sync; three kernels (two of
    # them overlapping) and a copy: busy 2 + 4 + 2 = 8 ms of 20; a kernel
    # between the steps' ends and the trace's (an evaluation's), not theirs;
    # an operator in another (host in operators 8 of 20; self times 6 and 2).
    def x(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts * 1000.0, "dur": dur * 1000.0,
                "pid": 1, "tid": tid}
    gpu = os.path.join(WORK, "gpu")
    os.makedirs(gpu)
    events = [x("user_annotation", "step", 0, 10), x("user_annotation", "step", 10, 10),
              x("cpu_op", "aten::mm", 1, 8), x("cpu_op", "aten::addmm", 3, 2),
              x("cuda_runtime", "cudaLaunchKernel", 2, 0.5), x("cuda_runtime", "cudaLaunchKernel", 4, 0.5),
              x("cuda_runtime", "cudaGraphLaunch", 11, 0.5),
              x("cuda_runtime", "cudaStreamSynchronize", 12, 5),
              x("kernel", "gemm", 2, 2, 7), x("kernel", "gemm", 5, 3, 7), x("kernel", "add", 6, 3, 8),
              x("gpu_memcpy", "Memcpy DtoH", 14, 2, 7), x("kernel", "eval", 25, 3, 7)]
    with open(os.path.join(gpu, "trace-cuda-fp16+scaler.json"), "w") as f:
        json.dump({"traceEvents": events}, f)
    where = subprocess.run([sys.executable, report, gpu], capture_output=True, text=True)
    print(where.stdout[-2000:], where.stderr[-2000:])
    lines = {l[:22].strip(): l[22:].strip() for l in where.stdout.splitlines()}
    want = {"step": "10.000 ms", "host in operators": "4.000 ms", "host between them": "6.000 ms",
            "device busy": "40% 4.000 ms", "kernels": "2", "launches": "1.5", "syncs": "0.5",
            "operators": "1"}
    got = {k: lines.get(k) for k in want}
    check(got == want, "profile_report.py on a hand-made GPU trace: %s" % got)
    check("top operators (host self ms a step): aten::mm 3.000; aten::addmm 1.000" in where.stdout
          and "top kernels (device ms a step): gemm 2.500; add 1.500; Memcpy DtoH 1.000"
          in where.stdout, "profile_report.py: self times and kernel times of the hand-made trace")


{"modes": case_modes, "errors": case_errors, "resume": case_resume, "parallel": case_parallel,
 "python": case_python, "profile": case_profile, "device_step": case_device_step}[CASE]()
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
