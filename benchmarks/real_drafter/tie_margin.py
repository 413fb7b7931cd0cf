"""Tell a greedy divergence explained by bf16 numerics from a real losslessness bug.

``serve_pair``'s greedy outputs differ across modes on the trained pair (stock DFLASH too):
verify widths and batch shapes round bf16 differently, and near-tied top logits flip. For every
prompt and every mode whose output differs from the reference mode's (default ``none``,
one-at-a-time), at the first divergent position p the common prefix (prompt + output[:p]) goes
through the HF ``Qwen3ForCausalLM`` target in float32 and in bfloat16 (as served). With a =
the reference's token, b = the mode's:

- ``gap`` = |l32[a] - l32[b]|, the fp32 logit gap of the two tokens;
- ``eps`` = max over the fp32 top-8 tokens of |l_bf16 - l_32|: the bf16 computation's own
  error on this prefix;
- verdict ``numerics`` when gap <= 2 * eps (the two tokens are within bf16's error of each
  other, either may win), else ``mismatch`` (a length difference is a ``mismatch`` too).

Run from the repo root (on the GPU host: ``PYTHONPATH=/root/site:src:benchmarks``)::

    PYTHONPATH=src:benchmarks python3 -m real_drafter.tie_margin --pair /root/pair \\
        --results /root/sA/results.json --out /root/tie.json --device cuda

Compared: every served mode's ``greedy`` (one at a time) and ``greedy_parallel`` (all at once)
outputs, the reference's own ``greedy_parallel`` included, against the reference's ``greedy``.
Identical prefixes are forwarded once.

Seeded T > 0 (``serve_pair``'s ``seeded:<mode>`` rows, which keep both outputs and the
sampling parameters): SGLang's deterministic sampler draws by hashing (seed, position, rank in
the sorted probabilities), so any reorder of two near-equal probabilities moves the draw; a
gap of logits says nothing here. At the first divergence the sampler itself (our
``verify.seeded_node_targets`` with SGLang's ``multinomial_with_seed``, as the servers ran it:
position = prefix length - 1) draws from the fp32 logits, the bf16 ones, the fp32 ones with a
and b pushed eps apart either way, and ``SEEDED_DRAWS`` copies with uniform noise in
[-eps, eps] on every logit; where a or b is not among them, its witness rows (``witness_rows``:
only that token's logit moved within +-2 eps, which softmax cannot tell from every logit
moved within +-eps; without top-k/top-p the move up by 2 eps is the most favourable one, so the
verdict is then exact), then ``SEEDED_SPREAD_DRAWS`` more noisy copies where the draws scatter:
``judge_seeded``. Verdict ``numerics`` when both a and b are among those draws (each
server's token is what the sampler gives within bf16's error), else ``mismatch``. Needs SGLang
importable (the GPU host's site) when seeded rows diverge.

Exit 0 whether or not every divergence is explained (``summary.lossless_explained`` says), 2
with one line on stderr for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("greedy", "greedy_parallel")
TOP_EPS = 8  # eps is measured over the fp32 top-8 tokens
VERDICTS = ("identical", "numerics", "mismatch")
SEEDED_DRAWS = 64  # noisy copies of the fp32 logits the seeded sampler draws from
SEEDED_SPREAD_DRAWS = 3072  # more where the draws scatter and a or b is missing (judge_seeded)
SEEDED_CHUNK = 512  # rows drawn at once (a vocabulary-wide row each)
WITNESS_MAX = 1024  # witness rows per token at most (the nearest logits' boundaries first)
SEEDED_KIND = "seeded"


class InputError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


# ---- pure decisions ------------------------------------------------------------------------


def first_divergence(ref: Sequence[int], out: Sequence[int]) -> int | None:
    """The first index where the outputs differ; the shorter length if one is a proper prefix
    of the other; None when identical."""
    for i, (x, y) in enumerate(zip(ref, out, strict=False)):
        if x != y:
            return i
    return None if len(ref) == len(out) else min(len(ref), len(out))


def verdict(l32_a: float, l32_b: float, eps: float) -> str:
    """``numerics`` when the fp32 gap of the two tokens is within twice the bf16 error bound
    (each side's bf16 logit may be off by eps), else ``mismatch``."""
    return "numerics" if abs(l32_a - l32_b) <= 2.0 * eps else "mismatch"


@dataclass(frozen=True)
class Divergence:
    """One (mode, kind, prompt) whose output differs from the reference's."""

    mode: str
    backend: str
    kind: str
    prompt: int
    position: int
    prefix: tuple[int, ...]  # prompt ids + the common output prefix
    a: int | None  # the reference's token at position (None: its output ended)
    b: int | None  # the mode's token at position


@dataclass(frozen=True)
class Logits:
    """What the two forwards say about one prefix (full-vocabulary fp32 and bf16 rows)."""

    l32: list[float]
    l16: list[float]


def bf16_eps(lg: Logits) -> float:
    """The bf16 computation's own error on this prefix: max over the fp32 top-TOP_EPS tokens
    of |l_bf16 - l_32| (the greedy and the seeded judges both reason within it)."""
    top = sorted(range(len(lg.l32)), key=lambda i: -lg.l32[i])[:TOP_EPS]
    return max(abs(lg.l16[i] - lg.l32[i]) for i in top)


@dataclass(frozen=True)
class JudgedAt:
    """Where a judged divergence is, the fields every verdict row starts with (greedy and
    seeded rows share the summary's per-mode, per-kind counts)."""

    mode: str
    backend: str
    kind: str
    prompt: int
    position: int
    prefix_len: int
    a: int | None
    b: int | None


@dataclass(frozen=True)
class Judged(JudgedAt):
    """One divergence with its fp32/bf16 evidence and verdict."""

    l32_a: float | None
    l32_b: float | None
    gap: float | None
    argmax32: int
    top2_margin32: float
    argmax16: int
    eps: float
    a_is_argmax32: bool
    b_is_argmax32: bool
    rank32_a: int | None
    rank32_b: int | None
    verdict: str


def judge(d: Divergence, lg: Logits) -> Judged:
    """The verdict of one divergence from its prefix's logits (pure)."""
    l32, l16 = lg.l32, lg.l16
    order = sorted(range(len(l32)), key=lambda i: -l32[i])
    eps = bf16_eps(lg)
    argmax32, argmax16 = order[0], max(range(len(l16)), key=lambda i: l16[i])
    margin = l32[order[0]] - l32[order[1]] if len(order) > 1 else float("inf")

    def rank(t: int | None) -> int | None:
        return None if t is None else sum(1 for v in l32 if v > l32[t])

    la = None if d.a is None else l32[d.a]
    lb = None if d.b is None else l32[d.b]
    if la is None or lb is None:
        gap, v = None, "mismatch"  # one output is shorter: no tie explains that
    else:
        gap, v = abs(la - lb), verdict(la, lb, eps)
    return Judged(
        mode=d.mode,
        backend=d.backend,
        kind=d.kind,
        prompt=d.prompt,
        position=d.position,
        prefix_len=len(d.prefix),
        a=d.a,
        b=d.b,
        l32_a=la,
        l32_b=lb,
        gap=gap,
        argmax32=argmax32,
        top2_margin32=margin,
        argmax16=argmax16,
        eps=eps,
        a_is_argmax32=d.a == argmax32,
        b_is_argmax32=d.b == argmax32,
        rank32_a=rank(d.a),
        rank32_b=rank(d.b),
        verdict=v,
    )


@dataclass(frozen=True)
class SeededDivergence:
    """One seeded:<mode> row whose T > 0 output differs from the seeded reference's."""

    mode: str
    backend: str
    prompt: int
    position: int
    prefix: tuple[int, ...]
    a: int | None
    b: int | None
    temperature: float
    top_p: float
    seed: int
    top_k: int = -1  # -1: every token (SGLang's default)


# The sampling fields SGLang takes from the model's generation_config.json when a request leaves
# them out (ModelConfig.get_default_sampling_params, sampling_defaults "model"); the judge models
# temperature, top-p and top-k, and refuses a pair whose defaults set the others.
MODEL_SAMPLING_DEFAULTS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
JUDGED_SAMPLING = ("temperature", "top_k", "top_p", "sampling_seed")


def sampling_defaults(generation_config: dict) -> dict:
    """What SGLang's servers add to a request from the pair's generation_config.json: its
    sampling fields that are set (transformers 5 writes none for the trained pair). Pure."""
    return {k: generation_config[k] for k in MODEL_SAMPLING_DEFAULTS
            if generation_config.get(k) is not None}


@dataclass(frozen=True)
class SeededJudged(JudgedAt):
    """One seeded divergence, the sampler's draws within bf16's error, and the verdict."""

    eps: float
    draw32: int
    draw16: int
    hits_a: int
    hits_b: int
    draws: int
    verdict: str
    other: int = 0  # draws that gave neither a nor b: many means the draw moves among many tokens
    witnesses: int = 0  # of the draws, witness rows (``witness_rows``) for a missing a or b


def find_seeded_divergences(
    results: dict, prompts: list[list[int]], defaults: dict | None = None
) -> tuple[list[SeededDivergence], dict[str, dict[str, int]], int]:
    """Every seeded row that differs from its reference output, per mode the identical count,
    and how many rows could not be judged (a results.json from before rows kept outputs).
    ``defaults``: ``sampling_defaults`` of the pair, under each row's own parameters. Pure;
    ValueError for a row whose prompt index is past prompts.jsonl or whose sampling the judge
    does not model (repetition penalty, min-p)."""
    defaults = defaults or {}
    divs: list[SeededDivergence] = []
    identical: dict[str, dict[str, int]] = {}
    unjudged = 0
    for key, rec in results.get("seeded", {}).items():
        if not isinstance(rec, dict) or not rec.get("rows"):
            continue
        count = 0
        for i, row in enumerate(rec["rows"]):
            if not all(k in row for k in ("output", "reference", "params")):
                unjudged += 1
                continue
            if i >= len(prompts):
                raise ValueError(f"{key} has seeded row {i} but prompts.jsonl only "
                                 f"{len(prompts)} prompts")
            ref, out = row["reference"], row["output"]
            p = first_divergence(ref, out)
            if p is None:
                count += 1
                continue
            prm = defaults | row["params"]
            extra = sorted(k for k in prm if k not in JUDGED_SAMPLING
                           and prm[k] not in (None, 0.0, 1.0))
            if extra:
                raise ValueError(f"{key} row {i} samples with {', '.join(extra)}: the seeded "
                                 "judge models temperature, top-k and top-p only")
            divs.append(SeededDivergence(
                mode=key, backend=rec.get("backend", ""), prompt=i, position=p,
                prefix=tuple(prompts[i]) + tuple(ref[:p]),
                a=ref[p] if p < len(ref) else None, b=out[p] if p < len(out) else None,
                temperature=float(prm["temperature"]), top_p=float(prm.get("top_p", 1.0)),
                seed=int(prm["sampling_seed"]), top_k=int(prm.get("top_k", -1))))
        identical.setdefault(key, {})[SEEDED_KIND] = count
    return divs, identical, unjudged


def witness_rows(l32, t: int, eps: float, limit: int = WITNESS_MAX):
    """Copies of the fp32 row ``l32`` with only token ``t``'s logit moved, within
    ``[l_t - 2 eps, l_t + 2 eps]``: to both ends and to just above and just below every other
    logit in that range (the nearest ``limit // 2`` of them), so ``t`` takes every rank it can
    reach. Softmax cannot tell ``t`` moved by 2d from ``t`` moved by d and every other logit by
    -d, so each row is the fp32 logits with every logit within eps: a draw of ``t`` from one is a
    draw within bf16's error. Without top-k/top-p (Gumbel-max over token ids) the row with ``t``
    up by 2 eps is the most favourable such perturbation for ``t``: none of them drawing ``t``
    means no perturbation within eps does. With truncation (noise by rank) they are witnesses,
    not a proof. ``[k, V]`` float32; pure."""
    import torch

    row = l32.to(torch.float32)
    lt = float(row[t])
    lo, hi = lt - 2.0 * eps, lt + 2.0 * eps
    near = (row > lo) & (row < hi)
    near[t] = False
    vals = row[near]
    vals = vals[(vals - lt).abs().argsort()[: max(0, limit // 2)]]
    cands = torch.cat([torch.tensor([lo, hi], dtype=torch.float32),
                       torch.nextafter(vals, torch.full_like(vals, float("inf"))),
                       torch.nextafter(vals, torch.full_like(vals, float("-inf")))])
    cands = cands.clamp(lo, hi)
    rows = row.unsqueeze(0).repeat(cands.numel(), 1)
    rows[:, t] = cands
    return rows


def judge_seeded(d: SeededDivergence, lg: Logits, seeded, draws: int = SEEDED_DRAWS,
                 noise_seed: int = 0, device: str = "cpu",
                 spread_draws: int = SEEDED_SPREAD_DRAWS,
                 witness_limit: int = WITNESS_MAX) -> SeededJudged:
    """The seeded sampler's draws from this prefix's logits within bf16's error (see the module
    docstring). ``seeded`` is SGLang's ``multinomial_with_seed`` (a stand-in in CPU tests),
    which hashes with a CUDA-only Triton kernel: the draws run on ``device``, the forwards'.

    Where a or b is not among the first draws, its ``witness_rows`` are drawn from (the token's
    logit alone moved within +-2 eps: exact without top-k/top-p). Where the draws scatter (a and
    b together under half of them) and a or b is still missing, ``spread_draws`` more are made,
    every logit still within eps of the fp32 ones, a third with a missing token pushed up by eps
    (a third each if both are): at a position whose draw
    moves among many near-equal tokens (H200 §37: 6 of 68 draws gave a, none b, 62 others) 68
    draws cannot tell a token the sampler never gives from one it gives rarely."""
    import torch

    l32 = torch.tensor(lg.l32, dtype=torch.float32)
    l16 = torch.tensor(lg.l16, dtype=torch.float32)
    eps = bf16_eps(lg)
    rows = [l32, l16]
    pair = d.a is not None and d.b is not None
    if pair:
        for sign in (1.0, -1.0):  # a and b pushed eps apart, either way
            r = l32.clone()
            r[d.a] += sign * eps
            r[d.b] -= sign * eps
            rows.append(r)
    gen = torch.Generator().manual_seed(noise_seed)
    noise = (torch.rand((draws, l32.numel()), generator=gen) * 2 - 1) * eps
    got = _seeded_draws(d, torch.cat([torch.stack(rows), l32.unsqueeze(0) + noise]), seeded,
                        device)
    spread = 2 * (got.count(d.a) + got.count(d.b)) < len(got)

    def missing() -> list[int]:  # a or b, where no draw so far gave it
        return [t for t in (d.a, d.b) if got.count(t) == 0] if pair else []

    witnesses = 0
    if eps > 0 and witness_limit > 0:  # eps 0: no logit may move
        for t in missing():
            rows_t = witness_rows(l32, t, eps, witness_limit)
            witnesses += rows_t.shape[0]
            for start in range(0, rows_t.shape[0], SEEDED_CHUNK):
                got += _seeded_draws(d, rows_t[start:start + SEEDED_CHUNK], seeded, device)
    lost = missing() if spread else []
    if lost:
        for start in range(0, spread_draws, SEEDED_CHUNK):
            k = min(SEEDED_CHUNK, spread_draws - start)
            extra = l32.unsqueeze(0) + (torch.rand((k, l32.numel()), generator=gen) * 2 - 1) * eps
            for i, t in enumerate(lost):  # a third each pushed up, the rest still noisy
                extra[i * k // 3:(i + 1) * k // 3, t] = l32[t] + eps
            got += _seeded_draws(d, extra, seeded, device)
            if not missing():
                break
    hits_a, hits_b = got.count(d.a), got.count(d.b)
    ok = pair and hits_a > 0 and hits_b > 0
    return SeededJudged(
        mode=d.mode, backend=d.backend, kind=SEEDED_KIND, prompt=d.prompt, position=d.position,
        prefix_len=len(d.prefix), a=d.a, b=d.b, eps=eps, draw32=got[0], draw16=got[1],
        hits_a=hits_a, hits_b=hits_b, draws=len(got), verdict="numerics" if ok else "mismatch",
        other=len(got) - hits_a - hits_b, witnesses=witnesses)


def _seeded_draws(d: SeededDivergence, logits, seeded, device: str) -> list[int]:
    """The seeded sampler's token for each row of ``logits`` at this divergence's position,
    seed, temperature and truncation: what a server at that prefix would draw from them."""
    import torch

    from sglang_dflash.sglang_overlay.verify import seeded_node_targets

    n = logits.shape[0]
    return seeded_node_targets(
        logits.to(device), 1, torch.full((n,), d.temperature),
        torch.full((n,), d.seed, dtype=torch.int64),
        torch.full((n,), len(d.prefix) - 1, dtype=torch.int64), seeded,
        top_ks=torch.full((n,), d.top_k, dtype=torch.int64) if d.top_k > 0 else None,
        top_ps=torch.full((n,), d.top_p) if d.top_p < 1.0 else None,
    ).view(-1).tolist()


def sglang_seeded_sampler():
    """SGLang's ``multinomial_with_seed`` as its eager function (the decorator's torch.compile
    is only speed). InputError when SGLang is not importable."""
    try:
        from sglang.srt.layers.sampler import multinomial_with_seed
    except Exception as exc:  # any import failure means the same to the user
        raise InputError(f"seeded rows diverge and judging them needs SGLang's sampler; "
                         f"import failed: {type(exc).__name__}: {exc}") from None
    return getattr(multinomial_with_seed, "_torchdynamo_orig_callable", multinomial_with_seed)


def _reference_record(serve: dict, reference: str, backend: str) -> tuple[str, dict] | None:
    """The reference mode's record for ``backend``: a key or mode equal to ``reference``
    (``none``, ``none@flashinfer``) or its label; the same backend preferred."""
    cands = [
        (k, r)
        for k, r in serve.items()
        if r.get("greedy") and reference in (k, r.get("mode"), r.get("label"))
    ]
    same = [c for c in cands if c[1].get("backend") == backend]
    return (same or cands or [None])[0]


def find_divergences(
    results: dict, prompts: list[list[int]], reference: str
) -> tuple[list[Divergence], dict[str, dict[str, dict[str, int]]]]:
    """Every divergence from the reference's one-at-a-time outputs, and per mode and kind the
    count of identical outputs (pure). ValueError when no served mode matches ``reference``."""
    serve = {k: r for k, r in results.get("serve", {}).items() if isinstance(r, dict)}
    if not any(reference in (k, r.get("mode"), r.get("label")) for k, r in serve.items()):
        known = ", ".join(sorted(serve)) or "none served"
        raise ValueError(f"unknown reference mode {reference!r} (served: {known})")
    divs: list[Divergence] = []
    identical: dict[str, dict[str, int]] = {}
    for key, rec in serve.items():
        ref = _reference_record(serve, reference, rec.get("backend", ""))
        if ref is None:
            raise ValueError(f"reference mode {reference!r} has no greedy outputs")
        ref_key, ref_rec = ref
        ref_out = [x["output"] for x in ref_rec["greedy"]]
        for kind in KINDS:
            if (key == ref_key and kind == "greedy") or not rec.get(kind):
                continue
            counts = 0
            for i, (r_out, row) in enumerate(zip(ref_out, rec[kind], strict=False)):
                if i >= len(prompts):
                    raise ValueError(
                        f"{key} {kind} has output {i} but prompts.jsonl only {len(prompts)} prompts"
                    )
                out = row["output"]
                p = first_divergence(r_out, out)
                if p is None:
                    counts += 1
                    continue
                divs.append(
                    Divergence(
                        mode=key,
                        backend=rec.get("backend", ""),
                        kind=kind,
                        prompt=i,
                        position=p,
                        prefix=tuple(prompts[i]) + tuple(r_out[:p]),
                        a=r_out[p] if p < len(r_out) else None,
                        b=out[p] if p < len(out) else None,
                    )
                )
            identical.setdefault(key, {})[kind] = counts
    return divs, identical


def summarise(judged: list, identical: dict[str, dict[str, int]]) -> dict:
    """Per mode and kind (greedy, greedy_parallel, seeded): identical / numerics / mismatch
    counts; ``lossless_explained``."""
    per: dict[str, dict[str, dict[str, int]]] = {}
    for m, kinds in identical.items():
        for k, n in kinds.items():
            per.setdefault(m, {})[k] = {"identical": n, "numerics": 0, "mismatch": 0}
    for j in judged:
        per[j.mode][j.kind][j.verdict] += 1
    mismatches = sum(c["mismatch"] for kinds in per.values() for c in kinds.values())
    return {
        "per_mode": per,
        "divergences": len(judged),
        "mismatches": mismatches,
        "lossless_explained": mismatches == 0,
    }


# ---- the forwards --------------------------------------------------------------------------


def load_targets(target_dir: Path, device: str):
    """The served target in float32 and in bfloat16 (the checkpoint is bf16: the fp32 copy is
    its exact upcast)."""
    import copy

    import torch
    from transformers import Qwen3ForCausalLM

    m = Qwen3ForCausalLM.from_pretrained(str(target_dir))
    m32 = m.to(device=device, dtype=torch.float32).eval()
    m16 = copy.deepcopy(m32).to(torch.bfloat16).eval()
    return m32, m16


def next_logits(
    model, prefixes: list[tuple[int, ...]], device: str, batch: int
) -> list[list[float]]:
    """Next-token logits (as fp32 lists) after each prefix. Right-padded batches of similar
    lengths: with causal attention a row's last real position never sees the padding; only
    that position goes through the lm_head."""
    import torch

    out: list[list[float] | None] = [None] * len(prefixes)
    order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
    with torch.no_grad():
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            width = max(len(prefixes[i]) for i in idx)
            ids = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(prefixes[i])] = torch.tensor(prefixes[i])
            ids = ids.to(device)
            h = model.model(input_ids=ids, use_cache=False).last_hidden_state
            last = torch.tensor([len(prefixes[i]) - 1 for i in idx], device=device)
            rows = model.lm_head(h[torch.arange(len(idx), device=device), last])
            for r, i in enumerate(idx):
                out[i] = rows[r].float().cpu().tolist()
    return out  # type: ignore[return-value]


def evidence(
    target_dir: Path, prefixes: list[tuple[int, ...]], device: str, batch: int
) -> dict[tuple[int, ...], Logits]:
    m32, m16 = load_targets(target_dir, device)
    l32 = next_logits(m32, prefixes, device, batch)
    l16 = next_logits(m16, prefixes, device, batch)
    return {p: Logits(a, b) for p, a, b in zip(prefixes, l32, l16, strict=True)}


# ---- CLI -----------------------------------------------------------------------------------


def merge_serves(docs: list[dict]) -> dict:
    """One results object whose ``serve`` (and ``seeded``) hold every file's modes (the same
    pair served in several calls: the reference from one, the other modes from the next). A
    mode key seen in an earlier file gets ``#<file number>`` appended, so nothing is dropped.
    Pure."""
    merged: dict = {"serve": {}, "seeded": {}}
    for n, doc in enumerate(docs, start=1):
        for group in merged:
            for key, rec in (doc.get(group) or {}).items():
                merged[group][key if key not in merged[group] else f"{key}#{n}"] = rec
    return merged


def _read_inputs(pair: Path, results_paths: list[Path]) -> tuple[dict, list[list[int]]]:
    if not (pair / "target" / "config.json").is_file():
        raise InputError(f"{pair}/target/config.json missing: not a real_drafter.train pair")
    if not (pair / "prompts.jsonl").is_file():
        raise InputError(f"{pair}/prompts.jsonl missing: not a real_drafter.train pair")
    docs = []
    for results_path in results_paths:
        if not results_path.is_file():
            raise InputError(f"{results_path}: no such results file (serve_pair's results.json)")
        try:
            results = json.loads(results_path.read_text())
        except json.JSONDecodeError as exc:
            raise InputError(f"{results_path}: unreadable JSON: {exc}") from None
        if not isinstance(results, dict) or not isinstance(results.get("serve"), dict):
            raise InputError(f"{results_path}: no 'serve' object (not serve_pair's results.json)")
        docs.append(results)
    try:
        prompts = [
            json.loads(line)["input_ids"]
            for line in (pair / "prompts.jsonl").read_text().splitlines()
            if line.strip()
        ]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"unreadable prompts.jsonl: {type(exc).__name__}: {exc}") from None
    return merge_serves(docs), prompts


def _generation_config(pair: Path) -> dict:
    """The target's generation_config.json ({} when absent); unreadable: InputError."""
    path = pair / "target" / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: unreadable JSON: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def run(args) -> dict:
    results, prompts = _read_inputs(args.pair, args.results)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        divs, identical = find_divergences(results, prompts, args.reference)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    try:
        sdivs, sidentical, unjudged = find_seeded_divergences(
            results, prompts, sampling_defaults(_generation_config(args.pair)))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    seeded = sglang_seeded_sampler() if sdivs else None
    prefixes = list(dict.fromkeys([d.prefix for d in divs] + [d.prefix for d in sdivs]))
    t0 = time.perf_counter()
    ev = evidence(args.pair / "target", prefixes, args.device, args.batch) if prefixes else {}
    seconds = time.perf_counter() - t0
    judged = [judge(d, ev[d.prefix]) for d in divs]
    judged += [judge_seeded(d, ev[d.prefix], seeded, device=args.device) for d in sdivs]
    for m, kinds in sidentical.items():
        identical.setdefault(m, {}).update(kinds)
    rep = {
        "pair": str(args.pair),
        "results": [str(r) for r in args.results],
        "reference": args.reference,
        "device": args.device,
        "top_eps": TOP_EPS,
        "rule": "numerics iff gap <= 2 * eps",
        "seeded_rule": "numerics iff the seeded sampler draws both a and b from the fp32 logits "
                       f"within eps (fp32, bf16, a/b pushed eps apart, {SEEDED_DRAWS} noisy; "
                       f"{SEEDED_SPREAD_DRAWS} more where they scatter and miss a or b)",
        "summary": summarise(judged, identical)
        | {"forwards": len(prefixes), "forward_seconds": round(seconds, 2),
           "seeded_unjudged": unjudged},
        "divergences": [asdict(j) for j in judged],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rep, indent=1))
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", type=Path, required=True, help="real_drafter.train's --out")
    ap.add_argument("--results", type=Path, action="append", required=True,
                    help="serve_pair's results.json (repeat: one pair served in several calls)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument(
        "--reference",
        default="none",
        help="the mode every other is compared with (key, mode or label)",
    )
    ap.add_argument("--batch", type=int, default=8, help="prefixes per forward")
    args = ap.parse_args(argv)
    try:
        rep = run(args)
    except InputError as exc:
        print(f"tie_margin: {exc}", file=sys.stderr)
        return 2
    s = rep["summary"]
    print(
        json.dumps(
            {
                "lossless_explained": s["lossless_explained"],
                "divergences": s["divergences"],
                "mismatches": s["mismatches"],
                "per_mode": s["per_mode"],
                "forward_seconds": s["forward_seconds"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
