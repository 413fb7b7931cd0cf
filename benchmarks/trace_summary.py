"""Summarise a torch.profiler chrome trace (what SGLang's /start_profile writes) into a small
table: where a decode step's wall time goes, so rounds of different modes can be compared
(issue 14 item 2: what a DDTree round costs outside its profiled stages).

    python3 benchmarks/trace_summary.py TRACE.json[.gz] --steps 40 [--json OUT]

Per step: wall span, GPU busy time (union of kernel/memcpy/memset intervals), GPU idle time
and its gaps longer than 20 us, kernels launched, CUDA-graph launches, host-blocking CUDA calls
(stream/event/device synchronize, and memcpy calls, which block for device-to-host copies)
with their host time; and the top CPU ops and kernels by total time. Named ranges
(``user_annotation`` events: the DDTree round's ``ddtree.<stage>`` ranges) get their host time
and the GPU time of the kernels launched inside them (linked by the launch's correlation id,
a CUDA graph's kernels included), and the host time per step outside ``ddtree.round`` (what
the scheduler and SGLang's result processing cost between rounds). Pure function over the
trace's events; the file reading is the only I/O.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
COPY_CALLS = ("cudaMemcpyAsync", "cudaMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
GRAPH_CALLS = ("cudaGraphLaunch", "cuGraphLaunch")
GAP_US = 20.0
ROUND_RANGE = "ddtree.round"


def load(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def union_us(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """Total length of the union of [start, end) intervals, and the gaps between them."""
    total, gaps = 0.0, []
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None:
            cur_s, cur_e = s, e
        elif s <= cur_e:
            cur_e = max(cur_e, e)
        else:
            total += cur_e - cur_s
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
    if cur_e is not None:
        total += cur_e - cur_s
    return total, gaps


def _top(acc: dict[str, list[float]], n: int, steps: int) -> list[dict]:
    rows = sorted(acc.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": k[:120], "ms_per_step": round(v[0] / 1000 / steps, 4),
             "calls_per_step": round(v[1] / steps, 2)} for k, v in rows]


def range_table(events: list[dict], steps: int, top: int = 20) -> list[dict]:
    """Host and GPU time per step of each named range: host = the range's own span; GPU = the
    kernels whose launch (a runtime call on the same thread inside the span) correlates with
    them; launches = kernel launches (not graph launches) inside the span; syncs = host-blocking
    synchronize calls that start inside the span, and their host time (which stage waits on
    the GPU). Nested ranges each count their whole span."""
    gpu_by_corr: dict = defaultdict(float)
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in GPU_CATS and corr is not None:
            gpu_by_corr[corr] += float(e["dur"])
    launches: dict = defaultdict(list)  # (pid, tid) -> sorted [(ts, correlation)]
    for e in events:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and corr is not None:
            launches[(e.get("pid"), e.get("tid"))].append(
                (float(e["ts"]), corr, e.get("name") in LAUNCH_CALLS))
    syncs: dict = defaultdict(list)  # (pid, tid) -> sorted [(ts, dur)]
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in SYNC_CALLS:
            syncs[(e.get("pid"), e.get("tid"))].append((float(e["ts"]), float(e["dur"])))
    for v in (*launches.values(), *syncs.values()):
        v.sort(key=lambda x: x[0])
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0, 0, 0.0])
    for e in events:
        if e.get("cat") != "user_annotation":
            continue
        ts, dur = float(e["ts"]), float(e["dur"])
        row = acc[str(e.get("name", ""))]
        row[0] += dur
        row[2] += 1
        calls = launches.get((e.get("pid"), e.get("tid")), [])
        lo = bisect.bisect_left(calls, ts, key=lambda x: x[0])
        hi = bisect.bisect_right(calls, ts + dur, key=lambda x: x[0])
        row[1] += sum(gpu_by_corr.get(c, 0.0) for _, c, _ in calls[lo:hi])
        row[3] += sum(1 for *_, launch in calls[lo:hi] if launch)
        waits = syncs.get((e.get("pid"), e.get("tid")), [])
        lo = bisect.bisect_left(waits, ts, key=lambda x: x[0])
        hi = bisect.bisect_right(waits, ts + dur, key=lambda x: x[0])
        row[4] += hi - lo
        row[5] += sum(d for _, d in waits[lo:hi])
    rows = sorted(acc.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": k[:120], "host_ms_per_step": round(v[0] / 1000 / steps, 4),
             "gpu_ms_per_step": round(v[1] / 1000 / steps, 4),
             "calls_per_step": round(v[2] / steps, 2),
             "launches_per_step": round(v[3] / steps, 2),
             "syncs_per_step": round(v[4] / steps, 2),
             "sync_ms_per_step": round(v[5] / 1000 / steps, 4)} for k, v in rows]


def summarise(trace: dict, steps: int, top: int = 15) -> dict:
    """The per-step table of one trace; ``steps`` = the forward steps it covers."""
    if steps <= 0:
        raise ValueError("steps must be positive")
    events = [e for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and "ts" in e and "dur" in e]
    gpu = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
           if e.get("cat") in GPU_CATS]
    busy, gaps = union_us(gpu)
    if gpu:
        first, last = min(s for s, _ in gpu), max(e for _, e in gpu)
    else:
        spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
        first, last = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0, 0)
    wall = last - first
    runtime: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    cpu_ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        cat, name, dur = e.get("cat"), str(e.get("name", "")), float(e["dur"])
        acc = {"cuda_runtime": runtime, "cuda_driver": runtime, "cpu_op": cpu_ops,
               "kernel": kernels}.get(cat)
        if acc is not None:
            acc[name][0] += dur
            acc[name][1] += 1

    def calls(names) -> tuple[int, float]:
        return (sum(int(runtime[n][1]) for n in names if n in runtime),
                sum(runtime[n][0] for n in names if n in runtime))

    n_sync, t_sync = calls(SYNC_CALLS)
    n_copy, t_copy = calls(COPY_CALLS)
    n_launch, _ = calls(LAUNCH_CALLS)
    n_graph, _ = calls(GRAPH_CALLS)
    long_gaps = [g for g in gaps if g > GAP_US]
    per = 1000.0 * steps  # us -> ms per step
    ranges = range_table(events, steps)
    round_host = next((r["host_ms_per_step"] for r in ranges if r["name"] == ROUND_RANGE), None)
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall / per, 4),
        "gpu_busy_ms_per_step": round(busy / per, 4),
        "gpu_idle_ms_per_step": round((wall - busy) / per, 4),
        "gpu_busy_share": round(busy / wall, 4) if wall else None,
        "idle_gaps_over_20us_per_step": round(len(long_gaps) / steps, 2),
        "idle_in_gaps_over_20us_ms_per_step": round(sum(long_gaps) / per, 4),
        "kernels_per_step": round(sum(int(v[1]) for v in kernels.values()) / steps, 2),
        "kernel_launch_calls_per_step": round(n_launch / steps, 2),
        "graph_launches_per_step": round(n_graph / steps, 2),
        "sync_calls_per_step": round(n_sync / steps, 2),
        "sync_host_ms_per_step": round(t_sync / per, 4),
        "memcpy_calls_per_step": round(n_copy / steps, 2),
        "memcpy_host_ms_per_step": round(t_copy / per, 4),
        "top_cpu_ops": _top(cpu_ops, top, steps),
        "top_kernels": _top(kernels, top, steps),
        "top_runtime_calls": _top(runtime, 8, steps),
        "ranges": ranges,
        "round_host_ms_per_step": round_host,
        "outside_round_host_ms_per_step": (round(wall / per - round_host, 4)
                                           if round_host is not None else None),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, required=True, help="forward steps the trace covers")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.steps <= 0:
        print("trace_summary: --steps must be positive", file=sys.stderr)
        return 2
    try:
        trace = load(args.trace)
    except (OSError, ValueError) as exc:
        print(f"trace_summary: {args.trace}: {exc}", file=sys.stderr)
        return 2
    out = json.dumps(summarise(trace, args.steps), indent=1)
    if args.json:
        args.json.write_text(out + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
