"""Runs INSIDE the SGLang CPU env (a subprocess of the tests): exercises the real SGLang 0.5.17
code paths the DDTree plugin hooks and prints one JSON object of observations.

Usage: python sglang_probe.py <model_dir> <draft_dir>
The plugin is loaded through SGLang's own ``load_plugins()`` (real entry-point discovery), so
whether hooks exist depends on SGLANG_DFLASH_DDTREE_BUDGET in this process's environment.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

from probe_output import report  # a sibling: the scripts run from this directory

BUDGET = "SGLANG_DFLASH_DDTREE_BUDGET"


def server_args(model, draft, **kw):
    """(ServerArgs or None, error line or None) through SGLang's real __post_init__ path."""
    from sglang.srt.server_args import ServerArgs

    args = dict(
        model_path=model,
        speculative_algorithm="DFLASH",
        speculative_draft_model_path=draft,
        attention_backend="flashinfer",
        device="cuda",
        skip_tokenizer_init=True,
        load_format="dummy",
    )
    args.update(kw)
    try:
        return ServerArgs(**args), None
    except Exception as exc:
        lines = str(exc).splitlines()
        return None, f"{type(exc).__name__}: {lines[0] if lines else ''}|lines={len(lines)}"


def widths(sa):
    return (
        None if sa is None else [sa.speculative_num_draft_tokens, sa.speculative_dflash_block_size]
    )


def with_env(value, fn):
    old = os.environ.get(BUDGET)
    if value is None:
        os.environ.pop(BUDGET, None)
    else:
        os.environ[BUDGET] = value
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop(BUDGET, None)
        else:
            os.environ[BUDGET] = old


def main(model: str, draft: str) -> dict:
    import torch
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()
    out: dict = {"hooks": sorted(HookRegistry._hooks), "patched": sorted(HookRegistry._patched)}

    import sglang.srt.arg_groups.speculative_hook as sh
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative import dflash_utils, spec_info

    out["wrapped"] = {
        "handle_dflash": hasattr(sh._handle_dflash, "__wrapped__"),
        "create_worker": hasattr(spec_info.SpeculativeAlgorithm.create_worker, "__wrapped__"),
        "get_spec_info": hasattr(DecodeCudaGraphRunner.get_spec_info, "__wrapped__"),
    }

    # --- argument handling (the launcher's path) -------------------------------------------
    sa, err = server_args(model, draft)
    out["args_default"] = {"widths": widths(sa), "error": err}
    sa_b8, err = server_args(model, draft, speculative_dflash_block_size=8)
    out["args_block8"] = {"widths": widths(sa_b8), "error": err}
    small, err = with_env("3", lambda: server_args(model, draft))
    out["args_budget3"] = {"widths": widths(small), "error": err}
    for label, value in [("zero", "0"), ("big", "1024"), ("text", "many")]:
        s, err = with_env(value, lambda: server_args(model, draft))
        out[f"args_invalid_{label}"] = {"widths": widths(s), "error": err}
    for backend in ["fa3", "fa4", "trtllm_mha"]:
        s, err = server_args(model, draft, attention_backend=backend)
        out[f"args_backend_{backend}"] = {"widths": widths(s), "error": err}
    s, err = server_args(model, draft, attention_backend="triton")
    out["args_backend_triton"] = {"widths": widths(s), "error": err}
    s, err = server_args(model, draft, page_size=16)
    out["args_page16"] = {"widths": widths(s), "error": err}
    s, err = server_args(model, draft, speculative_num_draft_tokens=7)
    out["args_ndt7"] = {"widths": widths(s), "error": err}
    s, err = server_args(model, draft, pp_size=2)
    out["args_pp2"] = {"widths": widths(s), "error": err}
    s, err = server_args(model, draft, speculative_dflash_block_size=1)
    out["args_block1"] = {"widths": widths(s), "error": err}
    for label, value in [("bad_policy", "greedy"), ("adaptive", "adaptive")]:
        os.environ["SGLANG_DFLASH_DDTREE_POLICY"] = value
        s, err = server_args(model, draft)
        out[f"args_{label}"] = {"widths": widths(s), "error": err}
    os.environ.pop("SGLANG_DFLASH_DDTREE_POLICY")
    os.environ["SGLANG_DFLASH_DDTREE_NODRAFT_STEPS"] = "0"
    try:
        s, err = server_args(model, draft)
    finally:
        del os.environ["SGLANG_DFLASH_DDTREE_NODRAFT_STEPS"]
    out["args_bad_nodraft"] = {"widths": widths(s), "error": err}
    os.environ["SGLANG_DFLASH_DDTREE_PLANT"] = os.path.join(model, "no-such-plant.json")
    try:
        s, err = server_args(model, draft)
    finally:
        del os.environ["SGLANG_DFLASH_DDTREE_PLANT"]
    out["args_bad_plant"] = {"widths": widths(s), "error": err}
    stock, err = with_env(None, lambda: server_args(model, draft))
    out["args_unset"] = {"widths": widths(stock), "error": err}

    # --- worker class, draft/target widths, warm-up inputs, graph spec info ----------------
    algo = spec_info.SpeculativeAlgorithm.DFLASH
    eagle = spec_info.SpeculativeAlgorithm.EAGLE
    out["worker"] = None if sa is None else algo.create_worker(sa).__name__
    out["worker_unset"] = (
        None if sa is None else with_env(None, lambda: algo.create_worker(sa).__name__)
    )
    out["worker_eagle"] = None if sa is None else eagle.create_worker(sa).__name__
    if sa is not None:
        from sglang.srt.runtime_context import publish

        publish(sa, role="scheduler")
        out["tokens_per_req"] = {
            "draft": algo.get_num_tokens_per_req_for_target_verify(32, True),
            "target": algo.get_num_tokens_per_req_for_target_verify(32, False),
            "draft_unset": with_env(
                None, lambda: algo.get_num_tokens_per_req_for_target_verify(32, True)
            ),
        }
        buf = torch.ones(64, dtype=torch.bool)

        def dummy(is_draft, width):
            info = spec_info.create_dummy_verify_input(algo, sa, buf, width, is_draft)
            return [
                type(info).__name__,
                info.draft_token_num,
                info.num_tokens_per_req,
                info.custom_mask is not None,
            ]

        out["dummy_verify"] = {
            "target": dummy(False, 32),
            "draft": dummy(True, 16),
            "target_unset": with_env(None, lambda: dummy(False, 32)),
        }

        def graph_info(is_draft, width=None):
            runner = object.__new__(DecodeCudaGraphRunner)
            runner.model_runner = SimpleNamespace(
                spec_algorithm=algo,
                is_draft_worker=is_draft,
                # stock DFlash captures FlashInfer verify graphs WITHOUT a mask
                attn_backend=type("FlashInferAttnBackend", (), {})(),
            )
            runner.buffers = SimpleNamespace(custom_mask=buf)
            runner.captured_req_width = width or (16 if is_draft else 32)
            runner._capture_ragged_verify_layout = lambda n: None
            info = runner.get_spec_info(runner.captured_req_width)
            return [info.draft_token_num, info.custom_mask is buf]

        out["graph_spec_info"] = {
            "target": graph_info(False),
            "draft": graph_info(True),
            "target_unset": with_env(None, lambda: graph_info(False)),
            "target_width1": graph_info(False, 1),  # the no-draft verify: causal, no mask
        }

    # --- which KV pools the one-launch compaction takes (the rest keep SGLang's move) -----
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, PageMajorMHATokenToKVPool

    from sglang_dflash.sglang_overlay.worker import compaction_pool

    def pool(cls=MHATokenToKVPool, **over):
        p = object.__new__(cls)
        fields = {"use_hnd": False, "use_native_move_kv_cache": False, "layer_num": 4,
                  "_kv_copy_config": {"bytes_per_tile": 128, "byte_tiles": 2},
                  "data_ptrs": object(), "data_strides": object()}
        for k, v in {**fields, **over}.items():
            setattr(p, k, v)
        return compaction_pool(p) is p

    class OwnMove(MHATokenToKVPool):
        def move_kv_cache(self, tgt_loc, src_loc):
            return None

    out["compaction_pool"] = {
        "mha": pool(), "hnd": pool(use_hnd=True), "native": pool(use_native_move_kv_cache=True),
        "no_config": pool(_kv_copy_config=None), "no_layers": pool(layer_num=0),
        "page_major": pool(PageMajorMHATokenToKVPool), "own_move": pool(OwnMove),
        "not_a_pool": compaction_pool(object()) is not None,
    }

    # --- the target's KV pool exists only after the draft worker's constructor ------------
    # (H200, 2026-12-04: resolving the compaction pool in __init__ read a None allocator and
    # every DDTree server failed to start.)
    import inspect

    from sglang.srt.managers.scheduler import Scheduler

    from sglang_dflash.sglang_overlay import worker as worker_mod

    src = inspect.getsource(Scheduler.init_model_worker)
    out["init_order"] = [src.find("self.maybe_init_draft_worker()"),
                         src.find("self.init_memory_pools()"),
                         src.find("self.init_all_cuda_graphs()")]
    w = object.__new__(worker_mod.DDTreeWorkerV2)
    w._compaction = worker_mod._UNRESOLVED
    w.model_runner = SimpleNamespace(token_to_kv_pool_allocator=None)
    before = w._compaction_kernel()
    unresolved = w._compaction is worker_mod._UNRESOLVED
    calls = []
    w.model_runner = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(
        get_kvcache=lambda: calls.append(1) or object()))
    after = [w._compaction_kernel(), w._compaction_kernel()]
    out["compaction_lazy"] = {"before_pools": before, "unresolved": unresolved,
                              "after_pools": after, "resolved_once": len(calls) == 1}
    out["init_reads_pools"] = [name for name in ("token_to_kv_pool_allocator",
                                                 "token_to_kv_pool", "req_to_token_pool")
                               if name in inspect.getsource(worker_mod.DDTreeWorkerV2.__init__)]

    # --- what the sync-free width-1 verify plan (fast_plan.py) relies on -------------------
    from sglang.srt.layers.attention import flashinfer_backend as fib

    sig = inspect.signature(fib.fast_prefill_plan)
    fb_src = inspect.getsource(fib.FlashInferAttnBackend)
    updater_src = inspect.getsource(fib)
    out["fast_plan_facts"] = {
        "host_kwonly": sorted(n for n, prm in sig.parameters.items()
                              if prm.kind is inspect.Parameter.KEYWORD_ONLY),
        "prefill_backend_fa2": 'self.prefill_backend = "fa2"' in fb_src,
        "dispatched_on_func": "begin_forward.func is fast_prefill_plan" in updater_src,
        "host_seq_lens_required": "fast_prefill_plan replay requires host-known seq_lens_cpu"
        in updater_src,
        "unmasked_wrapper_without_buf": '"custom_mask_buf": self.cuda_graph_custom_mask'
        in inspect.getsource(fib.FlashInferAttnBackend._create_prefill_wrappers),
        "verify_not_installed_upstream": "prefill_cuda_graph_metadata[bs]:\n"
        not in fb_src and "for w in self.prefill_cuda_graph_metadata" not in fb_src,
    }
    out["width1_tokens_per_req"] = worker_mod.DDTreeVerifyInput(
        draft_token=torch.zeros(2, dtype=torch.long), positions=torch.zeros(2, dtype=torch.long),
        draft_token_num=1, custom_mask=None,
    ).num_tokens_per_req

    # --- the DDTree verify input as the attention backends see it ------------------------
    out["verify_input"] = None
    if out["hooks"]:
        from sglang_dflash.ddtree.tree import build_tree
        from sglang_dflash.sglang_overlay.verify import build_verify_tensors
        from sglang_dflash.sglang_overlay.worker import DDTreeVerifyInput, seeded_sampling

        def info(seed, min_p):
            return SimpleNamespace(sampling_seed=seed, need_min_p_sampling=min_p)

        out["seeded_switch"] = [seeded_sampling(info(torch.tensor([1]), False)),
                                seeded_sampling(info(None, False)),
                                seeded_sampling(info(torch.tensor([1]), True)),
                                seeded_sampling(SimpleNamespace(need_min_p_sampling=False))]

        logp = torch.log_softmax(torch.randn(1, 4, 8), -1).sort(-1, descending=True).values
        ids = torch.arange(8).repeat(1, 4, 1)
        tree = build_tree(logp, ids, torch.tensor([3]), torch.tensor([10]), 4)
        vt = build_verify_tensors(tree, torch.tensor([10]), 12)
        vi = DDTreeVerifyInput(
            draft_token=vt.tokens,
            positions=vt.positions,
            draft_token_num=5,
            custom_mask=vt.custom_mask,
        )
        vi.tree = tree
        out["verify_input"] = {
            "type": vi.spec_input_type.name,
            "is_verify": vi.is_verify_input(),
            "width": vi.num_tokens_per_req,
            "max_tree_depth": vi.max_tree_depth,
            "tree_topk": vi.tree_topk,
            "mask": vi.custom_mask is not None,
        }

    # --- FlashInfer workspace: SGLang's in-__init__ Qwen size is raised, then restored -----
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    from sglang_dflash.sglang_overlay import hooks as dd_hooks

    field = envs.SGLANG_FLASHINFER_WORKSPACE_SIZE

    def sglang_like_init(self, model_runner):
        field.set(512 * 1024 * 1024)  # what SGLang's __init__ does for Qwen targets
        return field.get()  # what it then allocates

    def workspace(need, is_draft=False):
        dd_hooks.verify_workspace_need = lambda runner: need
        runner = SimpleNamespace(is_draft_worker=is_draft)
        seen = dd_hooks.flashinfer_workspace(sglang_like_init, None, runner)
        return [seen, os.environ.get("SGLANG_FLASHINFER_WORKSPACE_SIZE")]

    out["flashinfer_workspace"] = {
        "wrapped": hasattr(FlashInferAttnBackend.__init__, "__wrapped__"),
        "big": workspace(600 * 1024 * 1024),
        "small": workspace(100 * 1024 * 1024),
        "draft": workspace(600 * 1024 * 1024, is_draft=True),
        "unknown": workspace(None),
        "big_unset": with_env(None, lambda: workspace(600 * 1024 * 1024)),
    }
    os.environ.pop("SGLANG_FLASHINFER_WORKSPACE_SIZE", None)

    # --- /server_info's internal state: the DDTree policy summary is added ------------------
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler

    def fake_original(self, recv_req):
        return GetInternalStateReqOutput(internal_state={"avg_spec_accept_length": 2.0})

    class FakeWorker:
        def policy_summary(self):
            return {"policy": "adaptive 1:0,3,8", "budget": 8, "slots": {"1": {"current": 3}}}

    class Broken:
        def policy_summary(self):
            raise RuntimeError("boom")

    def state_of(worker):
        res = dd_hooks.internal_state(fake_original, SimpleNamespace(draft_worker=worker), None)
        return res.internal_state

    out["internal_state"] = {
        "wrapped": hasattr(Scheduler.get_internal_state, "__wrapped__"),
        "with_worker": state_of(FakeWorker()),
        "no_worker": state_of(None),
        "broken": state_of(Broken()),
        "unset": with_env(None, lambda: state_of(FakeWorker())),
    }

    # --- request admission -------------------------------------------------------------------
    from sglang.srt.sampling.sampling_params import SamplingParams

    def req(**sp):
        return SimpleNamespace(
            return_logprob=sp.pop("logprob", False),
            return_hidden_states=False,
            sampling_params=SamplingParams(**sp),
        )

    out["validate"] = {
        "plain": dflash_utils.validate_dflash_request(req(), True),
        "regex": dflash_utils.validate_dflash_request(req(regex="a+"), True),
        "json": dflash_utils.validate_dflash_request(req(json_schema="{}"), True),
        "logprob": dflash_utils.validate_dflash_request(req(logprob=True), True),
        "regex_unset": with_env(
            None, lambda: dflash_utils.validate_dflash_request(req(regex="a+"), True)
        ),
    }
    # --- what adaptive DDTree calls to capture one more verify width (worker._init_budget_targets)
    import inspect

    from sglang.srt.arg_groups.arg_utils import namespace_of
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    nsmap = namespace_of(ServerArgs)
    out["adaptive_api"] = {
        "override_fields": {
            f: nsmap.get(f)
            for f in ("speculative_num_draft_tokens", "cuda_graph_bs_decode", "disable_cuda_graph")
        },
        "runner_kwargs": sorted(
            p for p in inspect.signature(DecodeCudaGraphRunner.__init__).parameters
            if p in ("attn_backend", "speculative_num_draft_tokens")
        ),
        "attention_backend_kwargs": list(
            inspect.signature(ModelRunner._get_attention_backend).parameters
        ),
        "runner_reads_workspace_flag": "self.init_new_workspace" in inspect.getsource(ModelRunner),
    }
    return out


if __name__ == "__main__":
    report(main, sys.argv[1], sys.argv[2])
