"""The round's profiler ranges: real ``torch.profiler`` ranges while a profiler records, a
shared no-op otherwise (the production round pays one query)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="stage_ranges wraps torch.profiler ranges")

from sglang_dflash.sglang_overlay import timing  # noqa: E402


def test_without_a_profiler_every_range_is_the_same_no_op():
    ranges = timing.stage_ranges()
    assert ranges("draft") is ranges("verify_forward")
    with ranges("draft"):
        pass


def test_under_the_profiler_each_stage_is_a_named_range(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ranges = timing.stage_ranges()
        with ranges("round"):
            with ranges("draft"):
                torch.ones(4).add_(1)
            with ranges("commit"):
                torch.zeros(2).sum()
    trace = tmp_path / "t.json"
    prof.export_chrome_trace(str(trace))
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("cat") == "user_annotation"]
    assert sorted(names) == ["ddtree.commit", "ddtree.draft", "ddtree.round"]


def test_the_enabled_query_is_injectable():
    calls = []
    ranges = timing.stage_ranges(lambda: calls.append(1) or False)
    assert calls == [1] and ranges("x") is ranges("y")
