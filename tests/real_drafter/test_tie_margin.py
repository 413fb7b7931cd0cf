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

from ..ddtree.toy_models import toy_gumbel  # noqa: E402
from ..ddtree.toy_models import toy_multinomial_with_seed as toy_seeded  # noqa: E402
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


# ---- seeded T > 0 --------------------------------------------------------------------------


def _sdiv(a, b, prefix=(3, 4), seed=1000, top_p=0.95):
    return tm.SeededDivergence(mode="seeded:dflash", backend="triton", prompt=0, position=0,
                               prefix=prefix, a=a, b=b, temperature=0.8, top_p=top_p, seed=seed)


def test_find_seeded_divergences_keeps_params_and_counts_old_rows():
    prompts = [[7, 8], [9], [10]]
    row = {"params": {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1001}}
    results = {"seeded": {
        "seeded:dflash": {"backend": "triton", "rows": [
            {**row, "output": [1, 2], "reference": [1, 2]},
            {**row, "output": [4, 5, 0], "reference": [4, 5, 6]},
            {"identical": False, "first_diff": 0},  # a results.json from before outputs were kept
        ]},
        "seeded:ddtree:16": {"skipped": "time budget: 21s left"},
    }}
    divs, ident, unjudged = tm.find_seeded_divergences(results, prompts)
    (d,) = divs
    assert (d.mode, d.prompt, d.position, d.prefix, d.a, d.b) == (
        "seeded:dflash", 1, 2, (9, 4, 5), 6, 0)
    assert (d.temperature, d.top_p, d.seed) == (0.8, 0.95, 1001)
    assert ident == {"seeded:dflash": {"seeded": 1}} and unjudged == 1
    with pytest.raises(ValueError, match="only 1 prompts"):
        tm.find_seeded_divergences(results, prompts[:1])


def test_model_sampling_defaults_go_under_the_request_and_unmodelled_ones_are_refused():
    # what transformers 5 writes for the trained pair: no sampling field set
    assert tm.sampling_defaults({"do_sample": False, "top_k": None}) == {}
    assert tm.sampling_defaults({"top_k": 20, "top_p": 0.8, "eos_token_id": 0}) == {
        "top_k": 20, "top_p": 0.8}
    row = {"params": {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1000},
           "output": [1, 3], "reference": [1, 2]}
    results = {"seeded": {"seeded:dflash": {"backend": "triton", "rows": [row]}}}
    (d,), _, _ = tm.find_seeded_divergences(results, [[7]], {"top_k": 20, "top_p": 0.5})
    assert (d.top_k, d.top_p) == (20, 0.95)  # the request's top-p wins, the model's top-k adds
    with pytest.raises(ValueError, match="samples with min_p"):
        tm.find_seeded_divergences(results, [[7]], {"min_p": 0.1, "repetition_penalty": 1.0})


def test_judge_seeded_top_k_cuts_what_the_sampler_may_draw():
    # 2 and 5 near-tied, 2 ranked second: top-k 1 leaves only the leader, whatever the noise
    l32 = [-9.0] * 10
    l32[2], l32[5] = 3.0, 3.0 + 1e-4
    d = tm.SeededDivergence(mode="seeded:dflash", backend="triton", prompt=0, position=0,
                            prefix=(3, 4), a=5, b=2, temperature=0.8, top_p=1.0, seed=1000,
                            top_k=1)
    j = tm.judge_seeded(d, tm.Logits(l32, l32), toy_seeded)
    assert j.draw32 == 5 and j.hits_b == 0 and j.verdict == "mismatch"


def test_judge_seeded_rank_swap_within_eps_is_numerics_and_a_far_token_is_not():
    # tokens 2 and 5 nearly tied in fp32; bf16 moved them by 1e-3, more than their gap: the
    # sorted order (which the sampler's hash keys on) can go either way, so either may be drawn
    l32 = [-9.0] * 10
    l32[2], l32[5] = 3.0, 3.0 + 1e-4
    l16 = list(l32)
    l16[2] += 1e-3
    # which of the two the sampler draws depends on their order, so find a seed where the
    # two orders give the two tokens (most seeds do: each order picks the same rank)
    seed = next(s for s in range(1000, 1100)
                if len({tm.judge_seeded(_sdiv(2, 5, seed=s), tm.Logits(l32, l16), toy_seeded)
                        .draw32, tm.judge_seeded(_sdiv(2, 5, seed=s), tm.Logits(l16, l16),
                                                 toy_seeded).draw32}) == 2)
    j = tm.judge_seeded(_sdiv(2, 5, seed=seed), tm.Logits(l32, l16), toy_seeded)
    assert j.verdict == "numerics" and j.hits_a > 0 and j.hits_b > 0
    assert j.eps == pytest.approx(1e-3, rel=1e-3) and j.draws == 4 + tm.SEEDED_DRAWS
    assert j.kind == "seeded" and j.prefix_len == 2
    # token 9 is far below the top-p set whatever bf16 does: never drawn, a real bug
    bad = tm.judge_seeded(_sdiv(2, 9, seed=seed), tm.Logits(l32, l16), toy_seeded)
    assert bad.verdict == "mismatch" and bad.hits_b == 0
    # one output shorter: no draw explains it
    short = tm.judge_seeded(_sdiv(None, 5, seed=seed), tm.Logits(l32, l16), toy_seeded)
    assert short.verdict == "mismatch" and short.draws == 2 + tm.SEEDED_DRAWS


def test_judge_seeded_clear_order_is_a_mismatch():
    # 2 and 5 far apart and bf16 exact: the order never changes, only one token is drawn
    l32 = [-9.0] * 10
    l32[2], l32[5] = 3.0, 2.0
    j = tm.judge_seeded(_sdiv(2, 5), tm.Logits(l32, l32), toy_seeded)
    assert j.eps == 0.0 and j.verdict == "mismatch"
    assert (j.hits_a == 0) != (j.hits_b == 0)  # exactly one of them is what the sampler draws
    assert j.draws == 4 + tm.SEEDED_DRAWS and j.other == 0  # not scattered: no more draws


def test_judge_seeded_draws_more_where_the_draw_scatters():
    # 300 tokens within 1e-4 of each other, bf16 off by 1e-3: the draw moves among them under
    # the smallest noise, so 68 draws miss most of them (H200 §37: 6 a, 0 b, 62 other)
    l32 = [-9.0] * 400
    for t in range(300):
        l32[t] = 3.0 + 1e-7 * t
    l16 = list(l32)
    l16[299] += 1e-3  # eps is measured over the fp32 top 8
    lg = tm.Logits(l32, l16)
    first = {"spread_draws": 0, "witness_limit": 0}  # the first draws only
    base = tm.judge_seeded(_sdiv(7, 250), lg, toy_seeded, **first)
    assert base.draws == 4 + tm.SEEDED_DRAWS and base.other > base.draws // 2
    missed = [b for b in range(1, 300) if b != 7 and tm.judge_seeded(
        _sdiv(7, b), lg, toy_seeded, **first).hits_b == 0][:3]
    assert missed  # most near-tied tokens are not among the first draws
    for b in missed:
        j = tm.judge_seeded(_sdiv(7, b), lg, toy_seeded)
        assert j.verdict == "numerics" and j.hits_a > 0 and j.hits_b > 0
        assert 4 + tm.SEEDED_DRAWS < j.draws <= (4 + tm.SEEDED_DRAWS + j.witnesses
                                                 + tm.SEEDED_SPREAD_DRAWS)
    # a token outside the near-tied set is never drawn, however many draws: a real bug
    far = tm.judge_seeded(_sdiv(7, 350), lg, toy_seeded)
    assert far.verdict == "mismatch" and far.hits_b == 0
    # its witnesses move it only among the 99 other tokens at -9.0 (2 ends + 2 x 99 rows),
    # nowhere near the top: none draws it
    assert tm.witness_rows(torch.tensor(l32), 350, far.eps).shape[0] == 200 <= far.witnesses
    assert far.draws == 4 + tm.SEEDED_DRAWS + far.witnesses + tm.SEEDED_SPREAD_DRAWS


def test_witness_rows_find_what_no_noisy_draw_does_and_prove_absence_without_truncation():
    # Without top-p the draw is argmax(l / T + g) over token ids. 40 tokens tie a at the top of
    # that score and b sits 1.9 eps / T below it: b wins only if it rises ~eps while all 40
    # fall ~eps at once, which no uniform noise does, but b's logit alone up by 2 eps (the
    # same softmax as b up eps and the rest down eps) draws b: numerics, found by a witness.
    vocab, temp, eps = 400, 0.8, 1e-2
    d = tm.SeededDivergence(mode="seeded:dflash", backend="triton", prompt=0, position=0,
                            prefix=(3, 4), a=5, b=9, temperature=temp, top_p=1.0, seed=1000)
    g = toy_gumbel(torch.tensor([1000]), torch.tensor([len(d.prefix) - 1]), vocab)[0]
    top = 4.0
    l32 = torch.full((vocab,), -30.0, dtype=torch.float64)
    for t in range(10, 50):  # 40 tokens whose score ties a's (each a hair below it)
        l32[t] = temp * (top - 1e-6 - g[t])
    l32[5] = temp * (top - g[5])
    l32[9] = temp * (top - g[9]) - 1.9 * eps
    l32 = l32.float().tolist()
    lg = tm.Logits(l32, [x + eps for x in l32])  # bf16 off by eps on every logit
    j = tm.judge_seeded(d, lg, toy_seeded)
    assert j.draw32 == 5 and j.verdict == "numerics" and j.hits_b >= 1
    assert j.witnesses >= 2 and j.draws == 4 + tm.SEEDED_DRAWS + j.witnesses  # no spread draws
    # without the witnesses (the judge before them) 3,136 noisy draws never give b
    blind = tm.judge_seeded(d, lg, toy_seeded, witness_limit=0)
    assert blind.verdict == "mismatch" and blind.hits_b == 0
    assert blind.draws == 4 + tm.SEEDED_DRAWS + tm.SEEDED_SPREAD_DRAWS
    # 2.1 eps below: out of reach of any perturbation within eps; without truncation the
    # witness rows prove it, and the spread draws cannot find it either
    l32_far = list(l32)
    l32_far[9] = float(temp * (top - g[9]) - 2.1 * eps)
    far = tm.judge_seeded(d, tm.Logits(l32_far, [x + eps for x in l32_far]), toy_seeded)
    assert far.verdict == "mismatch" and far.hits_b == 0 and far.witnesses >= 2


def test_witness_rows_move_one_token_to_every_rank_within_two_eps():
    l32 = torch.tensor([0.0, 1.0, 1.015, 0.99, 0.5, 1.03])
    rows = tm.witness_rows(l32, 1, 0.01)
    others = torch.cat([rows[:, :1], rows[:, 2:]], dim=1)
    assert torch.equal(others, torch.cat([l32[:1], l32[2:]]).repeat(rows.shape[0], 1))
    moved = sorted(rows[:, 1].tolist())
    assert moved[0] == pytest.approx(0.98) and moved[-1] == pytest.approx(1.02)
    # just above and below 1.015 and 0.99 (within 2 eps); 1.03 and 0.5 are out of reach
    assert rows.shape[0] == 2 + 2 * 2
    assert any(0.99 < v < 0.9901 for v in moved) and any(0.9899 < v < 0.99 for v in moved)
    assert any(1.015 < v < 1.0151 for v in moved) and any(1.0149 < v < 1.015 for v in moved)
    assert tm.witness_rows(l32, 1, 0.01, limit=2).shape[0] == 2 + 2  # the nearest one only


def test_summary_counts_seeded_rows_beside_greedy():
    ident = {"seeded:dflash": {"seeded": 2}, "dflash": {"greedy": 3}}
    l32 = [-9.0] * 10
    l32[2] = 3.0
    j = tm.judge_seeded(_sdiv(2, 9), tm.Logits(l32, l32), toy_seeded)
    s = tm.summarise([j], ident)
    assert s["per_mode"]["seeded:dflash"]["seeded"] == {"identical": 2, "numerics": 0,
                                                        "mismatch": 1}
    assert s["mismatches"] == 1 and s["lossless_explained"] is False


def _seeded_reference(m32, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Seeded T > 0 continuations of the toy target, each token drawn by ``seeded_node_targets``
    with the stand-in sampler from the fp32 logits (position = prefix length - 1, seed 1000 + i,
    T 0.8, top-p 0.95): what a seeded no-speculation server would emit."""
    from sglang_dflash.sglang_overlay.verify import seeded_node_targets

    outs = []
    for i, p in enumerate(prompts):
        out: list[int] = []
        for _ in range(n):
            prefix = p + out
            row = torch.tensor(tm.next_logits(m32, [tuple(prefix)], "cpu", batch=1)[0])
            tok = seeded_node_targets(row.view(1, -1), 1, torch.tensor([0.8]),
                                      torch.tensor([1000 + i]), torch.tensor([len(prefix) - 1]),
                                      toy_seeded, top_ps=torch.tensor([0.95]))
            out.append(int(tok.view(-1)[0]))
        outs.append(out)
    return outs


def test_cli_seeded(toy, tmp_path, monkeypatch, capsys):  # noqa: F811
    """``main`` on the toy pair with the stand-in in place of SGLang's sampler (whose murmur
    hash is a CUDA-only Triton kernel; the GPU host runs the real one): a seeded reference; one
    seeded mode identical, one leaving it for the lowest-logit token at SWAP_AT."""
    pair, _ = toy
    prompts = [json.loads(x)["input_ids"]
               for x in (pair / "prompts.jsonl").read_text().splitlines()][:2]
    m32, _ = tm.load_targets(pair / "target", "cpu")
    ref = _seeded_reference(m32, prompts, NEW)
    row = tm.next_logits(m32, [tuple(prompts[1] + ref[1][:SWAP_AT])], "cpu", batch=1)[0]
    worst = min(range(len(row)), key=lambda i: row[i])
    bad = ref[1][:SWAP_AT] + [worst] + [3] * (NEW - SWAP_AT - 1)

    def rows(outs):
        pairs = enumerate(zip(outs, ref, strict=True))
        return [{"params": {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1000 + i},
                 "output": o, "reference": r} for i, (o, r) in pairs]

    results = {"serve": {"none": _rec("none", "triton", ref, ref)},
               "seeded": {"seeded:dflash": {"backend": "triton", "rows": rows([ref[0], bad])},
                          "seeded:ddtree:16": {"backend": "triton", "rows": rows(ref)}}}
    rpath, out = tmp_path / "results.json", tmp_path / "tie.json"
    rpath.write_text(json.dumps(results))
    seen = set()

    def sampler(logprobs, seeds, positions):  # the draws run where the forwards ran
        seen.add((logprobs.device.type, seeds.device.type, positions.device.type))
        return toy_seeded(logprobs, seeds, positions)

    monkeypatch.setattr(tm, "sglang_seeded_sampler", lambda: sampler)
    assert tm.main(["--pair", str(pair), "--results", str(rpath), "--out", str(out),
                    "--device", "cpu"]) == 0
    rep = json.loads(out.read_text())
    per = rep["summary"]["per_mode"]
    assert per["seeded:dflash"]["seeded"] == {"identical": 1, "numerics": 0, "mismatch": 1}
    assert per["seeded:ddtree:16"]["seeded"] == {"identical": 2, "numerics": 0, "mismatch": 0}
    assert rep["summary"]["lossless_explained"] is False and rep["summary"]["seeded_unjudged"] == 0
    (d,) = rep["divergences"]
    assert (d["kind"], d["prompt"], d["position"], d["b"]) == ("seeded", 1, SWAP_AT, worst)
    # the reference's own token is what the sampler draws from the fp32 logits; the bug's never
    assert d["draw32"] == ref[1][SWAP_AT] == d["a"] and d["hits_b"] == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mismatches"] == 1
    assert seen == {("cpu", "cpu", "cpu")}


def test_seeded_without_sglang_is_one_line(toy, tmp_path, monkeypatch, capsys):  # noqa: F811
    pair, _ = toy
    results = {"serve": {"none": _rec("none", "triton", [[1, 2]], [[1, 2]])},
               "seeded": {"seeded:dflash": {"backend": "triton", "rows": [
                   {"params": {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1000},
                    "output": [1, 3], "reference": [1, 2]}]}}}
    rpath, out = tmp_path / "results.json", tmp_path / "tie.json"
    rpath.write_text(json.dumps(results))
    monkeypatch.setitem(sys.modules, "sglang", None)  # `import sglang` fails, as on a bare host
    assert tm.main(["--pair", str(pair), "--results", str(rpath), "--out", str(out),
                    "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs SGLang's sampler" in err and not out.exists()
