"""``DDTreeWorkerV2``: DFlash's spec-v2 worker with a draft tree instead of a draft chain.

One decode round: the DFlash drafter runs its usual non-causal block of width B (the draft
width), the head keeps per-depth top-K log-probs instead of the argmax, the DDTree core builds
the N-node tree on the GPU, the target verifies all N+1 nodes in one TARGET_VERIFY forward
with a FULL_MASK tree mask, the accepted path is walked (``verify_tree_greedy``), its target KV
is moved to the linear slots ``prefix..prefix+commit-1`` and the drafter's KV for the committed
tokens is written from the target hidden states gathered along that path. Prefill, idle
batches, memory pools and CUDA-graph setup are DFlash's own (``super()``).

Imports SGLang: only loaded inside an SGLang process (``create_worker`` hook).
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from sglang.kernels.ops.attention.utils import create_flashinfer_kv_indices_triton
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.kernels.ops.speculative.dflash import _prepare_dflash_draft_block_unchecked
from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.distributed import get_tp_group
from sglang.srt.environ import envs
from sglang.srt.layers.sampler import multinomial_with_seed
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.runtime_context import get_exec
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.draft_worker_common import (
    build_block_pos_offsets,
    make_draft_block_spec_info,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import (
    SIMULATE_ACC_LEN,
    move_accept_tokens_to_target_kvcache,
)
from sglang.srt.utils import is_cuda, is_hip

from sglang_dflash.ddtree.tree import (
    build_tree,
    triton_module,
    use_triton,
    verify_kernels,
    warm_up_inputs,
)
from sglang_dflash.sglang_overlay import adaptive as adaptive_mod
from sglang_dflash.sglang_overlay import fast_plan, settings, split_verify
from sglang_dflash.sglang_overlay import policy as policy_mod
from sglang_dflash.sglang_overlay.draft_head import DraftTopKHead, draft_topk
from sglang_dflash.sglang_overlay.round_steps import RoundSteps
from sglang_dflash.sglang_overlay.timing import stage_ranges
from sglang_dflash.sglang_overlay.verify import (
    PinnedRing,
    RootRound,
    build_verify_tensors,
    gather_accepted_rows,
    greedy_accept,
    per_node_targets,
    plan_bound,
    seeded_node_targets,
    use_fused_renorm,
    verify_slots,
    warm_up_renorm,
)

logger = logging.getLogger(__name__)


class _Drafted(NamedTuple):
    """The draft stage's output: per-depth top-K (None for a budget-0 round) and the block."""

    logp: Any
    ids: Any
    block_ids: Any
    positions_2d: Any
    cache_loc_2d: Any

# Rounds between two log lines of the adaptive policy's state (rank 0).
POLICY_LOG_EVERY = 500


def _renorm_kernels(sampling_backend, device):
    """sgl_kernel's top-k / top-p renormalisation, built now; None = torch filtering.

    The kernels are FlashInfer's, JIT-compiled on first use: warming them up here puts that
    build (a minute or more on a cold cache) in start-up, not in the first T > 0 decode round,
    where it would stall the scheduler silently. ``--sampling-backend pytorch`` keeps
    them out.
    """
    if not use_fused_renorm(sampling_backend, is_cuda()):
        return None
    try:
        from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob
    except ImportError:
        return None
    renorm = (top_k_renorm_prob, top_p_renorm_prob)
    t0 = time.monotonic()
    try:
        warm_up_renorm(renorm, device)
        torch.cuda.synchronize(device)
    except Exception as exc:  # e.g. no nvcc for the JIT build: T > 0 still works, in torch
        logger.warning("DDTree T>0 renorm kernels unavailable (%s); using torch filtering.",
                       str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    logger.info("DDTree T>0 renorm kernels ready in %.1f s.", time.monotonic() - t0)
    return renorm


_UNRESOLVED = object()  # a lazily resolved attribute's "not yet"


def load_compaction(kv_pool):
    """(pool, kv_compact_triton) where the one-launch compaction serves ``kv_pool`` (the
    target's), else None."""
    pool = compaction_pool(kv_pool)
    if pool is None or not use_triton(pool.data_ptrs):
        return None
    kernel = triton_module("sglang_dflash.ddtree.kv_compact_triton")
    return None if kernel is None else (pool, kernel)


def compaction_pool(pool):
    """``pool`` when its KV move is ``MHATokenToKVPool``'s own tiled copy (base pointers and
    bytes per slot: what ``kv_compact_triton`` addresses), else None (SGLang's move then).

    A subclass that moves differently (page-major, scale buffers by hand, MLA, hybrid pools),
    the HND layout and SGLANG_NATIVE_MOVE_KV_CACHE all keep SGLang's path."""
    try:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    except ImportError:
        return None
    cls = type(pool)
    if (
        not isinstance(pool, MHATokenToKVPool)
        or cls.move_kv_cache is not MHATokenToKVPool.move_kv_cache
        or cls._move_kv_cache_impl is not MHATokenToKVPool._move_kv_cache_impl
        or getattr(pool, "use_hnd", True)
        or getattr(pool, "use_native_move_kv_cache", True)
        or getattr(pool, "_kv_copy_config", None) is None
        or not getattr(pool, "layer_num", 0)
        or getattr(pool, "data_ptrs", None) is None
    ):
        return None
    return pool


def _req_lengths(batch) -> list[tuple[object, int, int | None]]:
    """(rid, output tokens the host has seen, max_new_tokens) of each request: what
    ``RoundSteps`` needs to cut a no-draft round to the tokens some request still keeps."""
    return [(r.rid, len(r.output_ids), r.sampling_params.max_new_tokens) for r in batch.reqs]


def _timing_event_factory():
    """Timing events for the profiler and the adaptive meter: CUDA events, host clocks off GPU."""
    if is_cuda():
        return lambda: torch.cuda.Event(enable_timing=True)
    return adaptive_mod.HostEvent


def _tree_kernel():
    """SGLang's ``verify_tree_greedy`` dispatcher on CUDA/HIP; None = torch walk."""
    if is_cuda() or is_hip():
        from sglang.srt.speculative.eagle_utils import verify_tree_greedy_func

        return verify_tree_greedy_func
    return None


def seeded_sampling(sampling_info) -> bool:
    """Per-request seeds are set (SGLang does so under --enable-deterministic-inference).

    Min-p with a seed is refused by SGLang's own sampler (an assertion); DDTree then draws
    unseeded, as it does without a seed."""
    return (
        getattr(sampling_info, "sampling_seed", None) is not None
        and not sampling_info.need_min_p_sampling
    )


class DDTreeVerifyInput(DFlashVerifyInput):
    """A DFlash verify input that carries a tree: FULL_MASK plus LCRS links.

    Keeps ``spec_input_type == DFLASH_VERIFY`` so FlashInfer/Triton take the DFlash verify path
    (``generate_attn_arg_prefill`` pads FULL_MASK exactly as DDTree lays it out). The tree is
    irregular and node-budgeted, like NGRAM's: ``tree_topk = -1``.
    """

    tree: Any = None
    # [bs, W, W] bool: the tree's visibility when the verify's attention is split
    # (SGLANG_DFLASH_DDTREE_SPLIT_VERIFY=1); then custom_mask is None
    split_visibility: Any = None
    # [bs] int64 on the device: the padded verify's prefix lengths P (the host bound - W),
    # when the round plans FlashInfer from the bound (custom_mask is then the padded layout)
    padded_lens: Any = None

    def generate_attn_arg_prefill(self, req_pool_indices, paged_kernel_lens,
                                  paged_kernel_lens_sum, req_to_token, kv_start_idx=None):
        """FlashInfer's verify layout. Split: the paged attention covers each request's prefix
        alone (no mask; the W tree keys come from the tree block, ``hooks.split_verify``);
        padded: DFlash's over the padded prefixes P (kv lengths P + W = the host bound the plan
        reads, the slots past the tree masked); otherwise DFlash's, prefix + W with the tree's
        FULL_MASK."""
        if self.split_visibility is None:
            lens = paged_kernel_lens
            if self.padded_lens is not None:
                # a graph replay pads the batch to its captured size with SGLang's fill
                # lengths, on the host too: those rows keep them
                n = self.padded_lens.numel()
                lens = self.padded_lens if n >= len(req_pool_indices) else torch.cat(
                    [self.padded_lens, paged_kernel_lens[n:].to(self.padded_lens.dtype)])
            return super().generate_attn_arg_prefill(
                req_pool_indices, lens, paged_kernel_lens_sum, req_to_token,
                kv_start_idx=kv_start_idx)
        device, bs, width = req_pool_indices.device, len(req_pool_indices), self.draft_token_num
        qo_indptr = torch.arange(0, (bs + 1) * width, step=width, dtype=torch.int32,
                                 device=device)
        cum_kv = torch.zeros((bs + 1,), dtype=torch.int32, device=device)
        cum_kv[1:] = torch.cumsum(paged_kernel_lens, dim=0)
        # paged_kernel_lens_sum is the host bound of the prefixes plus W each: room to spare
        kv_indices = torch.empty(int(paged_kernel_lens_sum) + width * bs, dtype=torch.int32,
                                 device=device)
        create_flashinfer_kv_indices_triton[(bs,)](
            req_to_token, req_pool_indices, paged_kernel_lens, cum_kv, kv_start_idx,
            kv_indices, req_to_token.size(1),
        )
        return kv_indices, cum_kv, qo_indptr, None

    @property
    def max_tree_depth(self) -> int:
        return int(self.tree.max_depth) + 1 if self.tree is not None else 1

    @property
    def tree_topk(self) -> int:
        return -1


@dataclass(frozen=True)
class PlansFromBound:
    """An attention backend as SGLang's ``decide_needs_cpu_seq_lens`` reads it (the one field
    it reads) when every plan of a DDTree round comes from a host bound the round sets itself
    (``SGLANG_DFLASH_DDTREE_HOST_LENS=bound``, the default)."""

    backend: Any
    needs_cpu_seq_lens: bool = False


class DDTreeWorkerV2(DFlashWorkerV2):
    """DFlash spec-v2 worker in DDTree mode (``SGLANG_DFLASH_DDTREE_BUDGET`` set)."""

    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker):
        budget = settings.budget_from_env()
        if budget is None:
            raise settings.DDTreeConfigError(
                f"DDTreeWorkerV2 needs {settings.BUDGET_ENV}; SGLang created it without"
            )
        arch = mambaish_config(target_worker.model_runner.model_config)
        if arch is not None:
            raise settings.DDTreeConfigError(
                settings.hybrid_target_reason(budget, type(arch).__name__)
            )
        super().__init__(server_args, gpu_id, ps, nccl_port, target_worker)
        block = server_args.speculative_dflash_block_size or self.block_size
        self.ddtree = settings.DDTreeMode(budget=budget, block_size=int(block))
        if int(server_args.speculative_num_draft_tokens) != self.ddtree.verify_width:
            raise settings.DDTreeConfigError(
                f"DDTree expected speculative_num_draft_tokens={self.ddtree.verify_width}, got "
                f"{server_args.speculative_num_draft_tokens}: the sglang-dflash plugin's "
                "argument hook did not run in the launcher"
            )
        # DFlash sized its block state from speculative_num_draft_tokens (= N+1 here);
        # the drafter's block is the draft width B instead.
        self.block_size = self.ddtree.draft_width
        self.speculative_num_draft_tokens = self.ddtree.draft_width
        self._block_pos_offsets = build_block_pos_offsets(
            length=self.block_size, device=self.device
        )
        self._draft_block_spec_info = make_draft_block_spec_info(
            draft_token_num=self.block_size, device=self.device
        )
        self._verify_kernel = _tree_kernel()
        self._renorm = _renorm_kernels(getattr(server_args, "sampling_backend", None),
                                       self.device)
        self._topk_head: DraftTopKHead | None = None
        vocab = int(target_worker.model_runner.model_config.vocab_size)
        self._topk_k = min(budget, vocab)
        self._policy_spec = settings.policy_from_env(budget)
        self._policy = None
        self._budgets: tuple[int, ...] = (budget,)
        # a no-draft round's decode steps (adaptive policy only: a fixed budget never falls
        # back); the policy counts them as budget 0's accept length
        self._nodraft_steps = settings.nodraft_steps_from_env(self.ddtree.draft_width)
        self._fast_plan = settings.fast_plan_from_env()  # "off" | "on" | "check"
        self._split_verify = settings.split_verify_from_env()
        self._init_host_lens()
        self._plan_checks = self._plan_violations = 0  # rounds checked, bounds below the device
        self._round_steps: RoundSteps | None = None  # no-draft rounds cut to what is kept
        if self._policy_spec.adaptive:
            self._policy = policy_mod.AdaptivePolicy(self._policy_spec.schedule,
                                                     nodraft_tokens=self._nodraft_steps)
            self._budgets = self._policy_spec.schedule.budgets()
            if self._nodraft_steps > 1:  # SGLang processes a round after launching the next
                overlap = not getattr(server_args, "disable_overlap_schedule", False)
                self._round_steps = RoundSteps(self._nodraft_steps, overlap=overlap)
        # budget -> (target attention backend, target CUDA-graph runner); filled in
        # init_cuda_graphs. The server's own pair (width N+1) is the largest budget's.
        self._targets: dict[int, tuple[Any, Any]] = {}
        self._graph_bs: list[int] = []
        self._meter = self._load_meter()
        self._budget_tensors: dict[tuple[int, int], tuple[tuple[int, ...], Any, Any]] = {}
        self._root_rounds: dict[int, RootRound] = {}
        self._active_budget = budget
        self._policy_rounds = 0
        self._seen_rids: set = set()  # requests a top-budget round has measured
        # (perf_counter, slot, budget, first round after a prefill)
        self._wall_prev: tuple[float, int, int, bool] | None = None
        self._after_prefill = False
        # (pool, kernel) | None once resolved: the target's KV pool exists only after
        # SGLang's Scheduler.init_memory_pools, which runs after this constructor.
        self._compaction = _UNRESOLVED
        self._plant = self._load_plant()
        self._device_plant = None  # built at the first planted round, on the draft's device
        self._plant_keys: dict = {}  # rid -> (prompt ids, prompt length), for the plant
        self._prof = self._load_profiler(budget)
        self._tracer = self._load_tracer()
        self._warm_up_tree()
        self._warm_up_plant()
        if SIMULATE_ACC_LEN > 0:
            logger.warning("SGLANG_SIMULATE_ACC_LEN is ignored in DDTree mode (chain-only).")
        if self.ps.tp_rank == 0:
            logger.info(
                "DDTree mode: budget N=%d, verify width %d, draft width %d, top-K %d, "
                "policy %s.",
                budget,
                self.ddtree.verify_width,
                self.block_size,
                self._topk_k,
                self._policy_spec.describe(),
            )

    # ---- setup ---------------------------------------------------------------------------

    def _warm_up_tree(self):
        """Build one dummy tree now, so the Triton builder (and the fused verify mask and
        accept tail, per width) compile at start-up.

        Uncompiled, the first decode round paid it (0.6-0.8 s on the H200, cold cache:
        docs/gpu-results.md §8). One compile serves every batch size (the kernel does not
        specialise on bs).
        """
        t0 = time.monotonic()
        kernels = verify_kernels() if is_cuda() else None
        for n in self._budgets:  # one compile per (L, budget)
            if n > 0:
                build_tree(*warm_up_inputs(self.ddtree.max_depth, self._topk_k, self.device), n)
                if kernels is not None:  # the verify mask and accept tail at this width
                    kernels.warm_up(n + 1, self.ddtree.max_depth, self.device)
        if is_cuda():
            torch.cuda.synchronize(self.device)
        logger.info("DDTree tree builder ready in %.2f s.", time.monotonic() - t0)

    def _compaction_kernel(self):
        """(pool, kv_compact_triton) where the one-launch KV compaction serves this server
        (``compaction_pool``, a GPU pool, triton, not SGLANG_DFLASH_DDTREE_IMPL=torch), else
        None: SGLang's move then. Resolved once, at the first call after SGLang allocated the
        target's pool (``init_cuda_graphs``' warm-up, or the first round); before that the
        allocator is None and so is the answer."""
        if self._compaction is _UNRESOLVED:
            allocator = self.model_runner.token_to_kv_pool_allocator
            if allocator is None:
                return None
            self._compaction = load_compaction(allocator.get_kvcache())
        return self._compaction

    def _warm_up_compaction(self):
        """Compile the KV compaction kernel now: a one-request batch whose only accepted node
        is the root, which moves nothing (slot 0, the pool's padding slot, is all it reads)."""
        compaction = self._compaction_kernel()
        if compaction is None:
            return
        pool, kernel = compaction
        dev = self.device
        idx = torch.full((1, self.ddtree.max_depth + 1), -1, dtype=torch.int32, device=dev)
        idx[:, 0] = 0
        zeros = torch.zeros(1, dtype=torch.long, device=dev)
        kernel.compact_triton(
            pool.data_ptrs, pool.data_strides, pool._kv_copy_config,
            torch.zeros(self.ddtree.verify_width, dtype=torch.long, device=dev),
            self.model_runner.req_to_token_pool.req_to_token, zeros, zeros, idx,
            torch.zeros(1, dtype=torch.int32, device=dev), self.ddtree.verify_width,
        )
        torch.cuda.synchronize(dev)

    def _warm_up_plant(self):
        """TEST-ONLY: compile the plant's Triton kernel now (float32 log-probs, int64 ids: the
        top-K head's), not in the first planted round."""
        if self._plant is None or not is_cuda():
            return
        from sglang_dflash.sglang_overlay.diagnostics import plant as plant_mod

        self._device_plant = plant_mod.DevicePlant(self._plant, self.device)
        depth, k, dev = self.ddtree.max_depth, self._topk_k, self.device
        zeros = torch.zeros(1, dtype=torch.long, device=dev)
        self._device_plant.apply(torch.tensor([[-1, 0]], device=dev), zeros, zeros,
                                 torch.zeros((1, depth, k), dtype=torch.float32, device=dev),
                                 torch.zeros((1, depth, k), dtype=torch.long, device=dev))
        torch.cuda.synchronize(self.device)

    def _load_meter(self):
        """Round counters for the adaptive policy (None with a fixed budget)."""
        if self._policy is None:
            return None
        return adaptive_mod.RoundMeter(_timing_event_factory(), pin=is_cuda())

    def _load_plant(self):
        path = os.environ.get(settings.PLANT_ENV, "").strip()
        if not path:
            return None
        from sglang_dflash.sglang_overlay.diagnostics import plant as plant_mod

        spec = plant_mod.load_plant(path)
        logger.warning(
            "!!! %s=%s: TEST-ONLY PLANTED DRAFT SOURCE ACTIVE. The drafter's proposals are "
            "being overwritten (%d planted requests). Never run this in production. !!!",
            settings.PLANT_ENV,
            path,
            len(spec.requests),
        )
        return spec

    def _load_profiler(self, budget):
        """Per-round stage timing when SGLANG_DFLASH_DDTREE_PROFILE names a file (rank 0)."""
        if self.ps.tp_rank != 0 or not os.environ.get(settings.PROFILE_ENV, "").strip():
            return None
        from sglang_dflash.sglang_overlay.diagnostics import profile as profile_mod

        factory = _timing_event_factory()
        prof = profile_mod.from_env(
            event_factory=factory,
            extra={"budget": budget, "draft_width": self.ddtree.draft_width,
                   "plant": self._plant is not None},
        )  # fmt: skip
        if prof is not None:
            logger.warning(
                "DDTree per-round profiling to %s every %d rounds (%s).",
                prof.path,
                prof.every,
                profile_mod.PROFILE_ENV,
            )
        return prof

    def _load_tracer(self):
        """First-round torch.profiler tables when SGLANG_DFLASH_DDTREE_TRACE names a dir."""
        if self.ps.tp_rank != 0 or not os.environ.get(settings.TRACE_ENV, "").strip():
            return None
        from sglang_dflash.sglang_overlay.diagnostics import trace as trace_mod

        tracer = trace_mod.from_env()
        if tracer is not None:
            logger.warning(
                "DDTree first-round tracing to %s for up to %d batch sizes (%s).",
                tracer.directory,
                tracer.limit,
                trace_mod.TRACE_ENV,
            )
        return tracer

    def _lm_head_shard(self):
        """(weight, num_org, vocab_start) of the target LM head, or a one-line error."""
        lm_head = getattr(self._target_worker.model_runner.model, "lm_head", None)
        if lm_head is None or not hasattr(lm_head, "weight"):
            raise settings.DDTreeConfigError("DDTree needs a target model with lm_head.weight")
        if not torch.is_floating_point(lm_head.weight):
            raise settings.DDTreeConfigError("DDTree does not support a quantized target lm_head")
        if hasattr(lm_head, "shard_indices"):
            shard = lm_head.shard_indices
            if int(shard.num_added_elements) != 0:
                raise settings.DDTreeConfigError("DDTree does not support added vocabulary")
            return lm_head.weight, int(shard.num_org_elements), int(shard.org_vocab_start_index)
        if get_tp_group().world_size != 1:
            raise settings.DDTreeConfigError("DDTree with tp>1 needs a vocab-parallel lm_head")
        return lm_head.weight, int(lm_head.weight.shape[0]), 0

    def _maybe_build_draft_sampler(self):
        """Fold the top-K head (not DFlash's argmax) into the draft CUDA graph."""
        if envs.SGLANG_DFLASH_EAGER_DRAFT_SAMPLER.get() or self.block_size <= 1:
            return None
        weight, num_org, vocab_start = self._lm_head_shard()
        tp_group = get_tp_group()
        self._topk_head = DraftTopKHead(
            weight=weight,
            block_size=self.block_size,
            k=self._topk_k,
            num_org=num_org,
            vocab_start=vocab_start,
            max_bs=max(get_exec().graph.cuda_graph_config.decode.bs),
            tp_group=tp_group if tp_group.world_size > 1 else None,
        )
        return self._topk_head

    @property
    def spec_v2_attn_backends(self) -> tuple:
        """The attention backends SGLang ORs into ``needs_cpu_seq_lens`` once, at start-up.
        FlashInfer's says yes, so before each round the scheduler copies the lengths the last
        round published to the host and waits for them (``FutureMap.resolve_seq_lens_cpu``):
        a tree round publishes after its accept, so the host cannot build the next round
        while the GPU runs this one (H200 §25: 5.0 ms of that wait a step at bs 8, the GPU
        busy 10.1 of a tree round's 15.8 ms). Every plan a DDTree round makes reads a host
        bound it sets itself, and falls back to the reserved lengths SGLang keeps on the host
        when it gives none (``_verify_inputs``, ``_draft_topk``; ``fast_plan.bound_violation``
        checks that bound under ``FAST_PLAN=check``), so the round says so (``HOST_LENS=bound``,
        the mode unset resolves to off FlashInfer: H100 §26, a round 20-25 % cheaper at bs 1,
        9-23 % at bs 8)."""
        backends = super().spec_v2_attn_backends
        if self._resolved_host_lens() != "bound":
            return backends
        return tuple(PlansFromBound(b) for b in backends)

    def _init_host_lens(self) -> None:
        """The switch as set; the mode waits for the backends (``_resolved_host_lens``)."""
        self._host_lens_env = settings.host_lens_from_env()
        self._host_lens: str | None = None
        self._flashinfer_plans: bool | None = None
        self._pad_verify = False  # the bound with a FlashInfer target: its verify padded
        self._pad_ring: PinnedRing | None = None

    def _resolved_host_lens(self) -> str:
        """``bound`` or ``sync`` (``settings.resolve_host_lens``): ``bound`` unless HOST_LENS=sync,
        FAST_PLAN=0 or a FlashInfer backend plans the target's or the drafter's forwards (its
        split-KV plans need the exact lengths, §29). Decided from the live backends the first
        time it is asked: SGLang builds them after constructing this worker
        (``Scheduler.init_all_attention_backends``), so deciding in ``__init__`` saw none and
        left FlashInfer on the bound (§30). Asked before they exist, ``sync``, not kept."""
        if self._host_lens is None:
            backends = (
                getattr(getattr(self._target_worker, "model_runner", None), "attn_backend", None),
                getattr(getattr(self, "draft_model_runner", None), "attn_backend", None),
            )
            if any(b is None for b in backends):
                return "sync"
            target_fi, draft_fi = map(settings.is_flashinfer_backend, backends)
            self._flashinfer_plans = target_fi or draft_fi
            self._host_lens = settings.resolve_host_lens(self._host_lens_env, self._fast_plan,
                                                         self._flashinfer_plans, draft_fi,
                                                         self._split_verify)
            self._pad_verify = self._host_lens == "bound" and target_fi
        return self._host_lens

    def init_cuda_graphs(self):
        # DFlash's init appends a capture hook for whatever _maybe_build_draft_sampler returns;
        # ours returns the top-K head, and its greedy `out` buffer is never read here.
        super().init_cuda_graphs()
        if self._draft_sampler is not None and self._draft_sampler is not self._topk_head:
            raise RuntimeError("DDTree draft head was not installed")
        self._init_budget_targets()
        self._warm_up_compaction()  # the target's KV pool exists from here on
        if self._fast_plan != "off":  # every verify-mode graph of the round, without a sync
            self._install_fast_plan(self.draft_model_runner.attn_backend, "drafter")
            for n, (backend, graphs) in sorted(self._targets.items()):
                if graphs is not None:
                    self._install_fast_plan(backend, f"verify at width {n + 1}")
            if is_cuda() and any(n > 0 for n in self._targets):
                fast_plan.warm_up_pack(self.device)
        if self.ps.tp_rank == 0:
            logger.info(settings.host_lens_line(self._resolved_host_lens(), self._fast_plan,
                                                bool(self._flashinfer_plans)))

    def _init_budget_targets(self):
        """One target attention backend + verify CUDA graphs per candidate budget.

        SGLang captured the target's verify graphs at width N+1 (the largest budget) before
        this worker existed; every smaller candidate gets its own backend (new workspace) and
        ``DecodeCudaGraphRunner`` at width n+1, captured only at the batch sizes whose schedule
        range lists n. This is how SGLang's own adaptive EAGLE builds its runtime states
        (``EAGLEWorkerV2.build_adaptive_runtime_state``, sglang 0.5.17).
        """
        mr = self._target_worker.model_runner
        runner = mr.decode_cuda_graph_runner
        self._targets = {self.ddtree.budget: (mr.attn_backend, runner)}
        self._graph_bs = sorted(int(b) for b in getattr(runner, "capture_bs", []) or [])
        if self._policy is None:
            return
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
            DecodeCudaGraphRunner,
        )
        from sglang.srt.runtime_context import get_context, get_exec, get_spec

        schedule = self._policy_spec.schedule
        spec_width = get_spec().speculative_num_draft_tokens
        graph_cfg = get_exec().graph
        saved_bs, saved_disable = graph_cfg.cuda_graph_bs_decode, graph_cfg.disable_cuda_graph
        for n in self._budgets:
            if n == self.ddtree.budget:
                continue
            t0 = time.monotonic()
            capture = schedule.capture_bs(n, self._graph_bs) if runner is not None else []
            get_context().override(
                "ddtree.budget_capture",
                speculative_num_draft_tokens=n + 1,
                cuda_graph_bs_decode=capture,
                **({"disable_cuda_graph": True} if not capture else {}),
            )
            try:
                saved_ws = mr.init_new_workspace
                try:
                    backend = mr._get_attention_backend(init_new_workspace=True)
                finally:
                    mr.init_new_workspace = saved_ws
                graphs = None
                if capture:
                    graphs = DecodeCudaGraphRunner(
                        mr, attn_backend=backend, speculative_num_draft_tokens=n + 1
                    )
            finally:
                get_context().override(
                    "ddtree.budget_restore",
                    speculative_num_draft_tokens=spec_width,
                    cuda_graph_bs_decode=saved_bs,
                    disable_cuda_graph=saved_disable,
                )
            self._targets[n] = (backend, graphs)
            if self.ps.tp_rank == 0:
                logger.info(
                    "DDTree adaptive: budget %d (verify width %d) ready in %.1f s, graphs at "
                    "bs %s.", n, n + 1, time.monotonic() - t0, capture or "none (eager)",
                )  # fmt: skip

    def _install_fast_plan(self, backend, what: str) -> None:
        """``backend``'s verify-mode graphs plan FlashInfer from the host layout, without its
        D2H syncs; a tree verify's mask is packed on the GPU first (fast_plan.py)."""
        try:
            from sglang.srt.layers.attention.flashinfer_backend import fast_prefill_plan
        except ImportError as exc:
            installed, reason = 0, f"no fast_prefill_plan in this SGLang ({exc})"
        else:
            installed, reason = fast_plan.install(backend, fast_prefill_plan,
                                                  fast_plan.pack_custom_mask,
                                                  fence=torch.cuda.Event)
        if self.ps.tp_rank == 0:
            logger.info("DDTree %s: sync-free FlashInfer plan on %d graph wrapper(s)%s.", what,
                        installed, f"; not on the rest: {reason}" if reason else "")

    def _root_round(self, bs: int) -> RootRound:
        """The budget-0 round's constant tensors for this batch size (made on first use)."""
        hit = self._root_rounds.get(bs)
        if hit is None:
            hit = self._root_rounds[bs] = RootRound(bs, self.ddtree.max_depth, self.device,
                                                    steps=self._nodraft_steps)
        return hit

    def _padded_bs(self, bs: int) -> int:
        """The CUDA-graph batch size a batch of ``bs`` runs at (bs itself past the graphs)."""
        idx = bisect.bisect_left(self._graph_bs, bs)
        return self._graph_bs[idx] if idx < len(self._graph_bs) else bs

    def _choose_budget(self, batch, bs: int, lengths=None) -> tuple[int, int]:
        """(budget, slot key) for this round: the fixed N, or the policy's choice. With the
        requests' ``lengths`` (``_req_lengths``), one about to finish does not count as new."""
        if self._policy is None:
            return self.ddtree.budget, bs
        for rec in self._meter.drain():
            self._policy.observe(rec.key, rec.ran, rec.accept_by_budget, rec.cost_ms)
        key = self._padded_bs(bs)
        rids = [r.rid for r in batch.reqs]
        counts = self._round_steps.worth_probing(lengths) if lengths is not None else None
        fresh = policy_mod.fresh_share(rids, self._seen_rids, counts)
        n = self._policy.choose(key, fresh, after_prefill=self._after_prefill).budget
        now = time.perf_counter()
        if self._wall_prev is not None:  # the previous round, choice to choice on the host
            t0, prev_key, prev_n, prev_first = self._wall_prev
            self._policy.observe_wall(prev_key, prev_n, (now - t0) * 1e3, prev_first)
        self._wall_prev = (now, key, n, self._after_prefill)
        self._after_prefill = False
        if n == self._policy.schedule.candidates(key)[-1]:
            self._seen_rids = set(rids)  # this round measures every request in the batch
        self._policy_rounds += 1
        if self.ps.tp_rank == 0 and self._policy_rounds % POLICY_LOG_EVERY == 0:
            logger.info("DDTree adaptive policy: %s", json.dumps(self.policy_summary()))
        if n != self._active_budget:
            backend, graphs = self._targets[n]
            mr = self._target_worker.model_runner
            mr.attn_backend = backend
            mr.decode_cuda_graph_runner = graphs
            self._active_budget = n
        return n, key

    def _counted_budgets(self, key: int, ran: int) -> tuple[tuple[int, ...], Any, Any]:
        """Candidates 1..ran of slot ``key``, the same as a device tensor (``path_counts``) and
        padded for the fused accept tail (None without it). Cached: a fresh host-to-device
        copy each round would wait for the stream."""
        cache = self._budget_tensors
        hit = cache.get((key, ran))
        if hit is None:
            cands = tuple(n for n in self._policy.schedule.candidates(key) if 0 < n <= ran)
            kernels = verify_kernels() if is_cuda() and cands else None
            padded = kernels.pad_budgets(cands, self.device) if kernels is not None else None
            hit = (cands, torch.tensor(cands, dtype=torch.long, device=self.device), padded)
            cache[(key, ran)] = hit
        return hit

    def policy_summary(self) -> dict:
        """The policy and what each batch size has learnt (logged; read by diagnostics)."""
        out = {"policy": self._policy_spec.describe(), "budget": self.ddtree.budget,
               "fast_plan": self._fast_plan, "host_lens": self._resolved_host_lens(),
               "flashinfer_plans": bool(self._flashinfer_plans),
               "padded_verify": bool(self._pad_verify)}
        if self._fast_plan == "check":
            out["fast_plan_checks"] = {"rounds": self._plan_checks,
                                       "violations": self._plan_violations}
        if self._policy is not None:
            out["nodraft_steps"] = self._nodraft_steps
            if self._round_steps is not None:
                out["nodraft_trimmed"] = self._round_steps.trimmed
            out["slots"] = self._policy.summary()
            out["dropped_rounds"] = self._meter.dropped
        return out

    # ---- one round -------------------------------------------------------------------------

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        if (
            batch.forward_mode.is_extend()
            or batch.is_extend_in_batch
            or batch.forward_mode.is_idle()
        ):
            if self._meter is not None:
                self._meter.interrupt()  # the open round's cost would include this forward
                self._wall_prev = None  # and so would its host time
                self._after_prefill = True  # the next round's wall waits out this forward
            if self._round_steps is not None:
                self._round_steps.other_forward()  # the last round is processed meanwhile
            return super().forward_batch_generation(batch, on_publish, grammar_barrier)
        if getattr(batch, "return_logprob", False):
            raise ValueError("DFLASH speculative decoding does not support return_logprob yet.")
        if batch.has_grammar:
            raise RuntimeError("DDTree mode rejects grammar requests at admission")
        if batch.spec_info is None:
            batch.spec_info = DFlashDraftInputV2.create_idle_input(device=self.device)
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTree expected DFlashDraftInputV2 state on the running batch.")
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        if self._tracer is not None:
            with self._tracer.round(len(batch.seq_lens)):
                return self._ddtree_round(batch, draft_input, on_publish)
        return self._ddtree_round(batch, draft_input, on_publish)

    def _prepare_draft_block(self, batch, draft_input, bs):
        """Block ids [bonus, MASK..], positions prefix+j and the block's KV slots (width B)."""
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions_2d = self._draft_block_positions_buf[:bs]
        cache_loc_2d = self._draft_verify_out_cache_loc_buf[:bs]
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        prefix_lens = batch.seq_lens
        if self._use_triton_prepare_block:
            try:
                _prepare_dflash_draft_block_unchecked(
                    bonus_tokens=draft_input.bonus_tokens.view(-1),
                    prefix_lens=prefix_lens.view(-1),
                    req_pool_indices=batch.req_pool_indices.view(-1),
                    req_to_token=req_to_token,
                    block_ids_out=block_ids,
                    positions_out=positions_2d,
                    cache_loc_out=cache_loc_2d,
                    mask_token_id=int(self._mask_token_id),
                )
                return block_ids, positions_2d, cache_loc_2d
            except Exception as exc:  # same fallback as DFlash
                self._use_triton_prepare_block = False
                logger.warning("DDTree Triton prepare_block failed; using eager path: %s", exc)
        block_ids.fill_(int(self._mask_token_id))
        block_ids[:, 0].copy_(draft_input.bonus_tokens)
        torch.add(prefix_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
        locs = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + self.block_size,
            batch_size=bs,
            draft_token_num=self.block_size,
            device=self.device,
        )
        cache_loc_2d.copy_(locs.view(bs, self.block_size))
        return block_ids, positions_2d, cache_loc_2d

    def _draft_topk(self, batch, draft_input, bs):
        """Run the drafter; per-depth top-K ``(logp, ids)`` ``[bs, L, K]`` plus block state."""
        target_model = self._target_worker.model_runner.model
        block_ids, positions_2d, cache_loc_2d = self._prepare_draft_block(batch, draft_input, bs)
        noise = target_model.get_input_embeddings()(block_ids)
        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
        bound = self._plan_bound(batch, draft_input, self.block_size)
        seq_lens_cpu.copy_(bound[0])
        seq_lens_sum = bound[1]
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=cache_loc_2d.reshape(-1),
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=positions_2d.reshape(-1),
            input_embeds=noise.view(-1, noise.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        with torch.inference_mode():
            out = self.draft_model_runner.forward(fb)
        if self._topk_head is not None and out.can_run_graph:
            logp, ids = self._topk_head.read(bs)
        else:
            hidden = out.logits_output.hidden_states
            if hidden is None:
                raise RuntimeError("DFLASH draft model returned no hidden states.")
            hidden = hidden.view(bs, self.block_size, -1)[:, 1:, :]
            weight, num_org, vocab_start = self._lm_head_shard()
            tp_group = get_tp_group()
            logp, ids = draft_topk(
                hidden.reshape(-1, hidden.shape[-1]),
                weight,
                self._topk_k,
                num_org=num_org,
                vocab_start=vocab_start,
                tp_group=tp_group if tp_group.world_size > 1 else None,
            )
            depth = self.block_size - 1
            logp, ids = logp.view(bs, depth, -1), ids.view(bs, depth, -1)
        return logp, ids, block_ids, positions_2d, cache_loc_2d

    def _apply_plant(self, batch, roots, logp, ids):
        """TEST-ONLY: rewrite top-K ids (and log-probs) per the plant file, on the device.

        ``plant.DevicePlant`` (tested equal to ``plant.apply_plant_host``, the oracle's model);
        the host only maps batch rows to plant requests.
        """
        if self._device_plant is None:
            from sglang_dflash.sglang_overlay.diagnostics import plant as plant_mod

            self._device_plant = plant_mod.DevicePlant(self._plant, logp.device)
        dp = self._device_plant
        # a request's plant row is looked up once (hashing its prompt every round was host
        # time a real drafter does not spend)
        keys = self._plant_keys
        for r in batch.reqs:
            if r.rid not in keys:
                if len(keys) > 4096:
                    keys.clear()
                keys[r.rid] = (tuple(r.origin_input_ids), len(r.origin_input_ids))
        rows = dp.row_index([keys[r.rid] for r in batch.reqs])
        return dp.apply(rows, batch.seq_lens, roots, logp, ids)

    def _ddtree_round(self, batch, draft_input, on_publish):
        """One decode round: draft, tree, verify, accept, commit (the profiler's five stages,
        marked between the stage methods; the meter times the round from start to start).
        Under SGLang's torch profiler each stage is also a ``ddtree.<stage>`` range, so a
        trace gives the host time of each (benchmarks/trace_summary.py)."""
        ranges = stage_ranges()
        with ranges("round"):
            return self._ddtree_round_body(batch, draft_input, on_publish, ranges)

    def _ddtree_round_body(self, batch, draft_input, on_publish, ranges):
        bs = len(batch.seq_lens)
        if self._fast_plan == "check":
            self._check_plan_bound(batch, draft_input)
        lengths = _req_lengths(batch) if self._round_steps is not None else None
        with ranges("choose"):
            budget, key = self._choose_budget(batch, bs, lengths)
        if self._round_steps is not None:
            if budget == 0:
                steps = self._round_steps.plan(lengths)
                if steps < self._nodraft_steps:
                    self._wall_prev = None  # a short round's wall is not budget 0's
                return self._nodraft_round(batch, draft_input, on_publish, ranges, key, bs,
                                           steps)
            self._round_steps.launched(lengths)
        width = budget + 1
        prefix_lens = batch.seq_lens  # the committed prefixes this round starts from
        prof, meter = self._prof, self._meter
        if meter is not None:
            meter.begin()
        if prof is not None:
            prof.mark(0, bs)
        with ranges("draft"):
            drafted = self._draft_stage(batch, draft_input, bs, budget, ranges)
        if prof is not None:
            prof.mark(1)
        with ranges("tree"):
            tree = self._tree_stage(batch, drafted, bs, budget)
        if prof is not None:
            prof.mark(2)
        target_out, vt = self._verify_stage(batch, draft_input, tree, drafted, bs, width, prof,
                                            ranges)
        if prof is not None:
            prof.mark(4)
        cands = self._counted_budgets(key, budget) if meter is not None else None
        with ranges("accept"):
            fused = (cands[2], len(cands[0])) if cands and cands[2] is not None else None
            acc = self._accept_stage(batch, tree, target_out.logits_output, vt, bs, width,
                                     budget, fused)
            new_seq_lens = prefix_lens + acc.commit_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        with ranges("commit"):
            self._commit_stage(target_out.logits_output, acc, drafted, bs, budget)
        if prof is not None:
            prof.mark(5)
        with ranges("result"):
            if meter is not None:
                counts = acc.counts
                if counts is None and cands[0]:
                    counts = adaptive_mod.path_counts(acc.accept_index, width, cands[1])
                meter.end(key, budget, bs, cands[0], counts)
            return self._round_result(target_out, acc.out_tokens, acc.commit_lens, acc.bonus,
                                      new_seq_lens)

    def _check_plan_bound(self, batch, draft_input) -> None:
        """``SGLANG_DFLASH_DDTREE_FAST_PLAN=check``: the host bound the fast plan reads against
        the device prefixes (a sync); every violation is logged (the first 5 in full)."""
        why = fast_plan.bound_violation(batch.seq_lens.cpu(), batch.seq_lens_cpu,
                                        getattr(draft_input, "reserved_seq_lens_cpu", None),
                                        max(self.block_size, self.ddtree.verify_width))
        self._plan_checks += 1
        if why is not None:
            self._plan_violations += 1
            if self._plan_violations <= 5:
                logger.error("DDTree %s (round %d, violation %d).", why, self._plan_checks,
                             self._plan_violations)

    def _round_result(self, target_out, out_tokens, commit_lens, bonus, new_seq_lens):
        """What SGLang's spec-v2 scheduler takes from a round: ``out_tokens`` ``[bs, B]``
        (committed tokens, bonus last), ``commit_lens`` int32, the next round's draft input."""
        return GenerationBatchResult(
            logits_output=target_out.logits_output,
            next_token_ids=out_tokens.reshape(-1),
            accept_lens=commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(
                bonus_tokens=bonus, new_seq_lens=new_seq_lens
            ),
            speculative_num_draft_tokens=self.block_size,
            new_seq_lens=new_seq_lens,
        )

    def _nodraft_round(self, batch, draft_input, on_publish, ranges, key: int, bs: int,
                       steps: int | None = None):
        """A round without a draft as ``k = nodraft_steps`` plain decode steps: k width-1
        (causal) verify forwards in a row, each feeding its token to the next, then one
        drafter KV append for the k committed tokens.

        A speculative round pays SGLang's spec-v2 bookkeeping and its own fixed stages once;
        a no-draft round that commits one token paid them per token, which kept the fallback
        at 0.48-0.69x no speculation (docs/gpu-results.md §19). Committing k tokens a round
        (as an accepted chain of k-1 drafts plus the bonus) pays them once per k. Lossless as
        any round: step j's token is the target's choice (argmax, or the seeded or unseeded
        draw keyed by its position) after the tokens before it, exactly as plain decoding
        would choose; SGLang's result processing stops a request at EOS or its length limit
        inside the k tokens as it does inside an accepted draft. The k tokens' KV slots are
        the first k of the draft block's (k <= draft width <= N+1 reserved).

        ``steps`` < k (``round_steps``: no request keeps more) runs fewer steps; such a round
        is not metered (the policy's budget-0 cost is that of k steps), and the round before
        it keeps its counters but not its cost, which would span this one."""
        k = self._nodraft_steps if steps is None else steps
        prof, meter = self._prof, self._meter
        if meter is not None and k != self._nodraft_steps:
            meter.interrupt()
            meter = None
        if meter is not None:
            meter.begin()
        if prof is not None:
            prof.mark(0, bs)
        prefix = batch.seq_lens
        with ranges("draft"):
            block_ids, positions_2d, cache_loc_2d = self._prepare_draft_block(
                batch, draft_input, bs
            )
        if prof is not None:
            prof.mark(1)
            prof.mark(2)
        root_round = self._root_round(bs)
        # Every request commits k: the new lengths are known now, so publish them before the
        # steps. SGLang's next round reads them back with a host sync (FutureMap.
        # resolve_seq_lens_cpu); published here, it waits for this round's start on the GPU,
        # not its end (H200 §23: 6 ms of sync a round, the GPU idle meanwhile).
        new_seq_lens = prefix + k
        if on_publish is not None:
            on_publish(new_seq_lens)
        saved = (batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)
        tokens = block_ids[:, 0]
        out = torch.zeros((bs, self.block_size), dtype=torch.long, device=self.device)
        rows = None
        target_out = None
        try:
            for j in range(k):
                step_prefix = prefix if j == 0 else prefix + j
                batch.seq_lens = step_prefix
                if saved[1] is not None:  # the host bound of the prefixes grows with the steps
                    batch.seq_lens_cpu = saved[1] + j if j else saved[1]
                if saved[2] is not None:
                    batch.seq_lens_sum = saved[2] + bs * j
                tree = root_round.tree(tokens, step_prefix)
                step = _Drafted(None, None, block_ids, positions_2d, cache_loc_2d[:, j:j + 1])
                target_out, vt = self._verify_stage(batch, draft_input, tree, step, bs, 1, None,
                                                    ranges)
                with ranges("accept"):
                    choice = self._node_choice(
                        batch.sampling_info, target_out.logits_output.next_token_logits, vt,
                        bs, 1,
                    ).reshape(bs)
                    hidden = target_out.logits_output.hidden_states
                    if hidden is None:
                        raise RuntimeError("DDTree verify requires target hidden states.")
                    if rows is None:
                        rows = torch.empty((bs, k, hidden.shape[-1]), dtype=hidden.dtype,
                                           device=hidden.device)
                    rows[:, j].copy_(hidden[:bs])  # the next replay overwrites the graph output
                    out[:, j].copy_(choice)
                    tokens = choice
        finally:
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = saved
        if prof is not None:
            prof.mark(3)
            prof.mark(4)
        commit = root_round.commit_lens(k)
        with ranges("commit"):
            self._append_first_columns(rows.view(bs * k, -1), cache_loc_2d, positions_2d, k,
                                       commit)
            target_out.logits_output.hidden_states = None
        if prof is not None:
            prof.mark(5)
        with ranges("result"):
            if meter is not None:
                meter.end(key, 0, bs, (), None)
            return self._round_result(target_out, out, commit, tokens, new_seq_lens)

    def _draft_stage(self, batch, draft_input, bs: int, budget: int, ranges) -> _Drafted:
        """The drafter's per-depth top-K and the block's slots; a budget-0 round drafts
        nothing and keeps only the slots (the drafter's KV commit needs them). The test-only
        plant, when set, rewrites the top-K in its own ``ddtree.plant`` range (a real drafter
        does not pay it: a profile can subtract it)."""
        if budget > 0:
            logp, ids, block_ids, positions_2d, cache_loc_2d = self._draft_topk(
                batch, draft_input, bs
            )
            if self._plant is not None:
                with ranges("plant"):
                    logp, ids = self._apply_plant(batch, block_ids[:, 0], logp, ids)
            return _Drafted(logp, ids, block_ids, positions_2d, cache_loc_2d)
        block_ids, positions_2d, cache_loc_2d = self._prepare_draft_block(batch, draft_input, bs)
        return _Drafted(None, None, block_ids, positions_2d, cache_loc_2d)

    def _tree_stage(self, batch, drafted: _Drafted, bs: int, budget: int):
        """The tree on the GPU, no host sync (the root-only tree for budget 0)."""
        roots = drafted.block_ids[:, 0]
        if budget > 0:
            return build_tree(drafted.logp, drafted.ids, roots, batch.seq_lens, budget)
        return self._root_round(bs).tree(roots, batch.seq_lens)

    def _verify_stage(self, batch, draft_input, tree, drafted: _Drafted, bs: int, width: int,
                      prof, ranges):
        """Verify inputs (slots, mask, positions) and the target's forward over the tree."""
        with ranges("verify_prep"):
            verify_fb, vt = self._verify_inputs(batch, draft_input, tree, drafted, bs, width)
        if prof is not None:
            prof.mark(3)
        with ranges("verify_forward"):
            target_out = self._target_worker.forward_batch_generation(
                batch=None, forward_batch=verify_fb, is_verify=True,
                skip_attn_backend_init=True,
            )
            if batch.sampling_info is not None:
                apply_dflash_verify_logits_adjustments(
                    next_token_logits=target_out.logits_output.next_token_logits,
                    sampling_info=batch.sampling_info,
                    draft_token_num=width,
                )
        return target_out, vt

    @staticmethod
    def _plan_bound(batch, draft_input, width: int) -> tuple[torch.Tensor, int]:
        """``verify.plan_bound`` for a forward of ``width`` over this batch; with no host
        lengths at all, the device lengths read back (one sync), so every plan has a bound."""
        got = plan_bound(batch.seq_lens_cpu, getattr(draft_input, "reserved_seq_lens_cpu", None),
                         getattr(draft_input, "reserved_seq_lens_sum", None), width)
        if got is None:
            got = plan_bound(batch.seq_lens.to("cpu", torch.int64), None, None, width)
        return got

    def _verify_inputs(self, batch, draft_input, tree, drafted: _Drafted, bs: int, width: int):
        """(the verify ForwardBatch, the verify tensors): slots, tree mask, positions.

        The verify's slots are ``req_to_token[prefix .. prefix+width)``; the draft block
        already looked up ``prefix .. prefix+B)``, so for width <= B they are its first
        columns (a view at width = B, as DFLASH's verify uses its block's). A width-1
        (no-draft) verify is causal: it runs without a mask, on graphs captured without one
        (``hooks.graph_spec_info``), as DFLASH's verify does."""
        prefix_lens = batch.seq_lens
        verify_loc = verify_slots(drafted.cache_loc_2d, width)
        if verify_loc is None:
            verify_loc = assign_extend_cache_locs_func(
                req_pool_indices=batch.req_pool_indices,
                req_to_token=self.model_runner.req_to_token_pool.req_to_token,
                start_offset=prefix_lens,
                end_offset=prefix_lens + width,
                batch_size=bs,
                draft_token_num=width,
                device=self.device,
            )
        seq_lens_cpu_backup, seq_lens_sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        batch.seq_lens_cpu, host_sum = self._plan_bound(batch, draft_input, width)
        batch.seq_lens_sum = host_sum
        # Every prefix is below the context length, so cap the mask there: the Triton backend
        # copies it into a buffer sized max_bs * W * (context_len + W).
        mask_sum = min(host_sum, bs * int(self.model_runner.model_config.context_len))
        split = self._split_verify and width > 1
        padded = None
        if self._pad_verify and width > 1 and not split:
            padded, mask_sum, pad_max = self._padded_prefixes(batch, batch.seq_lens_cpu, width)
            # sized as SGLang's generate_attn_arg_prefill wants it (host sum * W + bs * W^2),
            # so it does not copy the mask to pad it
            vt = build_verify_tensors(tree, prefix_lens, mask_sum, padded_lens=padded,
                                      pad_max=pad_max, tail=width * (host_sum - mask_sum))
        else:
            vt = build_verify_tensors(tree, prefix_lens, mask_sum,
                                      masked=width > 1 and not split)
        verify_input = DDTreeVerifyInput(
            draft_token=vt.tokens,
            positions=vt.positions,
            draft_token_num=width,
            custom_mask=vt.custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        verify_input.tree = tree
        verify_input.padded_lens = padded
        if split:  # the graphs read the runner's copy; an eager forward reads the tensor
            split_verify.fill_visibility(self._target_worker.model_runner.decode_cuda_graph_runner,
                                         tree.visibility, width)
            verify_input.split_visibility = tree.visibility
        batch.out_cache_loc = verify_loc
        verify_fb, _ = verify_input.prepare_for_verify(batch, self._target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu_backup, seq_lens_sum_backup
        return verify_fb, vt

    def _padded_prefixes(self, batch, bound_cpu: torch.Tensor, width: int):
        """The padded verify's prefixes P = the host bound - W (the kv lengths the plan reads,
        ``bound_cpu``, become the device's too), on the device through pinned memory (no
        sync); their host sum; and a host bound of the longest P - prefix, the columns the
        mask clears (from the committed lengths the host has seen, which the device's are not
        below; the longest P without them)."""
        pads = bound_cpu.to(torch.int64) - int(width)
        if self._pad_ring is None:
            self._pad_ring = PinnedRing(self.device)
        dev = self._pad_ring.to_device(pads)
        reqs = getattr(batch, "reqs", None) or ()  # a ModelWorkerBatch may carry none
        committed = [getattr(r, "kv_committed_len", None) for r in reqs]
        if len(committed) == len(pads) and all(c is not None for c in committed):
            pad_max = int((pads - torch.tensor(committed, dtype=torch.int64)).max())
        else:
            pad_max = int(pads.max())
        return dev, int(pads.sum()), max(pad_max, 0)

    def _node_choice(self, sampling_info, logits, vt, bs: int, width: int):
        """The target's token after every node: argmax, a seeded draw, or a sample."""
        if sampling_info is None or sampling_info.is_all_greedy:
            return torch.argmax(logits, dim=-1).view(bs, width)
        if seeded_sampling(sampling_info):
            filtered = sampling_info.need_top_k_sampling or sampling_info.need_top_p_sampling
            return seeded_node_targets(
                logits,
                width,
                sampling_info.temperatures,
                sampling_info.sampling_seed,
                vt.positions,
                multinomial_with_seed,
                top_ks=sampling_info.top_ks if filtered else None,
                top_ps=sampling_info.top_ps if filtered else None,
            )
        return per_node_targets(
            logits,
            width,
            sampling_info.temperatures,
            top_ks=sampling_info.top_ks if sampling_info.need_top_k_sampling else None,
            top_ps=sampling_info.top_ps if sampling_info.need_top_p_sampling else None,
            min_ps=sampling_info.min_ps if sampling_info.need_min_p_sampling else None,
            renorm=self._renorm,
        )

    def _accept_stage(self, batch, tree, logits_output, vt, bs: int, width: int, budget: int,
                      counted=None):
        """The greedy walk over the target's choices, then the accepted nodes' target KV
        compacted to prefix..prefix+commit-1. ``counted`` (padded budgets, n) lets the fused
        tail also count the adaptive policy's counterfactual."""
        choice = self._node_choice(
            batch.sampling_info, logits_output.next_token_logits, vt, bs, width
        )
        if budget == 0:
            # A root-only tree commits its one node, whose KV the verify already wrote at
            # req_to_token[prefix] (verify_loc): the compaction would copy it onto itself.
            return self._root_round(bs).accept(choice)
        acc = greedy_accept(tree, choice, kernel=self._verify_kernel, budgets=counted)
        self._compact_kv(batch, acc, width)
        return acc

    def _compact_kv(self, batch, acc, width: int) -> None:
        """The accepted nodes' target KV to ``prefix .. prefix+accept_len``: one Triton launch
        that skips nodes already in place (``kv_compact_triton``) where the pool is
        ``MHATokenToKVPool``'s layout and the walk gave int32 outputs; SGLang's
        ``move_accept_tokens_to_target_kvcache`` otherwise."""
        compaction = self._compaction_kernel()
        if compaction is not None and acc.index_i32 is not None:
            pool, kernel = compaction
            kernel.compact_triton(
                pool.data_ptrs, pool.data_strides, pool._kv_copy_config, batch.out_cache_loc,
                self.model_runner.req_to_token_pool.req_to_token, batch.req_pool_indices,
                batch.seq_lens, acc.index_i32, acc.len_i32, width,
            )
            return
        move_accept_tokens_to_target_kvcache(
            batch,
            acc.index_i32 if acc.index_i32 is not None else acc.accept_index.to(torch.int32),
            acc.len_i32 if acc.len_i32 is not None else acc.accept_len.to(torch.int32),
            self.model_runner.token_to_kv_pool_allocator,
        )

    def _commit_stage(self, logits_output, acc, drafted: _Drafted, bs: int, budget: int):
        """The drafter's KV for the committed tokens, from the target's hidden states along
        the accepted path."""
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTree verify requires target hidden states, but got None.")
        cache_loc_2d, positions_2d = drafted.cache_loc_2d, drafted.positions_2d
        if budget > 0:
            path_hidden = gather_accepted_rows(hidden, acc.accept_index)  # [bs*B, F]
            self._append_target_hidden_to_draft_kv_by_loc(
                target_hidden=path_hidden,
                cache_loc=cache_loc_2d.reshape(-1),
                cache_loc_2d=cache_loc_2d,
                positions=positions_2d.reshape(-1),
                commit_lens=acc.commit_lens,
            )
        else:
            # One committed token per request, the root's: project bs rows, not bs*B (the
            # prefix-valid writer would drop the other B-1 rows of each request anyway).
            self._append_first_columns(hidden[:bs], cache_loc_2d, positions_2d, 1,
                                       acc.commit_lens)
        logits_output.hidden_states = None

    def _append_first_columns(self, target_hidden, cache_loc_2d, positions_2d, n: int,
                              commit_lens):
        """The drafter's KV for ``n`` committed tokens a request that sit in the first ``n``
        columns of the draft block (``target_hidden`` ``[bs*n, F]``, request-major): a
        no-draft round's tokens. Projects bs*n rows, not bs*B."""
        loc = cache_loc_2d[:, :n].contiguous()
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=target_hidden,
            cache_loc=loc.view(-1),
            cache_loc_2d=loc,
            positions=positions_2d[:, :n].reshape(-1),
            commit_lens=commit_lens,
        )
