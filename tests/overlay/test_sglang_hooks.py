"""The plugin inside real SGLang 0.5.17 code (CPU env, subprocess per switch setting).

Needs the env built by tests/overlay/install_sglang_cpu.sh, named by SGLANG_DFLASH_SGLANG_SITE
(the venv directory); skipped with the reason when it is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from probe_output import PREFIX

HERE = Path(__file__).resolve().parent
SITE_ENV = "SGLANG_DFLASH_SGLANG_SITE"
BUDGET = "SGLANG_DFLASH_DDTREE_BUDGET"

TARGET_CFG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
DRAFT_CFG = {
    **TARGET_CFG,
    "architectures": ["DFlashDraftModel"],
    "num_hidden_layers": 1,
    "block_size": 16,
    "num_target_layers": 4,
    "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 511},
}


def _python() -> Path:
    site = os.environ.get(SITE_ENV, "").strip()
    if not site:
        pytest.skip(
            f"{SITE_ENV} is not set: build the env with tests/overlay/install_sglang_cpu.sh"
        )
    py = Path(site) / "bin" / "python"
    if not py.exists():
        pytest.skip(f"{SITE_ENV}={site} has no bin/python")
    return py


def _run_script(py: Path, script: str, args: list[str], env: dict, cwd: Path | None = None):
    """Run a probe script of this directory in the SGLang env; its ``PROBE-JSON`` object.

    This checkout's code goes first on PYTHONPATH, whatever checkout the venv's editable
    install points at (the env is a shared cache; CI's clone re-points it). The venv's
    dist-info keeps the entry point."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parents[1] / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [str(py), str(HERE / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=None if cwd is None else str(cwd),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(PREFIX)]
    assert lines, f"probe printed no result (rc={proc.returncode}): {proc.stderr[-2000:]}"
    data = json.loads(lines[-1][len(PREFIX) :])
    assert "crash" not in data, data.get("crash")
    return data


def _run_probe(py: Path, models: Path, budget: str | None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (BUDGET, "SGLANG_PLUGINS")}
    env.pop("SGLANG_DFLASH_DDTREE_POLICY", None)
    env.update(extra)
    if budget is not None:
        env[BUDGET] = budget
    return _run_script(py, "sglang_probe.py", [str(models / "target"), str(models / "draft")],
                       env, cwd=models)


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict:
    py = _python()
    models = tmp_path_factory.mktemp("models")
    for name, cfg in (("target", TARGET_CFG), ("draft", DRAFT_CFG)):
        (models / name).mkdir()
        (models / name / "config.json").write_text(json.dumps(cfg))
    with ThreadPoolExecutor(2) as pool:
        on = pool.submit(_run_probe, py, models, "31")
        off = pool.submit(_run_probe, py, models, None)
        return {"on": on.result(), "off": off.result()}


def _one_line_error(entry: dict, *needles: str) -> str:
    assert entry["widths"] is None, entry
    err = entry["error"]
    assert err is not None and err.endswith("|lines=1"), err
    for n in needles:
        assert n in err, err
    return err


def test_entry_point_registers_nine_around_hooks(probes):
    on = probes["on"]
    assert len(on["hooks"]) == 9
    assert on["patched"] == on["hooks"]
    assert all(on["wrapped"].values())


def test_switch_unset_registers_nothing(probes):
    off = probes["off"]
    assert off["hooks"] == [] and off["patched"] == []
    assert not any(off["wrapped"].values())
    assert off["args_default"]["widths"] == [16, None]
    assert off["worker"] == "DFlashWorkerV2"
    assert off["tokens_per_req"]["draft"] == 32  # stock passes the width through
    assert off["verify_input"] is None


def test_server_args_verify_width_is_budget_plus_one(probes):
    on = probes["on"]
    assert on["args_default"]["widths"] == [32, 16]  # N=31, B from the draft config
    assert on["args_block8"]["widths"] == [32, 8]  # B from --speculative-dflash-block-size
    assert on["args_budget3"]["widths"] == [4, 4]  # draft width min(B, N+1)
    assert on["args_backend_triton"]["widths"] == [32, 16]


def test_unset_at_call_time_is_stock(probes):
    on = probes["on"]
    assert on["args_unset"]["widths"] == [16, None]
    assert on["worker_unset"] == "DFlashWorkerV2"
    assert on["tokens_per_req"]["draft_unset"] == 32
    assert on["dummy_verify"]["target_unset"][3] is False
    assert on["graph_spec_info"]["target_unset"] == [32, False]
    assert on["validate"]["regex_unset"] is None


@pytest.mark.parametrize("label", ["zero", "big", "text"])
def test_invalid_budget_fails_with_one_line(probes, label):
    _one_line_error(probes["on"][f"args_invalid_{label}"], "SGLANG_DFLASH_DDTREE_BUDGET")


@pytest.mark.parametrize("backend", ["fa3", "fa4"])
def test_unsupported_backend_fails_with_one_line(probes, backend):
    _one_line_error(probes["on"][f"args_backend_{backend}"], "flashinfer or triton", backend)


def test_trtllm_target_fails_with_one_line(probes):
    # On a CPU box SGLang itself refuses trtllm_mha first (Blackwell only); either way one line.
    _one_line_error(probes["on"]["args_backend_trtllm_mha"])


def test_other_unsupported_combinations(probes):
    on = probes["on"]
    _one_line_error(on["args_page16"], "--page-size 1")
    _one_line_error(on["args_pp2"], "--pp-size 1")
    _one_line_error(on["args_ndt7"], "N+1=32")
    _one_line_error(on["args_block1"], "block size >= 2")
    _one_line_error(on["args_bad_plant"], "no-such-plant.json", "cannot read")
    assert probes["off"]["args_bad_plant"]["widths"] == [16, None]  # switch unset: ignored


def test_worker_class_and_widths(probes):
    on = probes["on"]
    assert on["verify_input"] == {
        "type": "DFLASH_VERIFY",
        "is_verify": True,
        "width": 5,
        "max_tree_depth": 5,
        "tree_topk": -1,
        "mask": True,
    }
    assert on["worker"] == "DDTreeWorkerV2"
    assert on["worker_eagle"] == "EAGLEWorkerV2"
    assert on["tokens_per_req"] == {"draft": 16, "target": 32, "draft_unset": 32}


def test_adaptive_budget_capture_uses_sglang_0_5_17_api(probes):
    """The calls adaptive DDTree makes to capture another verify width exist in this SGLang."""
    api = probes["on"]["adaptive_api"]
    assert all(api["override_fields"].values()), api["override_fields"]
    assert api["runner_kwargs"] == ["attn_backend", "speculative_num_draft_tokens"]
    assert api["attention_backend_kwargs"] == ["self", "init_new_workspace"]
    assert api["runner_reads_workspace_flag"]


def test_invalid_policy_fails_in_the_launcher_with_one_line(probes):
    _one_line_error(probes["on"]["args_bad_policy"], "SGLANG_DFLASH_DDTREE_POLICY",
                    "expected 'fixed'")
    assert probes["on"]["args_adaptive"]["widths"] == [32, 16]  # N+1 stays the largest width
    assert probes["off"]["args_bad_policy"]["error"] is None  # no budget: the hook is a no-op
    _one_line_error(probes["on"]["args_bad_nodraft"], "SGLANG_DFLASH_DDTREE_NODRAFT_STEPS",
                    "outside 1..64")
    assert probes["off"]["args_bad_nodraft"]["error"] is None


def test_cuda_graph_inputs_carry_mask_for_target_only(probes):
    on = probes["on"]
    assert on["dummy_verify"]["target"] == ["DFlashVerifyInput", 32, 32, True]
    assert on["dummy_verify"]["draft"] == ["DFlashVerifyInput", 16, 16, False]
    assert on["graph_spec_info"]["target"] == [32, True]
    assert on["graph_spec_info"]["draft"] == [16, False]
    assert on["graph_spec_info"]["target_width1"] == [1, False]
    off = probes["off"]
    assert off["graph_spec_info"]["target"] == [32, False]  # stock FlashInfer: no mask


def test_compaction_pool_is_resolved_after_sglang_allocates_it(probes):
    """SGLang 0.5.17 builds the draft worker before the KV pools (init_model_worker: draft
    worker, then init_memory_pools, then init_all_cuda_graphs), so the constructor must not
    read the pools; the compaction resolves at the first call with an allocator, once."""
    draft, pools, graphs = probes["on"]["init_order"]
    assert 0 <= draft < pools < graphs
    assert probes["on"]["init_reads_pools"] == []
    assert probes["on"]["compaction_lazy"] == {
        "before_pools": None, "unresolved": True, "after_pools": [None, None],
        "resolved_once": True}


def test_the_fast_verify_plan_matches_sglangs_flashinfer_backend(probes):
    """fast_plan.py installs SGLang's own ``fast_prefill_plan`` on the width-1 verify wrappers:
    its host layout is keyword-only, the updater takes it when ``begin_forward.func`` is that
    function (and then needs host seq_lens and the spec input's tokens per request, 1 at width
    1), SGLang plans fa2 and builds unmasked wrappers without a mask buffer, and 0.5.17 does not
    install it on verify wrappers itself."""
    facts = probes["on"]["fast_plan_facts"]
    assert facts["host_kwonly"] == ["kv_indptr_host", "kv_lens_host", "max_kv_len",
                                    "max_q_len", "qo_indptr_host"]
    assert all(facts[k] for k in ("prefill_backend_fa2", "dispatched_on_func",
                                  "host_seq_lens_required", "unmasked_wrapper_without_buf",
                                  "verify_not_installed_upstream")), facts
    assert probes["on"]["width1_tokens_per_req"] == 1


def test_fused_kv_compaction_only_for_the_stock_mha_pool(probes):
    """The one-launch compaction addresses MHATokenToKVPool's buffers as its tiled copy does;
    a pool that moves otherwise (page-major, HND, native move, its own move_kv_cache, no
    copy config) keeps SGLang's move_accept_tokens path."""
    assert probes["on"]["compaction_pool"] == {
        "mha": True, "hnd": False, "native": False, "no_config": False, "no_layers": False,
        "page_major": False, "own_move": False, "not_a_pool": False}


def test_grammar_requests_rejected_others_unchanged(probes):
    v = probes["on"]["validate"]
    assert v["plain"] is None
    assert "grammar" in v["regex"] and "regex" in v["regex"]
    assert "json_schema" in v["json"]
    assert "return_logprob" in v["logprob"]  # stock check still runs first
    assert probes["off"]["validate"]["regex"] is None


def test_flashinfer_workspace_raised_over_sglangs_qwen_size(probes):
    """SGLang sets 512 MiB inside FlashInferAttnBackend.__init__; a wider need wins, then the
    variable is restored. Stock DFlash, the draft worker and unknown needs are untouched."""
    fw = probes["on"]["flashinfer_workspace"]
    assert fw["wrapped"] is True
    assert fw["big"] == [(600 + 64) << 20, None]  # need + 64 MiB headroom; env restored
    assert fw["small"] == [512 << 20, None]  # SGLang's size stands
    assert fw["draft"] == [512 << 20, str(512 << 20)]  # original ran untouched
    assert fw["unknown"][0] == 512 << 20
    assert fw["big_unset"][0] == 512 << 20  # switch unset: stock
    assert probes["off"]["flashinfer_workspace"]["wrapped"] is False


def test_seeded_node_draws_equal_sglangs_deterministic_sampler():
    """Row by row, DDTree's seeded per-node draw (with SGLang's multinomial_with_seed) is the
    token SGLang's own sampler draws for the same logits, temperature, top-k/top-p, seed and
    position: what makes seeded T > 0 output identical to non-speculative decoding. SGLang's
    murmur hash is a Triton kernel: the probe runs it under the Triton interpreter (and without
    dynamo, which cannot trace the interpreter)."""
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHDYNAMO_DISABLE="1")  # sampler is compiled
    seeded = _run_script(_python(), "sglang_seeded_probe.py", [], env)
    assert seeded["simple_equal"] is True and seeded["filtered_equal"] is True
    assert seeded["distinct_draws"] > 3 and seeded["other_seed_differs"] is True


def test_worker_takes_the_seeded_path_only_with_seeds_and_without_min_p(probes):
    # seed, no seed, seed + min-p (SGLang's sampler refuses that), a batch info without the field
    assert probes["on"]["seeded_switch"] == [True, False, False, False]


def test_server_info_reports_the_ddtree_policy(probes):
    """``/server_info``'s internal state gains the worker's policy summary (check --url reads
    it), only in DDTree mode, and a failing summary never breaks the endpoint."""
    st = probes["on"]["internal_state"]
    assert st["wrapped"]
    assert st["with_worker"] == {"avg_spec_accept_length": 2.0, "ddtree": {
        "policy": "adaptive 1:0,3,8", "budget": 8, "slots": {"1": {"current": 3}}}}
    assert st["no_worker"] == {"avg_spec_accept_length": 2.0}
    assert st["broken"]["ddtree"] == {"error": "RuntimeError: boom"}
    assert st["unset"] == {"avg_spec_accept_length": 2.0}
