"""``real_drafter.tie_margin`` on the CPU: the pure decisions on synthetic numbers, then the CLI
on the toy pair (test_real_drafter's fixture) with a fabricated serve_pair results.json whose
reference is the target's own greedy continuation and one mode swaps a token to the target's
lowest-logit one (a real bug, not a tie) while the others are identical."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py

from real_drafter import tie_margin as tm  # noqa: E402

from .test_real_drafter import toy  # noqa: E402, F401  (the module-scoped toy pair fixture)

NEW = 12  # output tokens per fabricated request
SWAP_AT = 5  # where the buggy mode's output leaves the greedy continuation


# ---- pure decisions --------------------------------------------------------------------------


def test_first_divergence():
    assert tm.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert tm.first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert tm.first_divergence([4, 2, 3], [1, 2, 3]) == 0
    assert tm.first_divergence([1, 2], [1, 2, 3]) == 2  # a proper prefix: the shorter length
    assert tm.first_divergence([1, 2, 3], [1, 2]) == 2
    assert tm.first_divergence([], []) is None


def test_verdict_boundary():
    assert tm.verdict(5.0, 4.99, eps=0.01) == "numerics"
    assert tm.verdict(5.0, 4.98, eps=0.01) == "numerics"  # gap == 2 eps: both may be off by eps
    assert tm.verdict(5.0, 4.97, eps=0.01) == "mismatch"
    assert tm.verdict(4.97, 5.0, eps=0.01) == "mismatch"  # symmetric
    assert tm.verdict(1.0, 1.0, eps=0.0) == "numerics"  # an exact tie
    assert tm.verdict(1.0, 1.5, eps=0.0) == "mismatch"


def _div(a, b, prefix=(3, 4)):
    return tm.Divergence(
        mode="dflash",
        backend="triton",
        kind="greedy",
        prompt=0,
        position=0,
        prefix=prefix,
        a=a,
        b=b,
    )


def test_judge_near_tie_is_numerics():
    # fp32: token 2 leads token 5 by 0.004; bf16 moved the top-8 logits by up to 0.003
    l32 = [0.0, 1.0, 3.004, -2.0, 0.5, 3.0, -1.0, 0.2, 0.1, -5.0]
    l16 = list(l32)
    l16[2] -= 0.003
    l16[5] += 0.002
    l16[9] += 1.0  # outside the fp32 top-8: does not count towards eps
    j = tm.judge(_div(a=2, b=5), tm.Logits(l32, l16))
    assert j.verdict == "numerics"
    assert j.eps == pytest.approx(0.003)
    assert j.gap == pytest.approx(0.004)
    assert j.argmax32 == 2 and j.a_is_argmax32 and not j.b_is_argmax32
    assert j.argmax16 == 5  # bf16 flipped the argmax: the tie the verdict explains
    assert j.top2_margin32 == pytest.approx(0.004)
    assert (j.rank32_a, j.rank32_b) == (0, 1)
    assert j.prefix_len == 2


def test_judge_clear_gap_is_mismatch():
    l32 = [0.0, 1.0, 3.0, -2.0, 0.5, 2.5, -1.0, 0.2, 0.1, -5.0]
    l16 = [v + 0.01 for v in l32]
    j = tm.judge(_div(a=2, b=9), tm.Logits(l32, l16))
    assert j.verdict == "mismatch" and j.gap == pytest.approx(8.0)
    assert j.eps == pytest.approx(0.01) and j.rank32_b == 9 and not j.b_is_argmax32


def test_judge_length_difference_is_mismatch():
    l32 = [0.0, 1.0, 0.5]
    j = tm.judge(_div(a=None, b=1), tm.Logits(l32, l32))
    assert j.verdict == "mismatch" and j.gap is None and j.l32_a is None and j.b_is_argmax32


def _rec(mode, backend, greedy, parallel):
    return {
        "mode": mode,
        "label": mode.replace(":", "-"),
        "backend": backend,
        "greedy": [{"output": o} for o in greedy],
        "greedy_parallel": [{"output": o} for o in parallel],
    }


def test_find_divergences_and_summary():
    prompts = [[7, 8], [9]]
    ref = [[1, 2, 3], [4, 5, 6]]
    results = {
        "serve": {
            "none": _rec("none", "triton", ref, [[1, 2, 3], [4, 0, 6]]),
            "dflash": _rec("dflash", "triton", [[1, 2, 9], [4, 5, 6]], ref),
            "ddtree:16": {"skipped": "time budget: 3s left"},
        }
    }
    divs, ident = tm.find_divergences(results, prompts, "none")
    got = {(d.mode, d.kind, d.prompt, d.position, d.prefix, d.a, d.b) for d in divs}
    assert got == {
        ("none", "greedy_parallel", 1, 1, (9, 4), 5, 0),
        ("dflash", "greedy", 0, 2, (7, 8, 1, 2), 3, 9),
    }
    assert ident == {"none": {"greedy_parallel": 1}, "dflash": {"greedy": 1, "greedy_parallel": 2}}
    judged = [
        tm.judge(d, tm.Logits([0.0] * 10, [0.0] * 10))  # all tied: numerics
        for d in divs
    ]
    s = tm.summarise(judged, ident)
    assert s["lossless_explained"] and s["divergences"] == 2
    assert s["per_mode"]["dflash"]["greedy"] == {"identical": 1, "numerics": 1, "mismatch": 0}
    with pytest.raises(ValueError, match="unknown reference mode 'eagle'"):
        tm.find_divergences(results, prompts, "eagle")
    # the label works as the reference too
    assert len(tm.find_divergences(results, prompts, "dflash")[0]) == 4


def test_merge_serves_keeps_every_mode():
    a = {"serve": {"none": {"mode": "none"}, "dflash": {"mode": "dflash"}}}
    b = {"serve": {"dflash": {"mode": "dflash", "n": 2}, "ddtree:8": {"mode": "ddtree:8"}}}
    merged = tm.merge_serves([a, b])["serve"]
    assert list(merged) == ["none", "dflash", "dflash#2", "ddtree:8"]
    assert merged["dflash#2"] == {"mode": "dflash", "n": 2}
    assert merged["dflash"] == {"mode": "dflash"}


# ---- the CLI on the toy pair -----------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO / "benchmarks")])
    )
    return subprocess.run(
        [sys.executable, "-m", "real_drafter.tie_margin", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        row = tm.next_logits(model, [tuple(prompt + out)], "cpu", batch=1)[0]
        out.append(max(range(len(row)), key=lambda i: row[i]))
    return out


def test_cli_mismatch_and_identical(toy, tmp_path):  # noqa: F811
    pair, _ = toy
    prompts = [
        json.loads(x)["input_ids"] for x in (pair / "prompts.jsonl").read_text().splitlines()
    ]
    m32, _ = tm.load_targets(pair / "target", "cpu")
    ref = [_greedy(m32, p, NEW) for p in prompts[:3]]
    # the buggy mode: prompt 1's output leaves the greedy continuation for the target's
    # lowest-logit token at SWAP_AT (what follows is arbitrary: only the first difference counts)
    row = tm.next_logits(m32, [tuple(prompts[1] + ref[1][:SWAP_AT])], "cpu", batch=1)[0]
    worst = min(range(len(row)), key=lambda i: row[i])
    bad = [list(o) for o in ref]
    bad[1] = ref[1][:SWAP_AT] + [worst] + [3] * (NEW - SWAP_AT - 1)
    results = {
        "serve": {
            "none": _rec("none", "triton", ref, ref),
            "dflash": _rec("dflash", "triton", bad, ref),
            "ddtree:16": _rec("ddtree:16", "triton", ref, ref),
        }
    }
    rpath = tmp_path / "results.json"
    rpath.write_text(json.dumps(results))
    out = tmp_path / "tie.json"
    r = _cli("--pair", str(pair), "--results", str(rpath), "--out", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(out.read_text())
    s = rep["summary"]
    assert s["lossless_explained"] is False and s["mismatches"] == 1 and s["forwards"] == 1
    assert json.loads(r.stdout.strip().splitlines()[-1])["lossless_explained"] is False
    per = s["per_mode"]
    assert per["dflash"]["greedy"] == {"identical": 2, "numerics": 0, "mismatch": 1}
    assert per["dflash"]["greedy_parallel"] == {"identical": 3, "numerics": 0, "mismatch": 0}
    assert per["ddtree:16"]["greedy"] == {"identical": 3, "numerics": 0, "mismatch": 0}
    assert per["none"] == {"greedy_parallel": {"identical": 3, "numerics": 0, "mismatch": 0}}
    (d,) = rep["divergences"]
    assert (d["mode"], d["kind"], d["prompt"], d["position"]) == ("dflash", "greedy", 1, SWAP_AT)
    assert d["prefix_len"] == len(prompts[1]) + SWAP_AT
    assert (d["a"], d["b"]) == (ref[1][SWAP_AT], worst)
    assert d["a_is_argmax32"] and not d["b_is_argmax32"] and d["argmax32"] == d["a"]
    assert d["rank32_b"] == len(row) - 1
    assert d["gap"] > 2 * d["eps"] > 0 and d["verdict"] == "mismatch"
    assert d["l32_a"] == pytest.approx(max(row), abs=1e-3)
    assert d["l32_b"] == pytest.approx(min(row), abs=1e-3)

    # the same serve split over two calls' files (the reference in the first): the same verdict
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"serve": {"none": results["serve"]["none"]}}))
    second.write_text(json.dumps({"serve": {k: v for k, v in results["serve"].items()
                                            if k != "none"}}))
    r = _cli("--pair", str(pair), "--results", str(first), "--results", str(second), "--out",
             str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    split = json.loads(out.read_text())
    assert split["summary"]["per_mode"] == per and split["results"] == [str(first), str(second)]

    # every output identical: nothing to forward, explained
    results["serve"]["dflash"] = _rec("dflash", "triton", ref, ref)
    rpath.write_text(json.dumps(results))
    r = _cli("--pair", str(pair), "--results", str(rpath), "--out", str(out), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())["summary"]
    assert s["lossless_explained"] is True and s["divergences"] == 0 and s["forwards"] == 0
    assert s["per_mode"]["dflash"]["greedy"] == {"identical": 3, "numerics": 0, "mismatch": 0}


def test_cli_bad_input_one_line(toy, tmp_path):  # noqa: F811
    pair, _ = toy
    rpath = tmp_path / "results.json"
    rpath.write_text(json.dumps({"serve": {"none": _rec("none", "triton", [[1]], [[1]])}}))
    out = str(tmp_path / "tie.json")
    cases = [
        (("--pair", str(tmp_path / "nopair"), "--results", str(rpath)), "nopair"),
        (("--pair", str(pair), "--results", str(tmp_path / "missing.json")), "missing.json"),
        (("--pair", str(pair), "--results", str(rpath), "--reference", "eagle"), "'eagle'"),
    ]
    for args, needle in cases:
        r = _cli(*args, "--out", out, "--device", "cpu")
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and needle in r.stderr, r.stderr
        assert r.stderr.startswith("tie_margin: ")
    assert not Path(out).exists()
