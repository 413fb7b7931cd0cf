"""The acceptance oracle for planted GPU runs (which rounds accept how many drafts)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree overlay needs torch")
from sglang_dflash.sglang_overlay.diagnostics.plant import PlantedRequest  # noqa: E402
from sglang_dflash.sglang_overlay.diagnostics.plant_oracle import accept_len, expected_rounds  # noqa: E402

PROFILE = (-0.01, -4.0, -5.0)


@pytest.mark.parametrize(
    ("budget", "ranks", "want"),
    [
        (3, [0, 0, 0], 3),  # budget 3 = the rank-0 spine only
        (3, [0, 1, 0], 1),
        (3, [-1, 0, 0], 0),
        (3, [7, 0, 0], 0),  # rank >= K is absent
        (6, [1, 0, 0], 2),  # spine + (1), (0,1), (1,0): the tie goes to (0,1) first
        (6, [0, 1, 0], 2),
        (6, [0, 0, 1], 2),
        (40, [2, 1, 0], 3),
    ],
)
def test_accept_len(budget, ranks, want):
    assert accept_len(PROFILE, k=4, depth=3, budget=budget, ranks=ranks) == want


def test_expected_rounds_walk_the_continuation():
    cont = tuple(range(100, 140))
    spine = PlantedRequest((1,), cont, (0,) * len(cont))
    # budget 15, block 16: the spine is the whole tree, every round commits 16 tokens
    assert expected_rounds(
        spine, PROFILE, budget=15, block_size=16, vocab=512, max_new_tokens=33
    ) == [15, 15]
    nothing = PlantedRequest((1,), cont, (-1,) * len(cont))
    assert expected_rounds(
        nothing, PROFILE, budget=15, block_size=16, vocab=512, max_new_tokens=5
    ) == [0, 0, 0, 0]
    # budget 3 limits the depth to 3 (draft width min(16, 4))
    assert expected_rounds(
        spine, PROFILE, budget=3, block_size=16, vocab=512, max_new_tokens=9
    ) == [3, 3]
    mixed = PlantedRequest((1,), cont, tuple([0, 0, -1] * 14)[: len(cont)])
    # root = cont[0]; depth 1 -> index 1 (rank 0), depth 2 -> index 2 (absent): accept 1
    assert (
        expected_rounds(mixed, PROFILE, budget=15, block_size=16, vocab=512, max_new_tokens=4)[0]
        == 1
    )


def test_boundary_margin_flags_ties_at_the_budget():
    from sglang_dflash.sglang_overlay.diagnostics.plant_oracle import boundary_margin

    # Spine of 15 at -0.01 steps; then single rank-1 paths tie in groups (one per length).
    tied = boundary_margin((-0.01, -4.0, -5.0, -6.0), 64, 15, 64)
    assert tied < 1e-9
    # 15 + 1 + 2 + ... + 9 = 60 closes a group: clean.
    assert boundary_margin((-0.01, -4.0, -5.0, -6.0), 60, 15, 60) > 0.009
    for budget in (16, 56):  # the profile scripts/gpu_e2e.py plants with
        assert boundary_margin((-0.1, -4.0, -4.25, -4.5), budget, 15, budget) > 0.04
    assert boundary_margin((-0.1,), 4, 1, 8) == float("inf")  # fewer prefixes than the budget
