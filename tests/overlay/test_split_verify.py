"""The split tree verify (``SGLANG_DFLASH_DDTREE_SPLIT_VERIFY=1``) through the real hook code in
the SGLang CPU env (tests/overlay/sglang_split_probe.py, Triton interpreter): the capture's spec
input, the prefix-only paged layout from SGLang's own kv-indices kernel, FlashInfer's
``forward_extend`` around hook against a stand-in paged wrapper (FlashInfer's kernels run on the
GPU only), and the refusals; plus the switch and its start-up refusal (pure)."""

from __future__ import annotations

import os

import pytest
from test_sglang_hooks import _python, _run_script

from sglang_dflash.sglang_overlay import settings


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_DDTREE")}
    env |= {"TRITON_INTERPRET": "1", settings.BUDGET_ENV: "4", settings.SPLIT_VERIFY_ENV: "1"}
    return _run_script(_python(), "sglang_split_probe.py", [], env)


def test_a_split_capture_has_no_mask_and_reads_the_runners_visibility_buffer(probe):
    cap = probe["capture"]
    assert cap["type"] == "DDTreeVerifyInput" and cap["custom_mask"] is None
    assert cap["vis_shape"] == [2, 5, 5]  # the captured batch (10 tokens of width 5)
    assert cap["buf_numel"] == 4 * 5 * 5 and cap["vis_is_buf_view"] and cap["again_same_buf"]
    # width 1 stays stock DFLASH's causal capture, without a buffer
    assert probe["capture_width1"] == {"type": "DFlashVerifyInput", "custom_mask": None,
                                       "has_buf": False}


def test_a_round_fills_the_buffer_of_the_runner_that_replays_it(probe):
    assert probe["fill"] == {"copied": True, "tail_untouched": True,
                             "other_width_untouched": True}


def test_the_paged_attention_covers_the_prefixes_only(probe):
    lay = probe["layout"]
    assert lay["kv_indptr"] == [0, 6, 7, 16] and lay["qo_indptr"] == [0, 5, 10, 15]
    assert lay["mask"] is None and lay["kv_indices"] == lay["expected_indices"]


def test_the_split_forward_is_the_masked_attention_and_saves_the_verify_kv(probe):
    fwd = probe["forward"]
    assert fwd["shape"] == [15, 64] and fwd["max_err"] < 1e-5 and probe["finite"]
    assert fwd["upstream_calls"] == 0
    assert fwd["wrapper"] == [{"causal": False, "sm_scale": 0.25, "q_shape": [15, 4, 16]}]
    assert fwd["saved_at"] and fwd["kv_in_cache"]
    assert probe["plain_goes_upstream"]


def test_what_cannot_be_split_is_refused_with_one_line(probe):
    r = probe["refusals"]
    assert r["softcap"].endswith("cannot split this target's verify: logit soft-capping (30.0); "
                                 "unset it")
    assert "a sliding window (4)" in r["window"] and "a cross-attention layer" in r["cross"]
    assert "a torch.float8_e4m3fn KV cache under torch.float32 attention" in r["fp8"]


def test_switch_and_startup_refusal():
    env = settings.SPLIT_VERIFY_ENV
    assert settings.split_verify_from_env({}) is False
    assert settings.split_verify_from_env({env: "1"}) is True
    with pytest.raises(settings.DDTreeConfigError, match="expected 1 \\(on\\) or 0"):
        settings.split_verify_from_env({env: "yes"})
    facts = settings.TargetFacts(attention_backend="triton", split_verify=True)
    assert "use --attention-backend flashinfer" in settings.unsupported_reason(facts, 8)
    ok = settings.TargetFacts(attention_backend="flashinfer", split_verify=True)
    assert settings.unsupported_reason(ok, 8) is None
    assert settings.unsupported_reason(settings.TargetFacts(attention_backend="triton"), 8) is None
