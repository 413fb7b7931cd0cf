"""The sync-free verify plan through SGLang 0.5.17's own FlashInfer updater and its own
``fast_prefill_plan`` (SGLang CPU env, Triton interpreter): tests/overlay/sglang_fastplan_probe.py.

What is real: ``FlashInferIndicesUpdaterPrefill.call_begin_forward`` (its dispatch on
``begin_forward.func``, the host layout it builds from ``seq_lens_cpu``), the DDTree verify
input's ``generate_attn_arg_prefill`` (kv indices by SGLang's Triton kernel), ``fast_prefill_plan``
and our mask packer. The FlashInfer wrapper is a stand-in with its CUDA-graph buffers and a
recording ``plan``; the kernels themselves run on the GPU only (docs/gpu-results.md, "Next GPU
sessions")."""

from __future__ import annotations

import os

import pytest
from test_sglang_hooks import _python, _run_script


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_DDTREE")}
    env["TRITON_INTERPRET"] = "1"
    return _run_script(_python(), "sglang_fastplan_probe.py", [], env)


@pytest.mark.parametrize("case, width, taker", [("tree", 6, "MaskedFastPlan"),
                                                ("width1", 1, "partial"),
                                                ("tree_fenced", 6, "FencedPlan"),
                                                ("width1_fenced", 1, "FencedPlan")])
def test_sglangs_updater_hands_the_fast_plan_the_host_layout(probe, case, width, taker):
    """Host bound 5, 2, 18 over device prefixes 5, 0, 17: the plan gets the bound + width as
    kv lengths, the device buffers the real lengths; one plan, no upstream plan() call."""
    r = probe[case]
    assert r["installed"] == [1, None] and r["begin_forward"] == taker and r["plans"] == 1
    host = [5 + width, 2 + width, 18 + width]
    plan = r["plan"]
    assert plan["qo_indptr_host"] == [0, width, 2 * width, 3 * width]
    assert plan["kv_lens_host"] == host
    assert plan["kv_indptr_host"] == [0, host[0], host[0] + host[1], sum(host)]
    assert plan["total_rows"] == 3 * width and plan["batch_size"] == 3
    assert plan["heads"] == [4, 2] and plan["page_size"] == 1 and plan["cuda_graph"] is True
    assert plan["causal"] is False  # as SGLang's call leaves plan()'s default
    assert plan["workspaces"] == ["float-ws", "int-ws", "pinned-ws"]
    assert r["device_kv_indptr"] == r["expected_kv_indptr"]  # prefix + width, from the device
    assert all(h >= d for h, d in zip(host, [5 + width, width, 17 + width], strict=True))
    assert r["kv_indices_ok"]


def test_the_tree_mask_lands_packed_in_the_wrappers_buffers(probe):
    """What FlashInfer's own plan would have put in custom_mask_buf / mask_indptr_buf
    (segment_packbits of the FULL_MASK over the device lengths), and nothing past it."""
    r = probe["tree"]
    assert r["mask_indptr"] == r["ref_mask_indptr"]
    assert r["mask_bytes_equal"] and r["mask_tail_untouched"]
    assert r["mask_padded_to_host"] == 6 * (5 + 2 + 18 + 3 * 6) + 3 * 36  # sized from the bound


@pytest.mark.parametrize("case", ["tree_padded", "tree_padded_fenced"])
def test_a_padded_verify_gives_the_device_the_plans_lengths(probe, case):
    """The padded verify (the bound on FlashInfer, the drafter elsewhere): the device's kv
    lengths are the plan's (host bound + width), its kv indices the slots up to them, and the
    packed mask is the padded layout's (the slots past each tree masked): FlashInfer's chunk
    count is then the same on both sides (tests/overlay/test_host_lens.py)."""
    r = probe[case]
    width, host = 6, [5 + 6, 2 + 6, 18 + 6]
    assert r["plans"] == 1 and r["plan"]["kv_lens_host"] == host
    assert r["device_kv_indptr"] == r["plan"]["kv_indptr_host"]  # device = host, unlike "tree"
    assert probe["tree"]["device_kv_indptr"] != probe["tree"]["plan"]["kv_indptr_host"]
    assert r["kv_indices_ok"]
    assert r["mask_indptr"] == r["ref_mask_indptr"]
    assert r["mask_bytes_equal"] and r["mask_tail_untouched"]
    assert r["mask_padded_to_host"] >= width * (5 + 2 + 18) + 3 * width * width


def test_a_padded_verify_in_a_graph_padded_batch_keeps_the_fill_rows(probe):
    """A replay padded to the captured bs (3 requests in the bs-4 graph): the padded prefixes
    cover the real rows, SGLang's fill length the padding row, on both sides."""
    r = probe["tree_padded_graph"]
    host = [5 + 6, 2 + 6, 18 + 6, 1 + 6]
    assert r["plans"] == 1 and r["plan"]["kv_lens_host"] == host
    assert r["device_kv_indptr"] == r["plan"]["kv_indptr_host"]
    assert r["kv_indices_ok"]
