"""Rendering: tables, the JSON document, the progress line, and the plot's series."""

from __future__ import annotations

import io
import json

import pytest

from sglang_dflash.bench import plot
from sglang_dflash.bench.report import (
    ConfigResult,
    best_table,
    comparison_table,
    document,
    progress_line,
    render_table,
    summary_table,
)
from sglang_dflash.bench.stats import RequestRecord, best_per_concurrency, compare, summarize
from sglang_dflash.commands.bench import Status


def summ(config, conc, tokens, acc=None):
    r = RequestRecord(config, conc, 0, ok=True, latency=1.0, ttft=0.1, output_tokens=tokens,
                      itl=[0.01], spec_accept_length=acc)
    return summarize(config, conc, [r], duration_s=1.0)


def test_render_table_aligns_columns():
    out = render_table(["name", "n"], [["a", "1"], ["longer", "100"]]).splitlines()
    assert out[0] == "name      n"
    assert out[2] == "a         1"
    assert out[3] == "longer  100"


def test_summary_and_comparison_tables_show_values_and_ratios():
    ss = [summ("base", 1, 100, 2.0), summ("new", 1, 124, 3.0)]
    t = summary_table(ss)
    assert "100.0" in t and "124.0" in t and "1/1" in t and "3.00" in t
    c = comparison_table(compare(ss, "base"))
    assert "1.24" in c and "1.50" in c
    assert summary_table([summarize("x", 1, [RequestRecord("x", 1, 0, ok=False)], 1.0)]).count(
        "-/-/-") == 3


def test_document_is_json_and_round_trips_records():
    ss = [summ("base", 1, 10)]
    recs = [RequestRecord("base", 1, 0, ok=True, itl=[0.5])]
    doc = document(machine={"hostname": "h"}, argv=["bench"], interrupted=True,
                   baseline="base", configs=[ConfigResult("base", {"a": 1})], summaries=ss,
                   comparisons=compare(ss, "base"), records=recs)
    back = json.loads(json.dumps(doc))
    assert back["interrupted"] is True and back["records"][0]["itl"] == [0.5]
    assert back["summaries"][0]["output_tokens"] == 10
    assert back["schema"] == "sglang-dflash-bench/1"


def test_progress_line():
    assert progress_line("x", 5, 10, 1.25, width=10) == "x [#####-----] 5/10 1.2s"
    assert progress_line("x", 0, 0, 0.0, width=4) == "x [----] 0/0 0.0s"


def test_plot_series_against_budget():
    cfgs = [ConfigResult(f"b{b}", {"algorithm": "ddtree", "ddtree.budget": b})
            for b in (64, 16)]
    ss = [summ("b64", 1, 200, 4.0), summ("b16", 1, 100, 3.0), summ("b64", 8, 50, 4.0)]
    x_name, data = plot.series(cfgs, ss)
    assert x_name == "ddtree.budget"
    assert data["algorithm=ddtree c=1"] == [(16, 100.0, 3.0), (64, 200.0, 4.0)]
    assert data["algorithm=ddtree c=8"] == [(64, 50.0, 4.0)]


def test_plot_series_without_a_budget_sweep_uses_labels():
    x_name, data = plot.series([ConfigResult("u", {})], [summ("u", 1, 10)])
    assert x_name == "configuration" and data == {"c=1": [("u", 10.0, None)]}


def test_write_plot_makes_a_png(tmp_path):
    try:
        plot.require_matplotlib()
    except ImportError:
        pytest.skip("matplotlib is not installed (the bench extra)")
    cfgs = [ConfigResult(f"b{b}", {"ddtree.budget": b}) for b in (16, 32)]
    out = tmp_path / "p.png"
    plot.write_plot(str(out), cfgs, [summ("b16", 1, 10, 2.0), summ("b32", 1, 20, None)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, quiet, bar", [
    (_Tty, False, True), (_Tty, True, False), (io.StringIO, False, False)])
def test_progress_bar_only_on_a_terminal_and_not_quiet(stream, quiet, bar):
    out = stream()
    st = Status(quiet, out)
    st.progress("x [##--] 1/2 0.1s")
    st.say("done")
    text = out.getvalue()
    assert ("\rx [##--]" in text) == bar
    assert ("bench: done" in text) == (not quiet)
    st.error("boom")
    assert out.getvalue().endswith("sglang-dflash bench: boom\n")


def test_best_per_concurrency_picks_the_fastest_clean_configuration():
    failed = summarize("broken", 8, [RequestRecord("broken", 8, 0, ok=True, latency=1.0,
                                                   output_tokens=9000),
                                     RequestRecord("broken", 8, 1, ok=False)], 1.0)
    ss = [summ("base", 1, 100), summ("n16", 1, 150), summ("n64", 1, 180),
          summ("base", 8, 800), summ("n16", 8, 900), summ("n64", 8, 700), failed,
          summ("tie-a", 32, 50), summ("tie-b", 32, 50)]
    best = best_per_concurrency(ss, "base")
    assert [(b.concurrency, b.config, b.candidates) for b in best] == [
        (1, "n64", 3), (8, "n16", 3), (32, "tie-a", 2)]
    assert best[0].throughput_ratio == pytest.approx(1.8)
    assert best[1].throughput_ratio == pytest.approx(900 / 800)
    assert best[2].throughput_ratio is None  # no baseline at that level
    table = best_table(best).splitlines()
    assert table[0].split() == ["fastest", "config", "conc", "out", "tok/s", "x", "baseline", "of"]
    assert table[2].split() == ["n64", "1", "180.0", "1.80", "3"]
    assert table[4].split() == ["tie-a", "32", "50.0", "-", "2"]
    # a level where every configuration failed a request has no recommendation
    assert best_per_concurrency([failed], "base") == []
    doc = document(machine={}, argv=[], interrupted=False, baseline="base", configs=[],
                   summaries=ss, comparisons=[], records=[], best=best)
    assert json.loads(json.dumps(doc))["best"][1] == {
        "concurrency": 8, "config": "n16", "output_tokens_per_s": 900.0,
        "throughput_ratio": pytest.approx(1.125), "candidates": 3}


def test_plot_offsets_keep_every_series_visible():
    """Series with equal values at one x would hide each other; each gets its own offset."""
    from sglang_dflash.bench.plot import SPREAD, spread

    assert spread(0, 1) == 0.0
    offs = [spread(i, 5) for i in range(5)]
    assert len(set(offs)) == 5 and min(offs) == -SPREAD / 2 and max(offs) == SPREAD / 2


def test_write_plot_one_x_position_makes_a_png(tmp_path):
    """A --url run (one configuration, several concurrencies): the points sit side by side."""
    try:
        plot.require_matplotlib()
    except ImportError:
        pytest.skip("matplotlib is not installed (the bench extra)")
    out = tmp_path / "one.png"
    plot.write_plot(str(out), [ConfigResult("u", {})],
                    [summ("u", 1, 10, 2.0), summ("u", 8, 10, 2.0)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
