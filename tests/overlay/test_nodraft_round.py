"""The k-step no-draft round's own logic inside the real worker class (SGLang CPU env).

The forward is a deterministic stand-in (tests/overlay/sglang_nodraft_probe.py), so what is
checked is the round's bookkeeping: each step's input is the previous step's token at the
next position and KV slot, the committed run and the drafter's rows are in order, the host
bounds grow per step and the batch is restored. The real forward runs on the GPU only
(docs/gpu-results.md, "Next GPU sessions").
"""

from __future__ import annotations

import os

import pytest
from test_sglang_hooks import _python, _run_script

VOCAB, BLOCK, STEPS = 50, 6, 4


def _chain(bonus: int, prefix: int) -> tuple[list[int], list[int]]:
    """(inputs, outputs) of the stand-in target over STEPS steps."""
    inputs, outputs, tok = [], [], bonus
    for j in range(STEPS):
        inputs.append(tok)
        tok = (tok * 7 + prefix + j) % VOCAB
        outputs.append(tok)
    return inputs, outputs


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_DDTREE")}
    return _run_script(_python(), "sglang_nodraft_probe.py", [], env)


def test_each_step_feeds_the_previous_token_at_the_next_position(probe):
    calls = probe["calls"]
    assert len(calls) == STEPS and all(c["width"] == 1 for c in calls)
    (in0, _), (in1, _) = _chain(3, 5), _chain(11, 9)
    for j, c in enumerate(calls):
        assert c["tokens"] == [in0[j], in1[j]]
        assert c["positions"] == c["seq_lens"] == [5 + j, 9 + j]
        assert c["seq_lens_cpu"] == [5 + j, 9 + j] and c["seq_lens_sum"] == 14 + 2 * j
        assert c["slots"] == [1000 + 5 + j, 2000 + 9 + j]  # column j of the draft block


def test_the_round_commits_the_k_tokens_as_an_accepted_run(probe):
    (_, out0), (_, out1) = _chain(3, 5), _chain(11, 9)
    assert probe["next_token_ids"] == [out0 + [0] * (BLOCK - STEPS), out1 + [0] * (BLOCK - STEPS)]
    assert probe["stride"] == BLOCK
    assert probe["accept_lens"] == [STEPS, STEPS] and probe["accept_dtype"] == "torch.int32"
    assert probe["new_seq_lens"] == [5 + STEPS, 9 + STEPS] == probe["published"][0]
    assert probe["next_draft_input"] == {"bonus": [out0[-1], out1[-1]],
                                         "seq_lens": [5 + STEPS, 9 + STEPS]}
    assert probe["batch_restored"] and probe["hidden_cleared"]


def test_the_drafter_gets_every_steps_row_at_its_slot_once(probe):
    (in0, _), (in1, _) = _chain(3, 5), _chain(11, 9)
    assert probe["appended"] == 1
    rows = [[float(t), float(5 + j)] for j, t in enumerate(in0)] + \
        [[float(t), float(9 + j)] for j, t in enumerate(in1)]
    assert probe["append_rows"] == rows
    assert probe["append_positions"] == [5, 6, 7, 8, 9, 10, 11, 12]
    assert probe["append_loc"] == [1005, 1006, 1007, 1008, 2009, 2010, 2011, 2012]
    assert probe["append_loc_2d"] == [[1005, 1006, 1007, 1008], [2009, 2010, 2011, 2012]]
    assert probe["append_commit"] == [STEPS, STEPS]


def test_the_round_publishes_its_lengths_before_its_first_step(probe):
    """A no-draft round's new lengths (prefix + k) are known before it runs, so it publishes
    them first: SGLang's next round waits (resolve_seq_lens_cpu, a host sync) only for this
    round's start on the GPU, not its end, and the host runs a round ahead (§23)."""
    assert probe["steps_before_publish"] == [0]
    assert probe["published"] == [[5 + STEPS, 9 + STEPS]]


def test_without_host_lengths_the_steps_keep_none(probe):
    """SGLANG_DFLASH_DDTREE_HOST_LENS=bound: SGLang gives the round no host lengths; each step
    leaves them unset (its verify plans from the reserved bound) and the batch is restored."""
    assert probe["bare_steps"] == [[[5 + j, 9 + j], None, None] for j in range(STEPS)]
    assert probe["bare_restored"]



def test_a_short_round_runs_its_steps_and_is_not_metered(probe):
    """``round_steps`` cut the round to 2 of its k = 4 steps (no request keeps more): it runs
    and commits 2 tokens a request like the first 2 steps of a full round, and it is not
    metered (budget 0's cost is that of k steps); the round before it keeps its counters but
    not its cost (``interrupt``), which would span this one."""
    short = probe["short"]
    (_, out0), (_, out1) = _chain(3, 5), _chain(11, 9)
    assert short["steps"] == 2 and short["meter"] == ["interrupt"]
    assert short["next_token_ids"] == [out0[:2] + [0] * (BLOCK - 2), out1[:2] + [0] * (BLOCK - 2)]
    assert short["accept_lens"] == [2, 2] and short["new_seq_lens"] == [7, 11]
    assert short["append_commit"] == [2, 2] and short["append_positions"] == [5, 6, 9, 10]
    assert short["batch_restored"]
