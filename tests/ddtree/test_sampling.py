"""T>0: the DDTree sampling walk commits exact samples of the target (item d).

Statistical bound: with n i.i.d. draws over m cells, the Bretagnolle-Huber-Carol inequality
gives P(sum_i |p_hat_i - p_i| >= eps) <= (2^m - 2) * exp(-n * eps^2 / 2). We test the joint
law of the first two committed tokens (m = V^2 = 16 cells) with n = 40,000 draws and
eps = sqrt(2 * ln((2^m - 2) / delta) / n) for delta = 1e-9, i.e. eps ~= 0.040 (TV ~= 0.020):
a correct sampler fails with probability below 1e-9 for any seed (the seeds are fixed, so
the test is also deterministic). The controls show that a lossy walk fails the same bound.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")

from sglang_dflash.ddtree.tree import build_tree  # noqa: E402
from sglang_dflash.ddtree.walk import greedy_walk, sample_walk  # noqa: E402

V, DRAWS, DELTA = 4, 40_000, 1e-9
EPS = math.sqrt(2 * math.log((2 ** (V * V) - 2) / DELTA) / DRAWS)


def setup(seed: int, budget: int, temperature: float):
    g = torch.Generator().manual_seed(seed)
    depth = 2
    logp = torch.sort(torch.log_softmax(torch.randn(1, depth, V, generator=g), -1),
                      descending=True).values
    ids = torch.stack([torch.randperm(V, generator=g) for _ in range(depth)]).unsqueeze(0)
    one = build_tree(logp, ids, torch.tensor([0]), torch.tensor([3]), budget)
    tree = type(one)(**{
        f: (v.expand(DRAWS, *v.shape[1:]) if torch.is_tensor(v) and v.dim() > 1 else v)
        for f, v in one.__dict__.items()
    })
    t1 = torch.randn(V, generator=g) * 1.5  # root row logits
    t2 = torch.randn(V, V, generator=g) * 1.5  # row of depth-1 node with token y1
    t3 = torch.randn(V, V, V, generator=g)  # depth-2 rows (third token, unused below)
    rows = []
    for i in range(tree.width):
        d, tok, par = int(one.depths[0, i]), int(one.tokens[0, i]), int(one.parents[0, i])
        rows.append(t1 if d == 0 else t2[tok] if d == 1 else t3[int(one.tokens[0, par]), tok])
    logits = torch.stack(rows).expand(DRAWS, -1, -1)
    exact = torch.softmax(t1 / temperature, -1)[:, None] * torch.softmax(t2 / temperature, -1)
    return tree, logits, t2, exact, g


def joint_l1(res, t2, exact, temperature, g) -> float:
    """Empirical joint of the first two committed tokens vs the exact target joint. When a
    round commits only one token, the second comes from the next round's root row."""
    y1 = res.out_tokens[:, 0]
    fresh = torch.multinomial(torch.softmax(t2[y1] / temperature, -1), 1, generator=g)[:, 0]
    y2 = torch.where(res.commit_lens >= 2, res.out_tokens[:, 1], fresh)
    counts = torch.bincount(y1 * V + y2, minlength=V * V).double().view(V, V)
    return float((counts / DRAWS - exact).abs().sum())


@pytest.mark.parametrize(("seed", "budget", "temperature"), [(0, 5, 1.0), (1, 8, 0.7), (2, 3, 1.3)])
def test_sample_walk_matches_target_distribution(seed, budget, temperature):
    tree, logits, t2, exact, g = setup(seed, budget, temperature)
    res = sample_walk(tree, logits, temperature, g)
    assert (res.commit_lens >= 2).float().mean() > 0.2, "the tree must accept often"
    assert joint_l1(res, t2, exact, temperature, g) < EPS
    # the probability route gives the same law
    probs = torch.softmax(logits / temperature, -1)
    res_p = sample_walk(tree, probs, temperature, g, target_is_probs=True)
    assert joint_l1(res_p, t2, exact, temperature, g) < EPS


def test_lossy_walks_fail_the_bound():
    tree, logits, t2, exact, g = setup(0, 5, 1.0)
    y = torch.multinomial(torch.softmax(logits, -1).reshape(-1, V), 1, generator=g)
    y = y.view(DRAWS, tree.width)
    # bug 1: greedy at the root, sampling elsewhere
    y_bad = y.clone()
    y_bad[:, 0] = logits[:, 0].argmax(-1)
    assert joint_l1(greedy_walk(tree, y_bad), t2, exact, 1.0, g) > EPS
    # bug 2: one shared draw for all nodes of a request (correlated levels)
    shared = y[:, :1].expand(-1, tree.width)
    assert joint_l1(greedy_walk(tree, shared), t2, exact, 1.0, g) > EPS


def test_zero_temperature_rows_are_greedy():
    tree, logits, _, _, g = setup(3, 5, 1.0)
    temp = torch.zeros(DRAWS)
    temp[::2] = 1.0
    res = sample_walk(tree, logits, temp, g)
    assert torch.all(res.out_tokens[1::2, 0] == logits[0, 0].argmax())
    assert res.out_tokens[::2, 0].unique().numel() > 1
