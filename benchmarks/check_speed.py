"""Time `sglang-dflash check --offline` against `python -c "import torch, sglang"`.

Both run N times in the same environment (same interpreter, same PYTHONPATH); the
medians and their ratio are printed as JSON. Target: check <= 1.5x the baseline.

    python benchmarks/check_speed.py [-n 5] [--pythonpath SITE] [--baseline "import torch, sglang"]

When the baseline cannot run here (e.g. sglang installed without its dependencies),
the JSON says so and falls back to `import torch` (reported as such, never silently).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CHECK = [sys.executable, "-m", "sglang_dflash", "check", "--offline"]
FALLBACK = "import torch"


def timed(cmd: list[str], env: dict[str, str], n: int) -> tuple[list[float], int, str]:
    """n wall-clock timings of cmd; (seconds, last exit code, last stderr line)."""
    times, rc, tail = [], 0, ""
    for _ in range(n):
        start = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        times.append(time.perf_counter() - start)
        rc = p.returncode
        tail = (p.stderr.strip().splitlines() or [""])[-1]
    return times, rc, tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="runs per command (default 5)")
    ap.add_argument("--pythonpath", default=None, help="prepend this to PYTHONPATH for both")
    ap.add_argument("--baseline", default="import torch, sglang", help="baseline -c code")
    args = ap.parse_args(argv)
    if args.n < 1:
        print("check_speed: -n must be >= 1", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pythonpath,
                                                          env.get("PYTHONPATH")]))
    # one warm-up each so the page cache is warm for both
    subprocess.run(CHECK, env=env, capture_output=True, timeout=600)
    baseline = args.baseline
    _, base_rc, base_err = timed([sys.executable, "-c", baseline], env, 1)
    note = ""
    if base_rc != 0:
        note = f"baseline {baseline!r} failed here ({base_err}); fell back to {FALLBACK!r}"
        baseline = FALLBACK
    # interleaved, so load from anything else on the machine hits both alike
    base_times, check_times, base_rc, check_rc = [], [], 0, 0
    for _ in range(args.n):
        t, base_rc, _ = timed([sys.executable, "-c", baseline], env, 1)
        base_times += t
        t, check_rc, _ = timed(CHECK, env, 1)
        check_times += t
    b, c = statistics.median(base_times), statistics.median(check_times)
    print(json.dumps({
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, "
                   f"Python {platform.python_version()})",
        "runs": args.n,
        "pythonpath": env.get("PYTHONPATH", ""),
        "check_cmd": " ".join(CHECK[1:]),
        "check_median_s": round(c, 3),
        "check_exit_code": check_rc,
        "baseline_cmd": f"python -c {baseline!r}",
        "baseline_median_s": round(b, 3),
        "baseline_exit_code": base_rc,
        "ratio": round(c / b, 3) if b else None,
        "target_ratio": 1.5,
        "within_target": bool(b) and c / b <= 1.5,
        "note": note,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
