"""Per-round profiling: aggregation, the ring's flush cadence, the file, the off switch."""

from __future__ import annotations

import json

from sglang_dflash.sglang_overlay.diagnostics import profile as prof


class ScriptedEvent:
    """An event whose record() takes the next time from a shared script (ms)."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.t, self.synced = clock, None, 0

    def record(self) -> None:
        self.t = self.clock.pop(0)

    def synchronize(self) -> None:
        self.synced += 1

    def elapsed_time(self, end: ScriptedEvent) -> float:
        return end.t - self.t


def test_summarize_groups_by_bs_with_mean_and_median():
    rounds = [
        prof.RoundTimes(1, (1.0, 2.0, 0.5, 3.0, 4.0)),
        prof.RoundTimes(1, (3.0, 2.0, 0.5, 5.0, 4.0)),
        prof.RoundTimes(1, (8.0, 2.0, 0.5, 4.0, 4.0)),
        prof.RoundTimes(8, (10.0, 1.0, 0.5, 1.0, 1.0)),
    ]
    recs = prof.summarize(rounds, window=3, extra={"budget": 16})
    assert [(r["bs"], r["rounds"], r["window"], r["budget"]) for r in recs] == [
        (1, 3, 3, 16),
        (8, 1, 3, 16),
    ]
    ms = recs[0]["ms"]
    assert ms["draft"] == {"mean": 4.0, "p50": 3.0}
    assert ms["verify"] == {"mean": 4.0, "p50": 4.0}
    assert ms["prep"] == {"mean": 0.5, "p50": 0.5}
    assert ms["total"] == {"mean": 14.5, "p50": 14.5}  # totals 10.5, 14.5, 18.5
    assert recs[1]["ms"]["total"]["mean"] == 13.5


def test_ring_flushes_every_k_rounds_with_one_wait(tmp_path):
    # Round r's marks at 100r + cumulative (1, 2, 3, 4, 5): stages 1, 2, 3, 4, 5 ms.
    clock = [100.0 * r + c for r in range(5) for c in (0, 1, 3, 6, 10, 15)]
    events: list[ScriptedEvent] = []

    def factory():
        events.append(ScriptedEvent(clock))
        return events[-1]

    out = tmp_path / "p.jsonl"
    p = prof.RoundProfiler(out, every=2, event_factory=factory, extra={"budget": 4})
    for r in range(5):
        for i in range(prof.MARKS):
            p.mark(i, bs=1 + (r % 2) if i == 0 else None)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    # Two full windows (rounds 0-1, 2-3), each with bs 1 and bs 2; round 4 waits in the ring.
    assert [(x["window"], x["bs"], x["rounds"]) for x in lines] == [
        (0, 1, 1), (0, 2, 1), (1, 1, 1), (1, 2, 1),
    ]  # fmt: skip
    for x in lines:
        assert [x["ms"][s]["mean"] for s in prof.STAGES] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert x["ms"]["total"]["p50"] == 15.0
    assert sum(e.synced for e in events) == 2  # one host wait per flush, none per round
    tail = p.flush()
    assert len(tail) == 1 and tail[0]["rounds"] == 1 and tail[0]["window"] == 2
    assert p.flush() == []


def test_host_events_and_env_switch(tmp_path):
    assert prof.from_env({}) is None
    assert prof.from_env({prof.PROFILE_ENV: "  "}) is None
    path = tmp_path / "h.jsonl"
    p = prof.from_env({prof.PROFILE_ENV: str(path), prof.EVERY_ENV: "3"})
    assert p is not None and p.every == 3
    for _ in range(3):
        for i in range(prof.MARKS):
            p.mark(i, bs=2)
    (rec,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert rec["rounds"] == 3 and rec["bs"] == 2
    assert all(rec["ms"][s]["mean"] >= 0.0 for s in prof.STAGES)
    assert prof.parse_every("x") == prof.parse_every("0") == prof.DEFAULT_EVERY


def test_unwritable_file_switches_profiling_off(tmp_path):
    p = prof.RoundProfiler(tmp_path / "no" / "such" / "dir.jsonl", every=1)
    for i in range(prof.MARKS):
        p.mark(i, bs=1)
    assert p.error is not None and "FileNotFoundError" in p.error
    for i in range(prof.MARKS):
        p.mark(i, bs=1)  # no raise, no effect
    assert not (tmp_path / "no").exists()
