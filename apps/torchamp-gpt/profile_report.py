#!/usr/bin/env python3
"""Where a step's time goes: torchamp-gpt's and its Python twin's profiles.

Usage: profile_report.py RUN_DIR [--top K]

Reads the traces that `torchamp-gpt --profile N` (trace-MODE.json) and
`gpt_python.py RUN_DIR --profile N` (python-trace-MODE.json) wrote in a run
folder: Chrome traces of LibTorch's and torch.profiler's Kineto, each step
marked by a user annotation "step". For each mode it prints, a step on
average, side by side for C++ eager, C++ captured (MODE+graph) and Python:

  step                 the wall time of a step (its "step" mark)
  host in operators    time some ATen operator ran on the host (their union
                       over every thread: the autograd engine's included)
  host between them    the rest of the step: the program's own code (Python's
                       interpreter, C++'s loop), the profiler's
  device busy          time some kernel, copy or fill ran on the GPU (the
                       union), and its share of the step
  kernels              kernels, copies and fills run on the GPU
  launches             the CUDA runtime's launch calls (a replayed graph's
                       whole step is one cudaGraphLaunch)
  syncs                calls that wait for the GPU (cuda*Synchronize, a
                       blocking cudaMemcpy)
  operators            ATen operators called on the host

(the four GPU rows only where a trace holds a GPU's events; the GPU's
figures count the kernels that overlap a step), then the top K operators by
host self time and the top K kernels by device time. Standard library
only: it runs with any python3.
"""
import argparse
import glob
import json
import os
import sys

DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def union(intervals):
    """The total length covered by (start, end) intervals."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total


def self_times(ops):
    """name -> host self time (its duration less its nested operators'), per thread."""
    out = {}
    by_tid = {}
    for e in ops:
        by_tid.setdefault(e.get("tid"), []).append(e)
    for events in by_tid.values():
        stack = []  # [end, name, self]
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1][0] <= e["ts"]:
                _, name, own = stack.pop()
                out[name] = out.get(name, 0.0) + own
            if stack:
                stack[-1][2] -= e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], e["dur"]])
        for _, name, own in stack:
            out[name] = out.get(name, 0.0) + own
    return out


def summarize(path):
    with open(path) as f:
        events = [e for e in json.load(f).get("traceEvents", [])
                  if e.get("ph") == "X" and "dur" in e and "ts" in e]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e.get("name") == "step"]
    if not steps:
        return None
    n = len(steps)
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in steps]

    def step_end(e):  # the end of the step `e` starts in; None outside the steps
        return next((b for a, b in windows if a <= e["ts"] < b), None)

    ops = [e for e in events if e.get("cat") == "cpu_op" and step_end(e) is not None]
    # Kernels run after their launch; those that overlap no step (an
    # evaluation's, between steps) are not the steps'.
    device = [e for e in events if e.get("cat") in DEVICE
              and any(e["ts"] < b and a < e["ts"] + e["dur"] for a, b in windows)]
    runtime = [e for e in events
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and step_end(e) is not None]
    kernel_time = {}
    for e in device:
        kernel_time[e["name"]] = kernel_time.get(e["name"], 0.0) + e["dur"]
    wall = sum(b - a for a, b in windows)
    in_ops = union([(e["ts"], min(e["ts"] + e["dur"], step_end(e))) for e in ops])
    busy = union([(e["ts"], e["ts"] + e["dur"]) for e in device])
    ms = 1e-3 / n  # microseconds in all -> milliseconds a step
    return {
        "steps": n,
        "step": wall * ms,
        "host in operators": in_ops * ms,
        "host between them": (wall - in_ops) * ms,
        "device busy": busy * ms,
        "kernels": len(device) / n,
        "launches": sum("Launch" in e["name"] for e in runtime) / n,
        "syncs": sum(e["name"] in SYNCS for e in runtime) / n,
        "operators": len(ops) / n,
        "top operators": sorted(((t * ms, k) for k, t in self_times(ops).items()), reverse=True),
        "top kernels": sorted(((t * ms, k) for k, t in kernel_time.items()), reverse=True),
    }


def count(value):
    """A count a step: 1, 1.5."""
    return ("%.1f" % value).rstrip("0").rstrip(".")


def short(name, width=70):
    return name if len(name) <= width else name[:width - 3] + "..."


def report(run_dir, top):
    traces = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "*trace-*.json"))):
        base = os.path.basename(path)[:-len(".json")]
        side, mode = ("Python", base[len("python-trace-"):]) if base.startswith("python-") \
            else ("C++", base[len("trace-"):])
        summary = summarize(path)
        if summary:
            traces[(side, mode)] = summary
    if not traces:
        print("no profile in %s (torchamp-gpt --profile N, gpt_python.py --profile N)" % run_dir)
        return 1
    for mode in sorted({m for s, m in traces if s == "C++" and not m.endswith("+graph")} |
                       {m for s, m in traces if s == "Python"}):
        columns = [(label, traces[key]) for label, key in
                   (("C++ eager", ("C++", mode)), ("C++ captured", ("C++", mode + "+graph")),
                    ("Python", ("Python", mode))) if key in traces]
        steps = "/".join(sorted({str(c["steps"]) for _, c in columns}))
        print("\nwhere the time goes: %s, %s profiled step(s), a step on average" % (mode, steps))
        print("%-22s" % "" + "".join("%16s" % label for label, _ in columns))
        gpu = any(c["kernels"] or c["launches"] for _, c in columns)  # else no GPU rows
        for row, unit in (("step", "ms"), ("host in operators", "ms"), ("host between them", "ms"),
                          ("device busy", "ms"), ("kernels", ""), ("launches", ""), ("syncs", ""),
                          ("operators", "")):
            if not gpu and row in ("device busy", "kernels", "launches", "syncs"):
                continue
            cells = []
            for _, c in columns:
                value = c[row]
                cell = ("%.3f %s" % (value, unit)) if unit else count(value)
                if row == "device busy" and c["step"] > 0 and value > 0:
                    cell = "%.0f%% %s" % (100 * value / c["step"], cell)
                cells.append("%16s" % cell)
            print("%-22s" % row + "".join(cells))
        eager, graphed = traces.get(("C++", mode)), traces.get(("C++", mode + "+graph"))
        if eager and graphed and graphed["kernels"] < eager["kernels"]:
            print("(C++ captured: %s kernels a step against eager's %s; where CUPTI misses a "
                  "replayed graph's kernels, its device rows are short)"
                  % (count(graphed["kernels"]), count(eager["kernels"])))
        for label, c in columns:
            for what, unit in (("top operators", "host self"), ("top kernels", "device")):
                if c[what]:
                    print("%s, %s (%s ms a step): %s" % (
                        label, what, unit,
                        "; ".join("%s %.3f" % (short(k), t) for t, k in c[what][:top])))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--top", type=int, default=5, help="operators and kernels listed (default 5)")
    args = ap.parse_args()
    return report(args.run_dir, args.top)


if __name__ == "__main__":
    sys.exit(main())
