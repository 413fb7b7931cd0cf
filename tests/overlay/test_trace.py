"""First-round tracing: real torch.profiler on the CPU, one trace per new batch size, a limit,
failures that switch tracing off without touching the round, and the env switch."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from sglang_dflash.sglang_overlay.diagnostics import trace  # noqa: E402


def a_round(bs: int) -> torch.Tensor:
    """Work that shows up in the profiler: a matmul sized by the batch."""
    x = torch.ones(bs * 8, 64)
    return (x @ x.T).sum()


def test_traces_the_first_round_of_each_batch_size_only(tmp_path):
    t = trace.FirstRoundTracer(tmp_path / "tr", limit=8)
    results = []
    for bs in (1, 1, 2, 1, 2, 3):
        with t.round(bs):
            results.append(float(a_round(bs)))
    assert results == [float(a_round(bs)) for bs in (1, 1, 2, 1, 2, 3)]  # rounds unaffected
    assert t.error is None and t.seen == {1, 2, 3}
    files = sorted(p.name for p in (tmp_path / "tr").iterdir())
    assert files == ["round-bs1.txt", "round-bs2.txt", "round-bs3.txt", "rounds.jsonl"]
    text = (tmp_path / "tr" / "round-bs2.txt").read_text()
    assert text.startswith("DDTree first round at bs=2: wall ")
    assert "aten::mm" in text or "aten::matmul" in text
    lines = [json.loads(ln) for ln in (tmp_path / "tr" / "rounds.jsonl").read_text().splitlines()]
    assert [ln["bs"] for ln in lines] == [1, 2, 3]
    names = {op["name"] for op in lines[0]["top_ops"]}
    assert names & {"aten::mm", "aten::matmul"}
    assert all(op["self_cpu_ms"] >= 0 and op["count"] >= 1 for op in lines[0]["top_ops"])
    assert lines[0]["wall_ms"] > 0


def test_limit_caps_the_number_of_batch_sizes(tmp_path):
    t = trace.FirstRoundTracer(tmp_path, limit=2)
    for bs in (4, 5, 6, 7):
        with t.round(bs):
            a_round(bs)
    assert t.seen == {4, 5}
    assert sorted(p.name for p in tmp_path.glob("round-bs*.txt")) == [
        "round-bs4.txt",
        "round-bs5.txt",
    ]


def test_a_profiler_that_fails_switches_tracing_off_and_the_round_still_runs(tmp_path):
    def broken():
        raise RuntimeError("kineto unavailable")

    t = trace.FirstRoundTracer(tmp_path, profiler_factory=broken)
    ran = []
    with t.round(1):
        ran.append(1)
    with t.round(2):
        ran.append(2)
    assert ran == [1, 2]
    assert t.error == "RuntimeError: kineto unavailable"
    assert not t.wants(3) and list(tmp_path.iterdir()) == []


def test_an_unwritable_directory_switches_tracing_off(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    t = trace.FirstRoundTracer(blocker / "sub")
    with t.round(1):
        a_round(1)
    assert t.error is not None and not t.wants(2)


def test_an_exception_in_the_round_propagates_and_the_trace_is_still_written(tmp_path):
    t = trace.FirstRoundTracer(tmp_path)
    with pytest.raises(ValueError, match="round failed"), t.round(1):
        a_round(1)
        raise ValueError("round failed")
    assert (tmp_path / "round-bs1.txt").exists() and t.error is None


def test_from_env_is_off_by_default_and_reads_the_limit(tmp_path):
    assert trace.from_env({}) is None
    assert trace.from_env({trace.TRACE_ENV: "  "}) is None
    t = trace.from_env({trace.TRACE_ENV: str(tmp_path), trace.MAX_ENV: "3"})
    assert t is not None and t.directory == tmp_path and t.limit == 3
    for bad in ("", "0", "-2", "x"):
        assert trace.parse_max(bad) == trace.DEFAULT_MAX
