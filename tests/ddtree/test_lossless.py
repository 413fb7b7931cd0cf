"""End-to-end greedy DDTree decoding on a tiny CPU target is lossless (item c)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")

from sglang_dflash.ddtree.mask import full_mask, full_mask_offsets  # noqa: E402
from sglang_dflash.ddtree.topk import topk_logprobs  # noqa: E402
from sglang_dflash.ddtree.tree import build_tree  # noqa: E402
from sglang_dflash.ddtree.walk import greedy_walk  # noqa: E402
from sglang_dflash.sglang_overlay.verify import seeded_node_targets  # noqa: E402

from .toy_models import OracleDrafter, TinyLM, toy_multinomial_with_seed  # noqa: E402

BLOCK = 8  # B; L = B-1 drafted positions
NEW_TOKENS = 40


def verify_forward(target: TinyLM, seqs, tree, seq_lens, mask_fn=full_mask, choose=None):
    """The target's choice for every tree row (argmax, or ``choose(logits [W, V], positions)``),
    reading each request's FULL_MASK block."""
    flat = mask_fn(tree, seq_lens)
    offs = full_mask_offsets(seq_lens, tree.width).tolist()
    width = tree.width
    preds = []
    for b, seq in enumerate(seqs):
        s = int(seq_lens[b])
        block = flat[offs[b] : offs[b] + width * (s + width)].view(width, s + width)
        prefix_rows = torch.cat(
            [torch.ones(s, s, dtype=torch.bool).tril(), torch.zeros(s, width, dtype=torch.bool)], 1
        )
        allowed = torch.cat([prefix_rows, block], 0)
        tokens = torch.cat([torch.tensor(seq[:s], dtype=torch.long), tree.tokens[b]])
        positions = torch.cat([torch.arange(s), tree.positions[b]])
        logits = target.forward(tokens, positions, allowed)[s:]
        preds.append(logits.argmax(-1) if choose is None else choose(b, logits, tree.positions[b]))
    return torch.stack(preds)


def ddtree_decode(target, drafter, prompts, budget, mask_fn=full_mask, choose=None):
    """Batched DDTree decoding (greedy, or the node choice ``choose``); returns the sequences
    and per-round commit lengths."""
    seqs = [list(p) for p in prompts]
    goal = [len(p) + NEW_TOKENS for p in prompts]
    commits: list[int] = []
    k = min(budget, target.vocab)
    while any(len(s) < g for s, g in zip(seqs, goal, strict=True)):
        seq_lens = torch.tensor([len(s) - 1 for s in seqs])  # the root's KV is not cached yet
        roots = torch.tensor([s[-1] for s in seqs])
        logits = torch.stack([drafter.block_logits(s) for s in seqs])  # [bs, L, V]
        logp, ids = topk_logprobs(logits.view(-1, target.vocab), k)
        depth = BLOCK - 1
        tree = build_tree(logp.view(len(seqs), depth, k), ids.view(len(seqs), depth, k),
                          roots, seq_lens, budget)
        res = greedy_walk(tree, verify_forward(target, seqs, tree, seq_lens, mask_fn, choose))
        for b, s in enumerate(seqs):
            if len(s) < goal[b]:
                n = int(res.commit_lens[b])
                s.extend(res.out_tokens[b, :n].tolist())
                commits.append(n)
    return [s[:g] for s, g in zip(seqs, goal, strict=True)], commits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ddtree_greedy_is_token_identical_and_acceptance_rises(seed):
    target = TinyLM(seed=seed)
    drafter = OracleDrafter(target, BLOCK - 1, seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, target.vocab, (n,), generator=g).tolist() for n in (1, 5, 12)]
    want = [target.greedy(p, NEW_TOKENS) for p in prompts]
    mean_accept = {}
    for budget in (1, 4, 16, 64):
        got, commits = ddtree_decode(target, drafter, prompts, budget)
        assert got == want, f"budget {budget}: DDTree output differs from greedy"
        mean_accept[budget] = sum(commits) / len(commits)
    print(f"seed {seed} mean committed tokens per round by budget: {mean_accept}")
    accs = [mean_accept[n] for n in (1, 4, 16, 64)]
    assert accs[-1] > accs[0] + 0.5, mean_accept
    assert all(b >= a - 0.15 for a, b in itertools.pairwise(accs)), mean_accept


def test_a_wrong_mask_breaks_losslessness():
    """Control: verifying with a plain causal mask over the flattened tree (the classic port
    bug) must change the output, so the identity test above has teeth."""
    target = TinyLM(seed=5)
    drafter = OracleDrafter(target, BLOCK - 1, 5)
    prompt = [3, 1, 4, 1, 5]
    want = target.greedy(prompt, NEW_TOKENS)

    def causal_flat(tree, seq_lens):
        bad = tree.visibility | torch.ones_like(tree.visibility).tril()
        return full_mask(dataclasses.replace(tree, visibility=bad), seq_lens)

    assert ddtree_decode(target, drafter, [prompt], 16)[0][0] == want
    got, _ = ddtree_decode(target, drafter, [prompt], 16, mask_fn=causal_flat)
    assert got[0] != want


def seeded_choice(seeds, temperature, top_p=None):
    """Node choice of the worker's seeded path for request b's rows."""

    def choose(b, logits, positions):
        w = logits.shape[0]
        got = seeded_node_targets(
            logits, w, torch.tensor([temperature]), torch.tensor([seeds[b]]), positions,
            toy_multinomial_with_seed,
            top_ps=None if top_p is None else torch.tensor([top_p]),
        )  # fmt: skip
        return got.view(w)

    return choose


def plain_seeded_decode(target, prompt, seed, temperature, top_p=None):
    """Non-speculative seeded sampling: one draw per step, keyed by the input token's position."""
    seq = list(prompt)
    choose = seeded_choice([seed], temperature, top_p)
    for _ in range(NEW_TOKENS):
        logits = target.next_logits(seq).view(1, -1)
        seq.append(int(choose(0, logits, torch.tensor([len(seq) - 1]))[0]))
    return seq


@pytest.mark.parametrize(("seed", "temperature", "top_p"), [(0, 1.0, None), (1, 0.7, 0.9)])
def test_ddtree_seeded_sampling_is_token_identical_to_plain_seeded_sampling(
    seed, temperature, top_p
):
    """T > 0 with per-request seeds: every committed token is the draw plain seeded decoding
    makes at that position, so DDTree's output equals it exactly, whatever the budget."""
    target = TinyLM(seed=seed)
    drafter = OracleDrafter(target, BLOCK - 1, seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, target.vocab, (n,), generator=g).tolist() for n in (1, 5, 12)]
    seeds = [11, 12, 13]
    want = [plain_seeded_decode(target, p, s, temperature, top_p)
            for p, s in zip(prompts, seeds, strict=True)]
    assert want != [target.greedy(p, NEW_TOKENS) for p in prompts]  # really sampled
    for budget in (1, 4, 16, 64):
        got, commits = ddtree_decode(target, drafter, prompts, budget,
                                     choose=seeded_choice(seeds, temperature, top_p))
        assert got == want, f"budget {budget}: seeded DDTree output differs"
        if budget == 64:
            assert sum(commits) / len(commits) > 1.2, commits  # drafts were accepted
    # and another seed gives another output (the seed is used)
    other = plain_seeded_decode(target, prompts[2], 99, temperature, top_p)
    assert other != want[2]


def test_seeded_identity_needs_the_node_positions():
    """Control: keying the draws by anything but the node's own position (here: one off)
    breaks the identity, so the test above has teeth."""
    target = TinyLM(seed=3)
    drafter = OracleDrafter(target, BLOCK - 1, 3)
    prompt = [2, 7, 1, 8]
    want = plain_seeded_decode(target, prompt, 5, 1.0)
    right = seeded_choice([5], 1.0)

    def off_by_one(b, logits, positions):
        return right(b, logits, positions + 1)

    assert ddtree_decode(target, drafter, [prompt], 16, choose=right)[0][0] == want
    assert ddtree_decode(target, drafter, [prompt], 16, choose=off_by_one)[0][0] != want
