"""benchmarks/profile_table.py on files the real profiler wrote: values, filters, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sglang_dflash.sglang_overlay.diagnostics import profile as prof

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "profile_table.py"


class ScriptedEvent:
    """An event whose record() takes the next time from a shared script (ms)."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.t = clock, 0.0

    def record(self) -> None:
        self.t = self.clock.pop(0)

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: ScriptedEvent) -> float:
        return end.t - self.t


def write_profile(path: Path, rounds: list[tuple[int, tuple[float, ...]]], every: int) -> None:
    """Drive a real RoundProfiler: each round's stage durations become six scripted marks."""
    clock: list[float] = []
    t = 0.0
    for _bs, stages in rounds:
        clock.append(t)
        for d in stages:
            t += d
            clock.append(t)
    p = prof.RoundProfiler(path, every=every, event_factory=lambda: ScriptedEvent(clock))
    for bs, _ in rounds:
        for i in range(prof.MARKS):
            p.mark(i, bs if i == 0 else None)
    assert p.error is None


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_median_of_window_p50s_and_first_window_mean(tmp_path):
    # window 0: bs=1 rounds with a slow first tree (a compile), window 1: steady rounds
    slow = (1.0, 50.0, 1.0, 6.0, 0.5)
    fast = (1.0, 0.2, 1.0, 6.0, 0.5)
    rounds = [(1, slow)] + [(1, fast)] * 3 + [(1, fast)] * 4 + [(8, (2.0, 0.3, 1.0, 12.0, 1.0))] * 4
    path = tmp_path / "profile-x.jsonl"
    write_profile(path, rounds, every=4)
    res = run(str(path))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("| profile | bs | rounds | draft | tree |")
    row1 = [c.strip() for c in lines[2].strip("|").split("|")]
    # bs=1: 8 rounds in 2 windows; p50 of tree is 0.2 in both; first window mean (50+0.6)/4
    assert row1[:3] == ["profile-x.jsonl", "1", "8"]
    assert row1[4] == "0.20"
    assert row1[9] == f"{100 * 0.2 / 6.0:.1f}%"
    assert row1[10] == f"{(50.0 + 3 * 0.2) / 4:.2f}"
    row8 = [c.strip() for c in lines[3].strip("|").split("|")]
    assert row8[:3] == ["profile-x.jsonl", "8", "4"]
    assert row8[7] == "1.00" and row8[8] == f"{2.0 + 0.3 + 1.0 + 12.0 + 1.0:.2f}"


def test_bs_filter_keeps_only_named_batch_sizes(tmp_path):
    path = tmp_path / "p.jsonl"
    write_profile(path, [(1, (1.0,) * 5)] * 2 + [(8, (1.0,) * 5)] * 2, every=2)
    res = run("--bs", "8", str(path))
    assert res.returncode == 0, res.stderr
    assert [ln.split("|")[2].strip() for ln in res.stdout.splitlines()[2:]] == ["8"]


def test_bad_inputs_are_one_line_and_nonzero_but_good_files_still_print(tmp_path):
    good = tmp_path / "good.jsonl"
    write_profile(good, [(1, (1.0,) * 5)] * 2, every=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"bs": 1}\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = run(str(good), str(bad), str(empty), str(tmp_path / "missing.jsonl"))
    assert res.returncode == 1
    err = res.stderr.strip().splitlines()
    assert err == [
        f"profile_table: {bad}:1: not a DDTree profile record",
        f"profile_table: {empty}: no profile records",
        f"profile_table: {tmp_path / 'missing.jsonl'}: No such file or directory",
    ]
    assert "good.jsonl" in res.stdout
    stringy = tmp_path / "stringy.jsonl"
    rec = json.loads(good.read_text().splitlines()[0])
    rec["ms"]["tree"]["p50"] = "0.2"  # valid JSON, wrong type
    stringy.write_text(json.dumps(rec) + "\nnot json\n")
    res = run(str(stringy))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip() == f"profile_table: {stringy}:1: not a DDTree profile record"
    res = run("--bs", "0,x", str(good))
    assert res.returncode == 2 and "expected positive integers" in res.stderr
