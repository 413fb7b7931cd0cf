"""``real_drafter.summarise`` on a real toy pair's report and two calls' results files (the same
pair served in two calls, as the GPU sessions do), with the tie margin's verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py

from real_drafter import summarise  # noqa: E402

from .test_real_drafter import toy  # noqa: E402, F401  (the module-scoped toy pair fixture)


def _serve(label: str, outputs: list[list[int]], rounds: int, backend: str = "triton",
           hists: list | None = None) -> dict:
    hists = hists or [None] * len(outputs)
    return {"label": label, "backend": backend,
            "greedy": [{"output": o, "spec_verify_ct": rounds, "completion_tokens": len(o),
                        "spec_accept_histogram": h} for o, h in zip(outputs, hists, strict=True)]}


def _served(mode: str, tok_s: list[float], accept: float | None, backend: str = "triton",
            levels: tuple = (1, 8, 32)) -> list[dict]:
    return [{"mode": mode, "backend": backend, "concurrency": c, "tok_s": t,
             "accept_length": accept} for c, t in zip(levels, tok_s, strict=True)]


def test_two_calls_results_and_the_tie_verdict(toy, tmp_path):  # noqa: F811
    pair, _ = toy
    ref = [[5] * 256, [6] * 256]
    other = [[5] * 256, [6] * 10 + [7] * 246]
    (tmp_path / "sA").mkdir()
    (tmp_path / "sB").mkdir()
    a = tmp_path / "sA" / "results.json"
    b = tmp_path / "sB" / "results.json"
    a.write_text(json.dumps({"serve": {"none": _serve("none", ref, 256)},
                             "served": _served("none", [600.0, 4000.0, 14000.0], None)}))
    b.write_text(json.dumps({
        "serve": {"dflash": _serve("dflash", other, 200)},
        "served": _served("dflash", [300.0, 2000.0, 6000.0], 1.3),
        "seeded": {"seeded:dflash": {"summary": {"all_identical": False, "prompts": 2},
                                     "rows": [{"first_diff": None}, {"first_diff": 3}]}}}))
    tie = tmp_path / "tie.json"
    tie.write_text(json.dumps({"reference": "none", "rule": "numerics iff gap <= 2 * eps",
                               "seeded_rule": "draws", "summary": {
                                   "lossless_explained": True, "divergences": 1,
                                   "mismatches": 0, "seeded_unjudged": 0, "per_mode": {}}}))
    out = tmp_path / "real-drafter.json"
    rc = summarise.main(["--report", str(pair / "report.json"), "--results", str(a),
                         "--results", str(b), "--tie", str(tie), "--out", str(out),
                         "--machine", "a test", "--command", "c1"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["greedy_identical_all_modes"] is False
    assert doc["greedy_first_diff_vs_none"] == {"dflash@triton": [None, 10]}
    assert {(r["mode"], r["concurrency"]) for r in doc["served"]} == {
        (m, c) for m in ("none", "dflash") for c in (1, 8, 32)}
    by = {(r["mode"], r["concurrency"]): r for r in doc["ratios"]}
    assert by[("dflash", 8)]["over_none"] == 0.5
    assert doc["seeded"]["seeded:dflash"]["first_diff"] == [None, 3]
    assert doc["tie_margin"]["lossless_explained"] is True
    assert doc["tie_margin"]["reference"] == "none"
    # both results.json are recorded, by the path given
    assert {str(a), str(b), str(tie), str(pair / "report.json")} == set(doc["raw_sha256"])
    assert doc["machine"] == "a test" and doc["commands"] == ["c1"]
    assert doc["offline_accept_length_dflash"] >= 1.0


def test_missing_or_broken_input_is_one_line(toy, tmp_path, capsys):  # noqa: F811
    pair, _ = toy
    broken = tmp_path / "results.json"
    broken.write_text("{nope")
    base = ["--report", str(pair / "report.json"), "--out", str(tmp_path / "o.json"),
            "--machine", "m"]
    assert summarise.main([*base, "--results", str(tmp_path / "absent.json")]) == 2
    assert summarise.main([*base, "--results", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "absent.json: no such file" in err[0]
    assert err[1].startswith("summarise: unreadable JSON")
    assert not (tmp_path / "o.json").exists()


def test_png_names_the_machine_and_backend(toy, tmp_path):  # noqa: F811
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: --png needs it")
    pair, _ = toy
    res = tmp_path / "results.json"
    res.write_text(json.dumps({"serve": {}, "served": _served("none", [1.0, 2.0, 3.0], None)}))
    png = tmp_path / "p.png"
    assert summarise.main(["--report", str(pair / "report.json"), "--results", str(res),
                           "--out", str(tmp_path / "o.json"), "--png", str(png),
                           "--machine", "one NVIDIA H100"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000


def _three_calls(tmp_path: Path) -> list[Path]:
    """One session, both backends over three calls: call 1 cut dflash@triton short (greedy
    rows, c = 1 only), call 2 ran it again in full, call 3 served flashinfer's speculation."""
    tri = [[5] * 256, [6] * 256]
    fi = [[5] * 256, [6] * 20 + [8] * 236]  # flashinfer's none: its own bf16 near-ties
    calls = [
        {"serve": {"none": _serve("none", tri, 256),
                   "dflash": _serve("dflash", [[5] * 256, [6] * 3 + [7] * 253], 250)},
         "served": _served("none", [600.0, 4000.0, 14000.0], None)
         + _served("dflash", [100.0], 1.2, levels=(1,))},
        {"serve": {"dflash": _serve("dflash", [[5] * 256, [6] * 10 + [7] * 246], 200,
                                    hists=[[0, 2, 5], [1, 1, 3, 4]]),
                   "none@flashinfer": _serve("none", fi, 256, "flashinfer")},
         "served": _served("dflash", [300.0, 2000.0, 6000.0], 1.3)
         + _served("none", [500.0, 3000.0, 12000.0], None, "flashinfer")},
        {"serve": {"dflash@flashinfer": _serve("dflash", fi, 180, "flashinfer",
                                               hists=[None, [2, 2]]),
                   "ddtree:16@flashinfer": _serve(
                       "ddtree-16", [[5] * 256, [6] * 20 + [8] * 20 + [9] * 216], 150,
                       "flashinfer")},
         "served": _served("dflash", [250.0, 1500.0, 6000.0], 1.4, "flashinfer")
         + _served("ddtree-16", [200.0, 1000.0, 3000.0], 1.6, "flashinfer"),
         "seeded": {"seeded:dflash@flashinfer": {"summary": {"all_identical": True},
                                                 "rows": [{"first_diff": None}]}}},
    ]
    paths = []
    for i, res in enumerate(calls):
        (tmp_path / f"s{i}").mkdir()
        paths.append(tmp_path / f"s{i}" / "results.json")
        paths[-1].write_text(json.dumps(res))
    return paths


def test_both_backends_over_three_calls_with_a_rerun(toy, tmp_path):  # noqa: F811
    pair, _ = toy
    paths = _three_calls(tmp_path)
    out = tmp_path / "real-drafter.json"
    assert summarise.main(["--report", str(pair / "report.json"),
                           *[a for p in paths for a in ("--results", str(p))],
                           "--out", str(out), "--machine", "one NVIDIA H100"]) == 0
    doc = json.loads(out.read_text())
    # each mode against its own backend's none; the rerun's outputs, not the cut-short call's
    assert doc["greedy_first_diff_vs_none"] == {"dflash@triton": [None, 10],
                                                "dflash@flashinfer": [None, None],
                                                "ddtree-16@flashinfer": [None, 40]}
    assert doc["greedy_first_diff_reference"] == {"dflash@triton": "none@triton",
                                                  "dflash@flashinfer": "none@flashinfer",
                                                  "ddtree-16@flashinfer": "none@flashinfer"}
    assert doc["greedy_identical_all_modes"] is False
    # one row per cell, the later call's where two calls served it
    cells = [(r["mode"], r["backend"], r["concurrency"]) for r in doc["served"]]
    assert len(cells) == len(set(cells)) == 15  # 5 (mode, backend) x 3 levels
    by = {(r["mode"], r["backend"], r["concurrency"]): r for r in doc["served"]}
    assert by[("dflash", "triton", 1)]["tok_s"] == 300.0
    ratio = {(r["mode"], r["backend"], r["concurrency"]): r for r in doc["ratios"]}
    assert ratio[("dflash", "triton", 1)]["over_none"] == 0.5
    assert ratio[("ddtree-16", "flashinfer", 8)]["over_none"] == round(1000 / 3000, 3)
    assert ratio[("ddtree-16", "flashinfer", 8)]["over_dflash"] == round(1000 / 1500, 3)
    assert len(doc["round_cost"]) == 15
    # served against offline, per backend, from the rerun
    svo = doc["served_vs_offline"]
    assert set(svo) == {"dflash@triton", "dflash@flashinfer", "ddtree-16@flashinfer"}
    assert svo["dflash@triton"]["served_rounds"] == [200, 200]
    assert svo["dflash@flashinfer"]["served_pooled_accept"] == round(512 / 360, 4)
    # SGLang's per-request histograms summed (padded), none and histogram-less modes left out
    assert doc["served_accept_histogram"] == {
        "dflash@triton": {"histogram": [1, 3, 8, 4], "mean_accept_length": 1.28},
        "dflash@flashinfer": {"histogram": [2, 2], "mean_accept_length": round(256 / 180, 4)}}
    assert doc["seeded"]["seeded:dflash@flashinfer"]["first_diff"] == [None]
    assert {str(p) for p in paths} < set(doc["raw_sha256"])


def test_a_backend_without_none_is_compared_with_another_and_says_so():
    tri = [[5] * 256]
    res = [{"serve": {"none": _serve("none", tri, 256),
                      "dflash@flashinfer": _serve("dflash", [[5] * 7 + [1] * 249], 200,
                                                  "flashinfer")}}]
    assert summarise.greedy_first_diffs(res) == {"dflash@flashinfer": [7]}
    assert summarise.greedy_references(res) == {"dflash@flashinfer": "none@triton"}
    # no none at all: nothing to compare with
    assert summarise.greedy_first_diffs([{"serve": {"dflash": _serve("dflash", tri, 200)}}]) \
        == {}


@pytest.fixture
def saved_figures(monkeypatch) -> list:
    """Every matplotlib Figure saved during the test: the plot's panels, titles and legend are
    read from it."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: --png needs it")
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig

    def spy(self, *a, **k):
        saved.append(self)
        return real(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    return saved


def test_png_has_one_panel_per_backend(toy, tmp_path, saved_figures):  # noqa: F811
    pair, _ = toy
    png = tmp_path / "p.png"
    assert summarise.main(["--report", str(pair / "report.json"),
                           *[a for p in _three_calls(tmp_path) for a in ("--results", str(p))],
                           "--out", str(tmp_path / "o.json"), "--png", str(png),
                           "--machine", "one NVIDIA H100"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = saved_figures
    assert "one NVIDIA H100" in fig.get_suptitle()
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert set(panels) == {"triton attention", "flashinfer attention"}
    assert all(ax.get_yscale() == "log" for ax in fig.axes)
    # triton: none and dflash at three levels; flashinfer: none, dflash, ddtree-16
    assert len(panels["triton attention"].patches) == 6
    assert len(panels["flashinfer attention"].patches) == 9
    assert [t.get_text() for t in panels["flashinfer attention"].get_legend().get_texts()] == [
        "none", "dflash", "ddtree-16"]


def test_modes_in_budget_order_and_the_caption_under_the_plot(tmp_path, saved_figures):
    """ddtree-8 comes before ddtree-16 and -64 (a string sort put it last), adaptive last;
    --caption is printed under the plot (what the figure alone must say)."""
    modes = ["ddtree-adaptive-16", "ddtree-64", "none", "ddtree-8", "dflash", "ddtree-16"]
    assert sorted(modes, key=summarise._mode_order) == [
        "none", "dflash", "ddtree-8", "ddtree-16", "ddtree-64", "ddtree-adaptive-16"]
    rows = [{"mode": m, "backend": "triton", "concurrency": 1, "tok_s": 100.0 + i}
            for i, m in enumerate(modes)]
    summarise.plot(rows, tmp_path / "p.png", "a machine", caption="rows of build X")
    (fig,) = saved_figures
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == sorted(
        modes, key=summarise._mode_order)
    assert "rows of build X" in [t.get_text() for t in fig.texts]


def test_a_seeded_mode_that_never_ran_has_no_verdict():
    """§33: the seeded server was stopped by the budget while capturing graphs (no rows), and
    the next seeded mode was not started: neither reads as "not identical"."""
    res = [{"seeded": {
        "seeded:adaptive:16@flashinfer": {
            "summary": {"all_identical": False, "prompts": 0, "sampled": True},
            "rows": [], "error": "the seeded speculative server gave no outputs"},
        "seeded:ddtree:16": {"skipped": "time budget: 10s left"},
        "seeded:dflash": {"summary": {"all_identical": True, "prompts": 2},
                          "rows": [{"first_diff": None}, {"first_diff": None}]}}}]
    got = summarise.seeded(res)
    stopped = got["seeded:adaptive:16@flashinfer"]
    assert stopped["summary"]["all_identical"] is None
    assert stopped["not_run"].startswith("the seeded speculative server gave no outputs")
    assert got["seeded:ddtree:16"] == {"summary": None, "first_diff": [],
                                       "not_run": "time budget: 10s left"}
    assert got["seeded:dflash"]["summary"]["all_identical"] is True
    assert "not_run" not in got["seeded:dflash"]
