"""The SGLang 0.5.17 hook points of DDTree mode, registered on SGLang's ``HookRegistry``.

Every hook is a no-op pass-through unless ``SGLANG_DFLASH_DDTREE_BUDGET`` is set, so stock
DFlash (and every other algorithm) is untouched. Targets, all reached without editing files:

| target | type | why |
|---|---|---|
| ``speculative_hook._handle_dflash`` | AROUND | validate; verify width N+1, draft width B |
| ``SpeculativeAlgorithm.get_num_tokens_per_req_for_target_verify`` | AROUND | draft graphs B wide |
| ``SpeculativeAlgorithm.create_worker`` | AROUND | ``DDTreeWorkerV2`` for DFLASH |
| ``spec_info.create_dummy_verify_input`` | AROUND | warm-up inputs: widths, target mask |
| ``DecodeCudaGraphRunner.get_spec_info`` | AROUND | target graphs captured with a mask |
| ``dflash_utils.validate_dflash_request`` | AROUND | grammar requests rejected per request |
| ``FlashInferAttnBackend.__init__`` | AROUND | workspace for the N+1-wide verify graphs |
| ``Scheduler.get_internal_state`` | AROUND | ``/server_info`` reports the budget policy |

``create_worker`` imports its worker lazily, so wrapping it (rather than a class REPLACE of
``DFlashWorkerV2``) keeps the heavy worker module out of the launcher/tokenizer processes.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sglang_dflash.sglang_overlay import settings

logger = logging.getLogger(__name__)

SPEC = "sglang.srt.speculative"
TARGETS = {
    "handle_dflash": "sglang.srt.arg_groups.speculative_hook._handle_dflash",
    "tokens_per_req": f"{SPEC}.spec_info.SpeculativeAlgorithm."
    "get_num_tokens_per_req_for_target_verify",
    "create_worker": f"{SPEC}.spec_info.SpeculativeAlgorithm.create_worker",
    "dummy_verify": f"{SPEC}.spec_info.create_dummy_verify_input",
    "graph_spec_info": "sglang.srt.model_executor.runner.decode_cuda_graph_runner."
    "DecodeCudaGraphRunner.get_spec_info",
    "validate_request": f"{SPEC}.dflash_utils.validate_dflash_request",
    "flashinfer_workspace": "sglang.srt.layers.attention.flashinfer_backend."
    "FlashInferAttnBackend.__init__",
    "internal_state": "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
    "split_verify": "sglang.srt.layers.attention.flashinfer_backend."
    "FlashInferAttnBackend.forward_extend",
}


def _active() -> bool:
    return settings.is_requested()


def _dp_attention(server_args: Any) -> bool:
    try:
        from sglang.srt.arg_groups.overrides import resolved_view

        return bool(resolved_view(server_args).enable_dp_attention)
    except Exception:  # older/newer layouts: fall back to the plain field
        return bool(getattr(server_args, "enable_dp_attention", False))


def handle_dflash(original, server_args):
    """DFlash's arg handling, then DDTree's widths: num_draft_tokens = N+1, block = B."""
    if not _active():
        return original(server_args)
    budget = settings.budget_from_env()
    facts = settings.TargetFacts(
        attention_backend=getattr(server_args, "attention_backend", None),
        prefill_attention_backend=getattr(server_args, "prefill_attention_backend", None),
        decode_attention_backend=getattr(server_args, "decode_attention_backend", None),
        page_size=getattr(server_args, "page_size", 1),
        pp_size=int(getattr(server_args, "pp_size", 1) or 1),
        enable_dp_attention=_dp_attention(server_args),
        draft_window_size=getattr(server_args, "speculative_draft_window_size", None),
        speculative_num_draft_tokens=server_args.speculative_num_draft_tokens,
        split_verify=settings.split_verify_from_env(),
    )
    reason = settings.unsupported_reason(facts, budget)
    if reason is not None:
        raise settings.DDTreeConfigError(reason)
    settings.policy_from_env(budget)  # a bad policy fails here, in the launcher
    # and a bad switch (no-draft steps, split verify, fast plan, host lengths) or the bound with
    # FlashInfer: the worker's rules, here from the flags, before SGLang starts anything
    backends = {getattr(server_args, a, None) for a in settings.ATTENTION_BACKEND_ARGS}
    target = {getattr(server_args, a, None) for a in settings.TARGET_ATTENTION_ARGS}
    settings.check_switches(os.environ, "flashinfer" in backends, settings.draft_is_flashinfer(
        target, getattr(server_args, settings.DRAFT_ATTENTION_ARG, None)))
    plant_path = os.environ.get(settings.PLANT_ENV, "").strip()
    if plant_path:
        from sglang_dflash.sglang_overlay.diagnostics.plant import load_plant

        load_plant(plant_path)  # fail at startup, in the launcher, on a bad file
    # Let DFlash resolve the block size B (flag or draft config) into num_draft_tokens.
    server_args.speculative_num_draft_tokens = None
    original(server_args)
    mode = settings.DDTreeMode(
        budget=budget, block_size=int(server_args.speculative_num_draft_tokens)
    )
    if mode.draft_width < 2:
        raise settings.DDTreeConfigError(
            f"DDTree needs a draft block size >= 2 (one draft position); got {mode.block_size}"
        )
    server_args.speculative_dflash_block_size = mode.draft_width
    server_args.speculative_num_draft_tokens = mode.verify_width
    logger.info(
        "DDTree mode of DFLASH: budget N=%d -> speculative_num_draft_tokens=%d (verify width), "
        "draft width %d (block %d).",
        budget,
        mode.verify_width,
        mode.draft_width,
        mode.block_size,
    )
    return None


def _draft_width() -> int | None:
    try:
        from sglang.srt.runtime_context import get_spec

        value = get_spec().speculative_dflash_block_size
    except Exception:
        return None
    return int(value) if value else None


def tokens_per_req(original, self, num_draft_tokens, is_draft_worker):
    """The draft worker's TARGET_VERIFY width is the draft block B, not the verify width."""
    if _active() and is_draft_worker and self.is_dflash():
        width = _draft_width()
        if width is not None:
            return width
    return original(self, num_draft_tokens, is_draft_worker)


def create_worker(original, self, server_args):
    if _active() and self.is_dflash():
        from sglang_dflash.sglang_overlay.worker import DDTreeWorkerV2

        return DDTreeWorkerV2
    return original(self, server_args)


def dummy_verify(
    original, spec_algorithm, server_args, custom_mask, num_tokens_per_req, is_draft_worker
):
    """Warm-up verify input: the runner's own width, and a mask buffer for the target."""
    info = original(spec_algorithm, server_args, custom_mask, num_tokens_per_req, is_draft_worker)
    if info is None or not (_active() and spec_algorithm.is_dflash()):
        return info
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    return DFlashVerifyInput(
        draft_token=None,
        positions=None,
        draft_token_num=int(num_tokens_per_req),
        custom_mask=None if is_draft_worker else custom_mask,
        capture_hidden_mode=(CaptureHiddenMode.NULL if is_draft_worker else CaptureHiddenMode.FULL),
    )


def graph_spec_info(original, self, num_tokens):
    """Target verify graphs must be captured with a custom-mask buffer (FlashInfer, Triton),
    except at width 1: the adaptive policy's no-draft verify is causal (one query, its prefix
    and itself), so its graphs are captured as stock DFLASH captures them, without a mask.
    With the split verify (``SGLANG_DFLASH_DDTREE_SPLIT_VERIFY=1``) a tree verify is captured
    without a mask too, and its tree block reads the runner's visibility buffer, which each
    round fills before the replay (``split_verify.visibility_buffer``)."""
    info = original(self, num_tokens)
    runner = self.model_runner
    width = int(getattr(self, "captured_req_width", 0) or 0)
    if (
        info is not None
        and _active()
        and runner.spec_algorithm.is_dflash()
        and not runner.is_draft_worker
        and width != 1
    ):
        if settings.split_verify_from_env() and width > 1:
            from sglang_dflash.sglang_overlay.split_verify import visibility_buffer
            from sglang_dflash.sglang_overlay.worker import DDTreeVerifyInput

            bs = int(num_tokens) // width
            split = DDTreeVerifyInput(
                draft_token=info.draft_token, positions=info.positions,
                draft_token_num=width, custom_mask=None,
                capture_hidden_mode=info.capture_hidden_mode,
            )
            split.split_visibility = visibility_buffer(self, width)[: bs * width * width].view(
                bs, width, width)
            return split
        info.custom_mask = self.buffers.custom_mask
    return info


def split_verify(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    """FlashInfer's ``forward_extend``: a split tree verify (its spec input carries the tree's
    visibility) takes ``split_verify.forward``; every other call is upstream's."""
    vis = getattr(forward_batch.spec_info, "split_visibility", None)
    if vis is None or k is None or not forward_batch.forward_mode.is_target_verify():
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    from sglang_dflash.sglang_overlay import split_verify as split_mod

    return split_mod.forward(self, q, k, v, layer, forward_batch, vis, save_kv_cache)


GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


def request_grammar(req: Any) -> str | None:
    """The grammar kind a request asks for, or None."""
    params = getattr(req, "sampling_params", None)
    for name in GRAMMAR_FIELDS:
        if getattr(params, name, None):
            return name
    return None


def validate_request(original, req, enable_overlap):
    msg = original(req, enable_overlap)
    if msg is None and _active():
        kind = request_grammar(req)
        if kind is not None:
            return f"DDTree mode of DFLASH does not support grammar-constrained requests ({kind})."
    return msg


def verify_workspace_need(model_runner) -> int | None:
    """Float workspace the target's largest CUDA-graph verify needs; None = no graphs/unknown."""
    try:
        import torch
        from sglang.srt.runtime_context import get_exec, get_parallel, get_spec

        sizes = list(get_exec().graph.cuda_graph_config.decode.bs or [])
        width = int(get_spec().speculative_num_draft_tokens or 0)
        if not sizes or width < 2 or not torch.cuda.is_available():
            return None
        tp = int(get_parallel().attn_tp_size)
        cfg = model_runner.model_config
        return settings.flashinfer_verify_float_bytes(
            max(sizes),
            width,
            qo_heads=cfg.num_attention_heads // tp,
            kv_heads=cfg.get_num_kv_heads(tp),
            head_dim=int(cfg.head_dim),
            num_sm=torch.cuda.get_device_properties(model_runner.device).multi_processor_count,
        )
    except Exception as exc:  # SGLang's own size then; capture names the shortfall if any
        logger.warning("DDTree: FlashInfer workspace not sized for the tree verify (%s)", exc)
        return None


def flashinfer_workspace(original, self, model_runner, *args, **kwargs):
    """The target's FlashInfer workspace, grown to what an N+1-wide verify graph needs.

    SGLang sizes it from ``SGLANG_FLASHINFER_WORKSPACE_SIZE`` but, for Qwen targets, sets that
    to 512 MiB inside this very ``__init__``, over any user value; at N=256, bs=32 the split-KV
    buffers alone are 581 MiB and CUDA-graph capture fails. During the call, a set below the
    need is raised to it; the variable is restored afterwards.
    """
    if not _active() or getattr(model_runner, "is_draft_worker", False):
        return original(self, model_runner, *args, **kwargs)
    need = verify_workspace_need(model_runner)
    if need is None:
        return original(self, model_runner, *args, **kwargs)
    from sglang.srt.environ import envs

    field = envs.SGLANG_FLASHINFER_WORKSPACE_SIZE
    plain_set = type(field).set

    def set_at_least(value):
        plain_set(field, settings.flashinfer_workspace_bytes(int(value), need))

    before = int(field.get())
    with field.override(settings.flashinfer_workspace_bytes(before, need)):
        field.set = set_at_least  # the instance attribute shadows EnvField.set for this call
        try:
            result = original(self, model_runner, *args, **kwargs)
        finally:
            del field.set
        size = int(field.get())
    if size > before:
        logger.info(
            "DDTree: FlashInfer workspace %d MiB (verify needs %d MiB; SGLang's was %d MiB).",
            size >> 20,
            need >> 20,
            before >> 20,
        )
    return result


def internal_state(original, self, recv_req):
    """SGLang's internal state, plus the DDTree worker's policy and what it has learnt
    (``internal_states[0]["ddtree"]`` of ``/server_info``: read by ``check --url``)."""
    out = original(self, recv_req)
    summary = getattr(getattr(self, "draft_worker", None), "policy_summary", None)
    state = getattr(out, "internal_state", None)
    if _active() and callable(summary) and isinstance(state, dict):
        try:
            state["ddtree"] = summary()
        except Exception as exc:  # a report must never break /server_info
            state["ddtree"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


HOOKS = {
    "handle_dflash": handle_dflash,
    "tokens_per_req": tokens_per_req,
    "create_worker": create_worker,
    "dummy_verify": dummy_verify,
    "graph_spec_info": graph_spec_info,
    "validate_request": validate_request,
    "flashinfer_workspace": flashinfer_workspace,
    "internal_state": internal_state,
    "split_verify": split_verify,
}


def register_all(registry, hook_type) -> list[str]:
    """Register every DDTree hook as AROUND; returns the dotted targets."""
    for key, fn in HOOKS.items():
        registry.register(TARGETS[key], fn, hook_type.AROUND)
    return [TARGETS[k] for k in HOOKS]
