"""TEST-ONLY planted draft source: force where the target's true next token sits in the draft.

With dummy weights the drafter never agrees with the target, so a GPU run would exercise only
rejections. A plant file fixes the drafter's per-depth top-K *ids* (never the log-probs, so the
tree shape is unchanged) so that the target's true next token sits at a chosen rank:

    {
      "test_only": true,
      "requests": [
        {"input_ids": [1, 2, 3],           # the prompt, exactly as sent
         "continuation": [7, 9, 4, 4],     # the target's greedy output for that prompt
         "ranks": [0, 2, -1, 0]}           # per continuation index: rank of the true token
      ],
      "logp_profile": [-0.01, -4.0, -5.0]  # optional: fixed per-rank log-probs for planted rows
    }

At a decode step the root (bonus) token of a request with P prompt tokens and committed
prefix length s is ``continuation[s - P]``; the token the drafter proposes at depth d should be
``continuation[s - P + d]``, and ``ranks[s - P + d]`` says where it goes: 0 = rank 0 (on the
greedy spine), 1..3 (any r < K) = that rank, -1 (or r >= K) = absent from the top-K. A row whose
root does not match the continuation (the run diverged) or that lies past the continuation is
left alone. With ``logp_profile`` every planted row's log-probs are replaced by that
non-increasing profile (extended by -1 per further rank), which fixes the tree shape and so
the acceptance of every round (``plant_oracle.expected_rounds`` predicts it). Greedy output
stays token-identical: the plant only changes which candidates the
target verifies, never the target's choice.

It is enabled only by ``SGLANG_DFLASH_DDTREE_PLANT=<file>`` AND ``"test_only": true`` inside the
file; every process logs a loud warning. The application syncs with the host (test-only).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path


class PlantError(ValueError):
    """A plant file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class PlantedRequest:
    input_ids: tuple[int, ...]
    continuation: tuple[int, ...]
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class PlantSpec:
    requests: tuple[PlantedRequest, ...]
    logp_profile: tuple[float, ...] | None = None

    def find(self, input_ids: tuple[int, ...]) -> PlantedRequest | None:
        for req in self.requests:
            if req.input_ids == input_ids:
                return req
        return None


@dataclass(frozen=True)
class Override:
    """Put ``token`` at ``rank`` (or remove it when rank is -1) in depth row ``depth`` (1-based)."""

    depth: int
    token: int
    rank: int


def _int_list(value: object, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    ):
        raise PlantError(f"plant file: {where}.{what} must be a list of integers")
    return tuple(value)


def parse_plant(text: str, source: str = "plant file") -> PlantSpec:
    """Validate the JSON text of a plant file."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlantError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise PlantError(f"{source}: top level must be an object")
    if data.get("test_only") is not True:
        raise PlantError(
            f'{source}: refusing a planted draft source without "test_only": true '
            "(it replaces the drafter's proposals; never use it in production)"
        )
    reqs = data.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise PlantError(f'{source}: "requests" must be a non-empty list')
    out = []
    for i, item in enumerate(reqs):
        where = f"requests[{i}]"
        if not isinstance(item, dict):
            raise PlantError(f"{source}: {where} must be an object")
        ids = _int_list(item.get("input_ids"), "input_ids", where)
        cont = _int_list(item.get("continuation"), "continuation", where)
        ranks = _int_list(item.get("ranks"), "ranks", where)
        if not ids or not cont:
            raise PlantError(f"{source}: {where} needs non-empty input_ids and continuation")
        if len(ranks) != len(cont):
            raise PlantError(
                f"{source}: {where}.ranks has {len(ranks)} entries, continuation {len(cont)}"
            )
        if any(r < -1 for r in ranks) or any(t < 0 for t in cont):
            raise PlantError(f"{source}: {where} ranks must be >= -1 and tokens >= 0")
        out.append(PlantedRequest(ids, cont, ranks))
    profile = data.get("logp_profile")
    if profile is not None:
        ok = (
            isinstance(profile, list)
            and profile
            and all(
                isinstance(x, int | float) and not isinstance(x, bool) and x <= 0 for x in profile
            )
        )
        if not ok or any(b > a for a, b in itertools.pairwise(profile)):
            raise PlantError(
                f"{source}: logp_profile must be a non-empty, non-increasing list of numbers <= 0"
            )
        profile = tuple(float(x) for x in profile)
    return PlantSpec(tuple(out), profile)


def load_plant(path: str) -> PlantSpec:
    """Read and validate a plant file (one-line PlantError on any problem)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PlantError(f"plant file {path}: cannot read ({exc.strerror})") from None
    return parse_plant(text, source=f"plant file {path}")


def row_overrides(
    req: PlantedRequest, prompt_len: int, prefix_len: int, root_token: int, max_depth: int
) -> list[Override]:
    """The overrides for one request's draft rows at this step (empty when not applicable)."""
    base = prefix_len - prompt_len  # continuation index of the root token
    if base < 0 or base >= len(req.continuation) or req.continuation[base] != root_token:
        return []
    out = []
    for d in range(1, max_depth + 1):
        j = base + d
        if j >= len(req.continuation):
            break
        out.append(Override(depth=d, token=req.continuation[j], rank=req.ranks[j]))
    return out


def apply_overrides(ids_row: list[list[int]], overrides: list[Override]) -> list[list[int]]:
    """Rewrite one request's ``[L][K]`` top-K ids; rows keep distinct ids.

    Placing a token at rank r swaps it with whatever sits there (or writes it over rank r when
    absent). Removing a token replaces it by the smallest id not in the row.
    """
    rows = [list(r) for r in ids_row]
    for ov in overrides:
        row = rows[ov.depth - 1]
        k = len(row)
        here = row.index(ov.token) if ov.token in row else -1
        if 0 <= ov.rank < k:
            if here >= 0:
                row[here], row[ov.rank] = row[ov.rank], row[here]
            else:
                row[ov.rank] = ov.token
        elif here >= 0:
            used = set(row)
            filler = next(t for t in range(len(used) + 1) if t not in used and t != ov.token)
            row[here] = filler
    return rows


def profile_row(profile: tuple[float, ...], k: int) -> list[float]:
    """The ``k`` per-rank log-probs of a planted row: the profile, then -1 per further rank."""
    row = list(profile[:k])
    while len(row) < k:
        row.append(row[-1] - 1.0)
    return row
