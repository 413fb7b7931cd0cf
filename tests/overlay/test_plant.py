"""The test-only planted draft source: parsing, per-row overrides, and its effect on a tree."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="the DDTree overlay needs torch")

from sglang_dflash.ddtree.tree import build_tree  # noqa: E402
from sglang_dflash.sglang_overlay.diagnostics import plant as p  # noqa: E402
from sglang_dflash.sglang_overlay.verify import greedy_accept  # noqa: E402

GOOD = {
    "test_only": True,
    "requests": [
        {"input_ids": [1, 2, 3], "continuation": [7, 9, 4, 4, 5], "ranks": [0, 0, -1, 0, 1]}
    ],
}


def test_parse_and_find():
    spec = p.parse_plant(json.dumps(GOOD))
    assert spec.find((1, 2, 3)).continuation == (7, 9, 4, 4, 5)
    assert spec.find((1, 2)) is None


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ("{not json", "not JSON"),
        ("[]", "top level"),
        (json.dumps({**GOOD, "test_only": False}), "test_only"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "test_only"}), "test_only"),
        (json.dumps({"test_only": True, "requests": []}), "non-empty"),
        (
            json.dumps({"test_only": True, "requests": [{**GOOD["requests"][0], "ranks": [0]}]}),
            "ranks has 1",
        ),
        (
            json.dumps(
                {"test_only": True, "requests": [{**GOOD["requests"][0], "input_ids": "x"}]}
            ),
            "input_ids",
        ),
        (
            json.dumps(
                {
                    "test_only": True,
                    "requests": [{**GOOD["requests"][0], "ranks": [0, 0, -2, 0, 0]}],
                }
            ),
            ">= -1",
        ),
    ],
)
def test_bad_files_one_line(doc, needle):
    with pytest.raises(p.PlantError) as exc:
        p.parse_plant(doc)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_load_from_disk(tmp_path):
    f = tmp_path / "plant.json"
    f.write_text(json.dumps(GOOD))
    assert len(p.load_plant(str(f)).requests) == 1
    with pytest.raises(p.PlantError, match="cannot read"):
        p.load_plant(str(tmp_path / "missing.json"))


def test_row_overrides_follow_the_committed_prefix():
    req = p.parse_plant(json.dumps(GOOD)).requests[0]
    # prompt of 3, committed prefix 4 -> root is continuation[1] == 9
    ovs = p.row_overrides(req, prompt_len=3, prefix_len=4, root_token=9, max_depth=3)
    assert [(o.depth, o.token, o.rank) for o in ovs] == [(1, 4, -1), (2, 4, 0), (3, 5, 1)]
    assert p.row_overrides(req, 3, 4, root_token=8, max_depth=3) == []  # diverged
    assert p.row_overrides(req, 3, 2, root_token=9, max_depth=3) == []  # before the output
    tail = p.row_overrides(req, 3, 6, root_token=4, max_depth=5)  # past the end: truncated
    assert [(o.depth, o.token) for o in tail] == [(1, 5)]


def test_apply_overrides_swap_insert_remove():
    rows = [[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    out = p.apply_overrides(
        rows,
        [p.Override(1, 12, 0), p.Override(2, 99, 1), p.Override(3, 31, -1)],
    )
    assert out[0] == [12, 11, 10, 13]  # swapped into rank 0
    assert out[1] == [20, 99, 22, 23]  # written at rank 1
    assert 31 not in out[2] and len(set(out[2])) == 4  # removed, row still distinct
    assert rows[0] == [10, 11, 12, 13]  # input untouched
    assert p.apply_overrides([[1, 2]], [p.Override(1, 5, 7)]) == [[1, 2]]  # rank >= K: absent


def _target_choice(tree, cont, base):
    """The target's greedy choice at every node: the continuation on the true path, else 0."""
    tokens, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
    choice = []
    for i in range(len(tokens)):
        path, n = [], i
        while n > 0:
            path.append(tokens[n])
            n = parents[n]
        path.reverse()
        on_path = path == list(cont[base + 1 : base + 1 + len(path)])
        nxt = base + 1 + len(path)
        choice.append(cont[nxt] if on_path and nxt < len(cont) else 0)
    return torch.tensor([choice])


@pytest.mark.parametrize(
    ("ranks", "expected_accept"),
    [
        ([0, 0, 0, 0, 0, 0, 0], 4),  # true tokens on the rank-0 spine: everything accepted
        ([0, 0, 1, 0, 0, 0, 0], 4),  # rank 1 at depth 1 is still in the tree (budget 12)
        ([0, 0, -1, 0, 0, 0, 0], 0),  # absent at depth 1: nothing accepted
        ([0, 0, 0, 0, -1, 0, 0], 2),  # absent at depth 3: two accepted
    ],
)
def test_planted_ranks_drive_acceptance(ranks, expected_accept):
    cont = [7, 9, 4, 6, 5, 8, 3]
    req = p.PlantedRequest((1, 2, 3), tuple(cont), tuple(ranks))
    depth, k = 4, 4
    gen = torch.Generator().manual_seed(0)
    # a confident drafter: rank 0 at -0.1, the rest far behind (the tree follows the spine)
    logp = torch.tensor([-0.1, -3.0, -4.0, -5.0]).expand(1, depth, k).contiguous()
    ids = torch.randperm(50, generator=gen)[: depth * k].view(1, depth, k)
    base = 1  # prefix 4 with a 3-token prompt: the root is continuation[1]
    ovs = p.row_overrides(req, prompt_len=3, prefix_len=4, root_token=cont[base], max_depth=depth)
    ids = torch.tensor([p.apply_overrides(ids[0].tolist(), ovs)])
    tree = build_tree(logp, ids, torch.tensor([cont[base]]), torch.tensor([4]), 12)
    acc = greedy_accept(tree, _target_choice(tree, cont, base))
    assert int(acc.accept_len[0]) == expected_accept
    n = expected_accept + 1
    assert acc.out_tokens[0, :n].tolist() == cont[base + 1 : base + 1 + n]


def test_logp_profile_parsing_and_rows():
    spec = p.parse_plant(json.dumps({**GOOD, "logp_profile": [-0.01, -4, -5]}))
    assert spec.logp_profile == (-0.01, -4.0, -5.0)
    assert p.profile_row(spec.logp_profile, 5) == [-0.01, -4.0, -5.0, -6.0, -7.0]
    assert p.profile_row(spec.logp_profile, 2) == [-0.01, -4.0]
    assert p.parse_plant(json.dumps(GOOD)).logp_profile is None
    for bad in ([], [-1, -0.5], [0.5], ["x"], [True]):
        with pytest.raises(p.PlantError, match="logp_profile"):
            p.parse_plant(json.dumps({**GOOD, "logp_profile": bad}))


def _random_case(seed: int, profile: bool):
    import random

    import torch

    rng = random.Random(seed)
    vocab, depth, k = 40, rng.randint(1, 5), rng.randint(1, 8)
    reqs, prompts = [], []
    for i in range(rng.randint(1, 4)):
        prompt = (*[rng.randrange(vocab) for _ in range(rng.randint(1, 4))], 1000 + i)
        cont = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        ranks = [rng.choice([-1, 0, 0, 1, 2, k - 1, k, k + 3]) for _ in cont]
        reqs.append({"input_ids": list(prompt), "continuation": cont, "ranks": ranks})
        prompts.append((prompt, cont))
    doc = {"test_only": True, "requests": reqs}
    if profile:
        doc["logp_profile"] = [-0.01, -3.0]
    spec = p.parse_plant(json.dumps(doc))
    bs = rng.randint(1, 6)
    batch, prefix, roots = [], [], []
    for _ in range(bs):
        if rng.random() < 0.2:  # a request the plant does not know
            prompt, cont = (7, 7, 7), [3]
        else:
            prompt, cont = rng.choice(prompts)
        base = rng.randint(-1, len(cont))  # before, inside and past the continuation
        prefix.append(len(prompt) + base)
        on_track = 0 <= base < len(cont) and rng.random() < 0.8
        roots.append(cont[base] if on_track else rng.randrange(vocab))
        batch.append((prompt, len(prompt)))
    ids = torch.stack([torch.stack([torch.randperm(vocab)[:k] for _ in range(depth)])
                       for _ in range(bs)])  # fmt: skip
    logp = torch.randn(bs, depth, k).sort(-1, descending=True).values
    return spec, batch, prefix, roots, logp, ids


@pytest.mark.parametrize("seed", range(60))
def test_device_plant_equals_the_host_plant(seed):
    """The batched, sync-free plant rewrites exactly what the host version (and so the CPU
    oracle's model of it) rewrites: swaps, inserts, removals with the smallest free id, rows
    off the continuation, unknown requests, the log-prob profile."""
    import torch

    spec, batch, prefix, roots, logp, ids = _random_case(seed, profile=seed % 2 == 0)
    want_lp, want_ids = p.apply_plant_host(spec, batch, prefix, roots, logp.tolist(), ids.tolist())
    dev = p.DevicePlant(spec, "cpu")
    got_lp, got_ids = dev.apply(dev.row_index(batch), torch.tensor(prefix), torch.tensor(roots),
                                logp, ids)  # fmt: skip
    assert got_ids.tolist() == want_ids
    assert torch.allclose(got_lp, torch.tensor(want_lp, dtype=logp.dtype))
    assert got_ids.dtype == ids.dtype and got_ids.shape == ids.shape
