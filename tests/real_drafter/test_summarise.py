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


def _serve(label: str, outputs: list[list[int]], rounds: int) -> dict:
    return {"label": label, "backend": "triton",
            "greedy": [{"output": o, "spec_verify_ct": rounds, "completion_tokens": len(o)}
                       for o in outputs]}


def _served(mode: str, tok_s: list[float], accept: float | None) -> list[dict]:
    return [{"mode": mode, "backend": "triton", "concurrency": c, "tok_s": t,
             "accept_length": accept} for c, t in zip((1, 8, 32), tok_s, strict=True)]


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
    assert doc["greedy_first_diff_vs_none"] == {"dflash": [None, 10]}
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
