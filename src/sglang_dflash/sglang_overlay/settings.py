"""The DDTree switch and its startup validation: pure functions, no SGLang or torch import.

DDTree is a mode of ``--speculative-algorithm DFLASH`` switched on by one environment variable,
so every ``is_dflash()`` branch in SGLang (memory sizing, aux-hidden capture, overlap scheduling)
keeps working. Everything here decides from plain values so it is testable anywhere; the SGLang
hooks in ``hooks.py`` feed it the resolved ``ServerArgs`` fields.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Every SGLANG_DFLASH_* environment variable the package reads or sets is named here, once;
# tests/overlay/test_settings_names.py fails on the literal name anywhere else in the package.
# The DDTree switch and its budget policy (``sglang-dflash serve`` sets both from the config).
BUDGET_ENV = "SGLANG_DFLASH_DDTREE_BUDGET"
POLICY_ENV = "SGLANG_DFLASH_DDTREE_POLICY"
# ``torch``: the torch tree builder on CUDA too (default ``auto``: the Triton kernel there).
IMPL_ENV = "SGLANG_DFLASH_DDTREE_IMPL"
# Decode steps in one no-draft round of the adaptive policy (default 8).
NODRAFT_STEPS_ENV = "SGLANG_DFLASH_DDTREE_NODRAFT_STEPS"
# ``1``: the no-draft (width-1) verify graphs plan FlashInfer without a host sync (fast_plan.py).
FAST_PLAN_ENV = "SGLANG_DFLASH_DDTREE_FAST_PLAN"
# ``bound``: SGLang does not copy each round's published lengths to the host before scheduling
# the next round (FutureMap.resolve_seq_lens_cpu, a host sync); the round's plans read the
# reserved bound instead (worker.spec_v2_attn_backends).
HOST_LENS_ENV = "SGLANG_DFLASH_DDTREE_HOST_LENS"
# ``1``: a tree verify's attention split in two: FlashInfer without a mask over the prefix, the
# tree block (W x W) in one Triton launch (ddtree/tree_attn_triton.py, hooks.split_verify).
SPLIT_VERIFY_ENV = "SGLANG_DFLASH_DDTREE_SPLIT_VERIFY"
# Test-only and diagnostic switches (sglang_overlay/diagnostics/): a plant file, a per-round
# profile file and its window, a first-round trace directory and its batch-size count.
PLANT_ENV = "SGLANG_DFLASH_DDTREE_PLANT"
PROFILE_ENV = "SGLANG_DFLASH_DDTREE_PROFILE"
PROFILE_EVERY_ENV = "SGLANG_DFLASH_DDTREE_PROFILE_EVERY"
TRACE_ENV = "SGLANG_DFLASH_DDTREE_TRACE"
TRACE_MAX_ENV = "SGLANG_DFLASH_DDTREE_TRACE_MAX"
# The file holding the router's API key, from ``sglang-dflash router`` to its child process.
ROUTER_KEY_FILE_ENV = "SGLANG_DFLASH_ROUTER_KEY_FILE"

# One CUDA thread per tree node in SGLang's tree kernels (reconstruct_indices_from_tree_mask,
# verify_tree_greedy) caps the verify width N+1 at 1024.
MAX_BUDGET = 1023

# Target attention backends that take an arbitrary FULL_MASK custom mask in TARGET_VERIFY,
# eagerly and under CUDA graphs; FA3/FA4/trtllm cannot take a tree mask there (docs/ddtree.md,
# "Refused at startup").
SUPPORTED_TARGET_BACKENDS = frozenset({"flashinfer", "triton"})


class DDTreeConfigError(ValueError):
    """A DDTree setting or combination SGLang cannot serve; the message is one line."""


@dataclass(frozen=True)
class DDTreeMode:
    """The resolved widths of one DDTree server.

    ``budget`` N is the number of draft nodes; the verify width is N+1 (root = bonus token).
    ``draft_width`` is the drafter's block: min(B, N+1), because a tree of N nodes is at most
    N deep, so drafting more than N positions is wasted work, and because SGLang reserves only
    2*(N+1) KV slots ahead per request: a draft block wider than N+1 could run past them.
    """

    budget: int
    block_size: int

    @property
    def verify_width(self) -> int:
        return self.budget + 1

    @property
    def draft_width(self) -> int:
        return min(self.block_size, self.budget + 1)

    @property
    def max_depth(self) -> int:
        return self.draft_width - 1


def parse_budget(raw: str | None) -> int | None:
    """The budget from the env value: None when unset/empty, else an int in 1..1023."""
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    try:
        value = int(text, 10)
    except ValueError:
        raise DDTreeConfigError(
            f"{BUDGET_ENV}={raw!r} is not an integer; set a node budget in 1..{MAX_BUDGET} "
            "or unset it for stock DFlash"
        ) from None
    if not 1 <= value <= MAX_BUDGET:
        raise DDTreeConfigError(
            f"{BUDGET_ENV}={value} is outside 1..{MAX_BUDGET} (verify width N+1 must be <= 1024)"
        )
    return value


def budget_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """Read and validate the switch; None means stock DFlash."""
    env = os.environ if environ is None else environ
    return parse_budget(env.get(BUDGET_ENV))


def policy_from_env(budget: int, environ: Mapping[str, str] | None = None):
    """The budget policy (``policy.PolicySpec``): fixed N unless SGLANG_DFLASH_DDTREE_POLICY
    says adaptive; a bad value is a one-line DDTreeConfigError."""
    from sglang_dflash.sglang_overlay import policy

    env = os.environ if environ is None else environ
    try:
        return policy.parse_policy(env.get(POLICY_ENV), budget, POLICY_ENV)
    except policy.PolicyError as exc:
        raise DDTreeConfigError(str(exc)) from None


# A no-draft round can run several plain decode steps, so SGLang's per-round speculative
# bookkeeping and the round's fixed stages (docs/gpu-results.md §20) are paid once per k
# tokens, not per token; capped by the draft width (the round's KV slots, the drafter's
# block). Default 8: on the H200 (docs/gpu-results.md §21) k = 8 was token-identical to no
# speculation (greedy on two planted regimes, seeded T > 0 at bs 1, 8, 32) and took 4.1-5.2
# ms a token where the one-step round took 5.9-9.0.
DEFAULT_NODRAFT_STEPS = 8
MAX_NODRAFT_STEPS = 64


def parse_nodraft_steps(raw: str | None) -> int:
    """``SGLANG_DFLASH_DDTREE_NODRAFT_STEPS``: 1..64, default 8; else a one-line error."""
    if raw is None or not raw.strip():
        return DEFAULT_NODRAFT_STEPS
    try:
        value = int(raw.strip())
    except ValueError:
        raise DDTreeConfigError(
            f"{NODRAFT_STEPS_ENV}={raw!r} is not an integer; set 1..{MAX_NODRAFT_STEPS} "
            f"(decode steps per no-draft round, default {DEFAULT_NODRAFT_STEPS})"
        ) from None
    if not 1 <= value <= MAX_NODRAFT_STEPS:
        raise DDTreeConfigError(
            f"{NODRAFT_STEPS_ENV}={value} is outside 1..{MAX_NODRAFT_STEPS} (decode steps per "
            "no-draft round)"
        )
    return value


# on by default since its H200 runs (docs/gpu-results.md §22): seeded T > 0 and greedy outputs
# token-identical with it, the host bound held in every checked round, the no-draft round 8 %
# cheaper
FAST_PLAN_MODES = {"": "on", "0": "off", "1": "on", "check": "check"}
SPLIT_VERIFY_MODES = {"": False, "0": False, "1": True}
# unset = ``auto``: the bound where no plan of the round splits its KV from host lengths (the
# Triton backend: H100 §26, a DDTree round 20-25 % cheaper at bs 1; real weights token-identical
# up to bf16 ties, §28/§29), exact lengths (sync) on FlashInfer: its split-KV plan lays out each
# row's partial outputs by the host length's chunk count while the kernel writes them by the
# device length's, so a bound above the device length mixes the rows of a multi-row forward
# (real weights, §29: wrong tokens in 2-7 of 8 prompts at N = 8 ... 64; the planted dummy-weight
# runs of §26/§28 could not see it)
HOST_LENS_MODES = {"": "auto", "sync": "sync", "bound": "bound"}


def _parse_switch(raw: str | None, name: str, modes: dict, expected: str):
    """A switch's value (``modes`` maps its spellings, unset = ``""``), else a one-line error
    naming what ``name`` takes."""
    value = modes.get((raw or "").strip())
    if value is None:
        raise DDTreeConfigError(f"{name}={raw!r}: expected {expected}")
    return value


def parse_fast_plan(raw: str | None) -> str:
    """``SGLANG_DFLASH_DDTREE_FAST_PLAN``: ``1`` on, ``check`` on and every round checks the
    host bound it plans from against the device lengths (one sync a round: for validation),
    ``1`` or unset on (the default), ``0`` off (FlashInfer's own plan, three host syncs a
    verify); else a one-line error."""
    return _parse_switch(raw, FAST_PLAN_ENV, FAST_PLAN_MODES,
                         "1 (on, the default), check (on, bounds checked every round) or 0 (off)")


def fast_plan_from_env(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return parse_fast_plan(env.get(FAST_PLAN_ENV))


def parse_host_lens(raw: str | None) -> str:
    """``SGLANG_DFLASH_DDTREE_HOST_LENS``: unset (``auto``: ``bound`` unless a FlashInfer
    backend plans the round, see ``resolve_host_lens``), ``bound`` (SGLang does not copy each
    round's lengths to the host; every plan of the round reads the reserved upper bound SGLang
    keeps there, so the host builds the next round while the GPU runs this one), ``sync``
    (SGLang copies every round's published lengths to the host and waits for them before it
    schedules the next round: what it does for DFLASH); else a one-line error."""
    return _parse_switch(raw, HOST_LENS_ENV, HOST_LENS_MODES,
                         "unset (auto), bound (no per-round copy of the lengths; with FlashInfer "
                         "only with the drafter on another backend) or sync")


def host_lens_from_env(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return parse_host_lens(env.get(HOST_LENS_ENV))


FLASHINFER_BOUND_REASON = (
    f"{HOST_LENS_ENV}=bound with FlashInfer attention: FlashInfer's split-KV plan must read "
    "each forward's exact kv lengths (planned from a bound, its merge reads other rows' partial "
    "outputs and a tree verify commits wrong tokens, docs/gpu-results.md §29); the tree verify "
    "can be padded to the bound, the drafter's block forward cannot: {why}; leave it unset "
    "(sync on FlashInfer) or use --attention-backend triton")


# The padded verify's server settings (docs/ddtree.md "A padded verify"): the bound on a
# FlashInfer target with the drafter's attention on Triton (its block forward has no mask to pad
# with; Triton is the backend it was validated with on real weights, gpu-results.md §34). The
# benchmarks that start such servers (serve_pair ``+pad``, adaptive_grid --padded-verify) read
# them here, so the rule is spelled once.
PADDED_VERIFY_DRAFT_BACKEND = "triton"


def padded_verify_env() -> dict[str, str]:
    """The environment a padded-verify server adds (a new dict each call)."""
    return {HOST_LENS_ENV: "bound"}


def flashinfer_bound_refusal(draft_flashinfer: bool | None, fast_plan: str,
                             split_verify: bool) -> str | None:
    """Why ``bound`` cannot run with a FlashInfer target (one line), or None: the padded
    verify needs the sync-free plan (it builds the padded layout) and the masked verify (the
    split one attends the prefix without a mask), and the drafter planned elsewhere."""
    if draft_flashinfer is not False:
        why = ("the drafter's attention is FlashInfer too (set --speculative-draft-attention-"
               "backend triton, draftAttentionBackend = \"triton\")")
    elif fast_plan == "off":
        why = f"{FAST_PLAN_ENV}=0 plans FlashInfer from SGLang's own host lengths"
    elif split_verify:
        why = f"{SPLIT_VERIFY_ENV}=1 attends the prefix without a mask"
    else:
        return None
    return FLASHINFER_BOUND_REASON.format(why=why)


# The server arguments that name an attention backend a DDTree round plans with (sglang
# 0.5.17): the launcher reads them from server_args, the instance config as their flags
# (``--attention-backend`` ...), the live check from /server_info, which lists server_args by
# these names.
TARGET_ATTENTION_ARGS = ("attention_backend", "prefill_attention_backend",
                         "decode_attention_backend")
DRAFT_ATTENTION_ARG = "speculative_draft_attention_backend"  # unset: the target's (above)
ATTENTION_BACKEND_ARGS = (*TARGET_ATTENTION_ARGS, DRAFT_ATTENTION_ARG)


# where SGLang's composite backends keep the ones they dispatch to (HybridAttnBackend: a prefill
# and a decode backend, e.g. --prefill-attention-backend triton with flashinfer decode)
INNER_BACKEND_FIELDS = ("prefill_backend", "decode_backend", "backend")


def is_flashinfer_backend(backend: Any, depth: int = 0) -> bool:
    """Whether ``backend`` is SGLang's FlashInfer attention backend (or a subclass), or a
    composite one dispatching to it: the one whose plans split the KV by host lengths."""
    if any(c.__name__.startswith("FlashInfer") for c in type(backend).__mro__):
        return True
    return depth < 3 and any(is_flashinfer_backend(getattr(backend, f, None), depth + 1)
                             for f in INNER_BACKEND_FIELDS if getattr(backend, f, None)
                             is not None)


def resolve_host_lens(host_lens: str, fast_plan: str, flashinfer: bool = False,
                      draft_flashinfer: bool | None = None, split_verify: bool = False) -> str:
    """The host-lengths mode a round runs; ``flashinfer``: a FlashInfer backend plans its
    target or drafter forwards (``draft_flashinfer``: the drafter's, None = unknown, taken as
    FlashInfer). ``bound`` rests on the sync-free plan (every plan reads the round's own bound)
    and on no plan splitting its KV by host lengths the device does not share: FlashInfer's
    does (its merge then mixes the rows of a tree verify or a draft block, §29), so unset means
    ``sync`` there. An explicit ``bound`` runs with a FlashInfer target when the verify can be
    padded to the bound (``flashinfer_bound_refusal``: the drafter elsewhere, the sync-free
    masked verify): the device kv lengths are the bound too, the slots past the tree masked
    (docs/ddtree.md, "A padded verify"); otherwise it is a one-line DDTreeConfigError. With
    ``FAST_PLAN=0`` FlashInfer plans itself from SGLang's host lengths, so it is ``sync``."""
    if host_lens == "bound" and flashinfer:
        why = flashinfer_bound_refusal(draft_flashinfer, fast_plan, split_verify)
        if why is not None:
            raise DDTreeConfigError(why)
        return "bound"
    if fast_plan == "off" or flashinfer:
        return "sync"
    return "sync" if host_lens == "sync" else "bound"


def host_lens_line(host_lens: str, fast_plan: str, flashinfer: bool = False) -> str:
    """The start-up log line naming the round's host-lengths mode (and why it is ``sync``)."""
    if host_lens == "bound":
        padded = (" the tree verify padded to it on FlashInfer, its slots past the tree masked;"
                  if flashinfer else "")
        return ("DDTree host lengths: bound (SGLang does not copy each round's lengths to the "
                f"host; every plan reads the reserved bound;{padded} a width-1 verify as is).")
    if fast_plan == "off":
        why = "FAST_PLAN=0: FlashInfer plans from SGLang's host lengths"
    elif flashinfer:
        why = "FlashInfer's split-KV plans need each forward's exact lengths"
    else:
        why = f"{HOST_LENS_ENV}=sync"
    return f"DDTree host lengths: sync ({why}; SGLang copies each round's lengths to the host)."


def parse_split_verify(raw: str | None) -> bool:
    """``SGLANG_DFLASH_DDTREE_SPLIT_VERIFY``: ``1`` on, ``0`` or unset off (the default: on the
    H200 it is the same softmax as the masked verify but rounds differently, so seeded T > 0
    outputs stop matching plain decoding, docs/gpu-results.md §22); else a one-line error."""
    return _parse_switch(raw, SPLIT_VERIFY_ENV, SPLIT_VERIFY_MODES,
                         "1 (on) or 0 (off, the default)")


def split_verify_from_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return parse_split_verify(env.get(SPLIT_VERIFY_ENV))


def nodraft_steps_from_env(draft_width: int, environ: Mapping[str, str] | None = None) -> int:
    """Decode steps per no-draft round: the setting, capped by the draft width."""
    env = os.environ if environ is None else environ
    return max(1, min(parse_nodraft_steps(env.get(NODRAFT_STEPS_ENV)), int(draft_width)))


def check_switches(environ: Mapping[str, str], flashinfer: bool,
                   draft_flashinfer: bool | None = None) -> None:
    """Every DDTree switch ``environ`` sets, parsed as the worker parses it, and the
    host-lengths rule for a server whose flags select FlashInfer attention (``flashinfer``;
    ``draft_flashinfer``: for the drafter, None = unknown): the launcher
    (``hooks.handle_dflash``) and the instance config (``config.parse_config``) ask this one
    function. A bad value is a one-line DDTreeConfigError."""
    nodraft_steps_from_env(1, environ)
    split = split_verify_from_env(environ)
    resolve_host_lens(host_lens_from_env(environ), fast_plan_from_env(environ), flashinfer,
                      draft_flashinfer, split)


def draft_is_flashinfer(target_backends: set, draft_backend: str | None) -> bool:
    """Whether the drafter's forwards run FlashInfer attention: its own backend when the server
    names one (``--speculative-draft-attention-backend``), else the target's (SGLang builds the
    drafter's backend from the target's flags then)."""
    if draft_backend:
        return draft_backend == "flashinfer"
    return "flashinfer" in target_backends


def is_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the switch is set at all (even to an invalid value, which must fail later)."""
    env = os.environ if environ is None else environ
    return bool(env.get(BUDGET_ENV, "").strip())


@dataclass(frozen=True)
class TargetFacts:
    """The ServerArgs fields that decide whether DDTree can run (after SGLang resolved them)."""

    attention_backend: str | None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    page_size: int | None = 1
    pp_size: int = 1
    enable_dp_attention: bool = False
    draft_window_size: int | None = None
    speculative_num_draft_tokens: int | None = None
    split_verify: bool = False


def unsupported_reason(facts: TargetFacts, budget: int) -> str | None:
    """The one-line reason this combination cannot run DDTree, or None when it can."""
    backends = {
        "--attention-backend": facts.attention_backend,
        "--prefill-attention-backend": facts.prefill_attention_backend,
        "--decode-attention-backend": facts.decode_attention_backend,
    }
    for flag, value in backends.items():
        if value is not None and value not in SUPPORTED_TARGET_BACKENDS:
            return (
                f"DDTree ({BUDGET_ENV}={budget}) needs a target attention backend that takes a "
                f"tree mask (flashinfer or triton); {flag} is {value}"
            )
    if facts.attention_backend is None:
        return (
            f"DDTree ({BUDGET_ENV}={budget}) needs --attention-backend flashinfer or triton "
            "(none was resolved)"
        )
    if facts.page_size not in (None, 1):
        return f"DDTree ({BUDGET_ENV}={budget}) supports only --page-size 1, got {facts.page_size}"
    if facts.pp_size != 1:
        return f"DDTree ({BUDGET_ENV}={budget}) needs --pp-size 1, got {facts.pp_size}"
    if facts.enable_dp_attention:
        return f"DDTree ({BUDGET_ENV}={budget}) does not support --enable-dp-attention"
    if facts.draft_window_size is not None:
        return (
            f"DDTree ({BUDGET_ENV}={budget}) does not support --speculative-draft-window-size "
            "yet; drop it"
        )
    if facts.split_verify and "triton" in {v for v in backends.values() if v is not None}:
        return (
            f"{SPLIT_VERIFY_ENV}=1 splits FlashInfer's verify attention; the target runs "
            "triton attention: use --attention-backend flashinfer or unset it"
        )
    n = facts.speculative_num_draft_tokens
    if n is not None and int(n) != budget + 1:
        return (
            f"DDTree sets --speculative-num-draft-tokens to the verify width N+1={budget + 1}; "
            f"got {n}. Drop it and set the draft block with --speculative-dflash-block-size"
        )
    return None


def hybrid_target_reason(budget: int, model_arch: str) -> str:
    """The one-line reason for a hybrid recurrent (Mamba/GDN) target."""
    return (
        f"DDTree ({BUDGET_ENV}={budget}) does not support hybrid recurrent targets "
        f"(Mamba/GDN: {model_arch}); their state commit is linear-chain only"
    )


# ---- FlashInfer workspace for wide tree verifies ---------------------------------------------

MIB = 1 << 20


def _fa2_cta_tile_q(packed_qo_len: int, head_dim: int) -> int:
    """FlashInfer 0.6.15's ``FA2DetermineCtaTileQ`` (utils.cuh) on sm80+."""
    if head_dim >= 512:
        return 16 if packed_qo_len <= 32 else 32
    if packed_qo_len > 64 and head_dim < 256:
        return 128
    return 64 if packed_qo_len > 16 else 16


def flashinfer_verify_float_bytes(
    bs: int, width: int, *, qo_heads: int, kv_heads: int, head_dim: int, num_sm: int
) -> int:
    """Float workspace FlashInfer's prefill plan takes for a CUDA-graph verify of bs x width.

    Mirrors ``PrefillSplitQOKVIndptr``/``PrefillPlan`` (scheduler.cuh, flashinfer 0.6.15) with
    split-KV on: ``tmp_v`` + ``tmp_s`` = qo_heads x padded_batch x cta_tile_q x (head_dim + 1)
    floats, padded_batch = max(2 x SMs // kv_heads, tiles). A tree verify is wide (N+1 rows per
    request), so at N=256 and bs=32 on an H200 this is 581 MiB: more than the 512 MiB SGLang
    fixes for Qwen targets, so CUDA-graph capture fails without the larger workspace.
    """
    gqa = max(1, qo_heads // max(1, kv_heads))
    rows = bs * width
    cta = _fa2_cta_tile_q((rows - bs + 1) * gqa, head_dim)
    tiles = -(-rows * gqa // cta) + bs - 1
    padded = max((2 * num_sm) // max(1, kv_heads), tiles)
    tmp_v = qo_heads * padded * cta * head_dim * 4
    tmp_s = qo_heads * padded * cta * 4
    return -(-tmp_v // 16) * 16 + -(-tmp_s // 16) * 16


def flashinfer_workspace_bytes(current: int, need: int, headroom: int = 64 * MIB) -> int:
    """The workspace to use: SGLang's own size unless the verify needs more (then need+headroom,
    rounded up to a MiB)."""
    if need <= current:
        return current
    return -(-(need + headroom) // MIB) * MIB
