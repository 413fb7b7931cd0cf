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
file; every process logs a loud warning. The worker applies it on the device (``DevicePlant``,
no host sync); ``apply_plant_host`` is the same rewrite on host lists, its reference.
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


def apply_plant_host(
    spec: PlantSpec,
    reqs: list[tuple[tuple[int, ...], int]],
    prefix: list[int],
    roots: list[int],
    logp_rows: list,
    id_rows: list,
) -> tuple[list, list]:
    """The plant on host lists: ``reqs`` = (input_ids, prompt_len) per batch row, ``id_rows`` /
    ``logp_rows`` = ``[bs][L][K]``. The reference the device version is tested against."""
    depth = len(id_rows[0]) if id_rows else 0
    k = len(id_rows[0][0]) if depth else 0
    id_rows, logp_rows = list(id_rows), list(logp_rows)
    for b, (input_ids, prompt_len) in enumerate(reqs):
        planted = spec.find(input_ids)
        if planted is None:
            continue
        ovs = row_overrides(planted, prompt_len, prefix[b], roots[b], depth)
        if not ovs:
            continue
        id_rows[b] = apply_overrides(id_rows[b], ovs)
        if spec.logp_profile is not None:
            logp_rows[b] = [profile_row(spec.logp_profile, k)] * depth
    return logp_rows, id_rows


class DevicePlant:
    """``apply_plant_host`` as batched tensor ops: no host sync, so planted rounds cost what a
    real drafter's would (the host version reads every ``[bs, L, K]`` row back each round, which
    dominates planted rounds at bs = 32 on the H200). The host's part per round is only the
    batch row -> plant request index (``row_index``), sent without a sync."""

    def __init__(self, spec: PlantSpec, device) -> None:
        import torch

        self.spec = spec
        self.device = device
        self.index = {r.input_ids: i for i, r in enumerate(spec.requests)}
        width = max(len(r.continuation) for r in spec.requests)
        cont = torch.full((len(spec.requests), width), -1, dtype=torch.long)
        ranks = torch.full((len(spec.requests), width), -1, dtype=torch.long)
        for i, r in enumerate(spec.requests):
            cont[i, : len(r.continuation)] = torch.tensor(r.continuation)
            ranks[i, : len(r.ranks)] = torch.tensor(r.ranks)
        self.cont, self.ranks = cont.to(device), ranks.to(device)
        self.clen = torch.tensor([len(r.continuation) for r in spec.requests], device=device)
        self._profiles: dict = {}  # (k, dtype) -> the planted rows' log-probs, built once

    def row_index(self, reqs: list[tuple[tuple[int, ...], int]]):
        """``[bs, 2]`` (plant request or -1, prompt length) on the device, copied without a
        host wait (pinned memory on CUDA)."""
        import torch

        host = torch.tensor([[self.index.get(ids, -1), n] for ids, n in reqs], dtype=torch.long)
        if torch.device(self.device).type == "cuda":
            return host.pin_memory().to(self.device, non_blocking=True)
        return host.to(self.device)

    def _profile(self, k: int, logp):
        """The planted rows' ``[K]`` log-probs in logp's dtype (one upload per (K, dtype))."""
        import torch

        key = (k, logp.dtype)
        if key not in self._profiles:
            self._profiles[key] = torch.tensor(
                profile_row(self.spec.logp_profile, k), dtype=logp.dtype, device=logp.device
            )
        return self._profiles[key]

    def apply(self, rows, seq_lens, roots, logp, ids):
        """Planted ``(logp, ids)`` for ``[bs, L, K]`` inputs; ``rows`` from ``row_index``.
        CUDA tensors take the one-launch Triton version (plant_triton) unless
        ``SGLANG_DFLASH_DDTREE_IMPL=torch``; the torch ops below are its reference."""
        import torch

        from sglang_dflash.ddtree.tree import triton_module, use_triton

        bs, depth, k = ids.shape
        kernel = (triton_module("sglang_dflash.sglang_overlay.diagnostics.plant_triton")
                  if use_triton(ids) else None)
        if kernel is not None:
            prof = self._profile(k, logp) if self.spec.logp_profile is not None else None
            return kernel.apply_triton(self, rows, seq_lens, roots, logp, ids, prof)
        plan, prompt_len = rows[:, 0], rows[:, 1]
        has = plan >= 0
        p = plan.clamp(min=0)
        clen = self.clen[p]
        base = seq_lens.long() - prompt_len  # continuation index of the root token
        in_range = has & (base >= 0) & (base < clen)
        root_tok = self.cont[p, base.clamp(0, self.cont.shape[1] - 1)]
        ok = in_range & (root_tok == roots.long())
        d = torch.arange(1, depth + 1, device=ids.device)
        j = base.view(bs, 1) + d.view(1, depth)  # [bs, L]
        active = ok.view(bs, 1) & (j < clen.view(bs, 1))
        jc = j.clamp(0, self.cont.shape[1] - 1)
        tok = self.cont[p.view(bs, 1), jc]  # [bs, L]
        rank = self.ranks[p.view(bs, 1), jc]
        row = ids.long()
        match = row == tok.unsqueeze(-1)  # [bs, L, K]
        present = match.any(-1)
        here = match.long().argmax(-1)
        place = active & (rank >= 0) & (rank < k)
        remove = active & ~place & present
        r = rank.clamp(0, k - 1)
        at_rank = row.gather(-1, r.unsqueeze(-1)).squeeze(-1)  # the id sitting at rank r
        # the smallest id not in the row and not the token (ids are distinct, so it is <= K)
        slots = torch.zeros(bs, depth, k + 3, dtype=torch.bool, device=ids.device)
        slots.scatter_(-1, row.clamp(0, k + 2), True)
        slots.scatter_(-1, tok.clamp(0, k + 2).unsqueeze(-1), True)
        filler = (~slots[..., : k + 2]).long().argmax(-1)
        out = row.clone()
        # placing: the token's old slot (if any) takes what was at rank r, rank r the token
        swap = place & present
        out.scatter_(-1, here.unsqueeze(-1),
                     torch.where(swap, at_rank, out.gather(-1, here.unsqueeze(-1)).squeeze(-1))
                     .unsqueeze(-1))  # fmt: skip
        out.scatter_(-1, r.unsqueeze(-1),
                     torch.where(place, tok, out.gather(-1, r.unsqueeze(-1)).squeeze(-1))
                     .unsqueeze(-1))  # fmt: skip
        # removing: the token's slot gets the filler
        out.scatter_(-1, here.unsqueeze(-1),
                     torch.where(remove, filler, out.gather(-1, here.unsqueeze(-1)).squeeze(-1))
                     .unsqueeze(-1))  # fmt: skip
        new_logp = logp
        if self.spec.logp_profile is not None:
            planted_row = ok & (base + 1 < clen)  # the host applies it when any override exists
            prof = self._profile(k, logp)
            new_logp = torch.where(planted_row.view(bs, 1, 1), prof.view(1, 1, k), logp)
        return new_logp, out.to(ids.dtype)
