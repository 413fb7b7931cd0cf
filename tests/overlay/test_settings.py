"""The DDTree switch and startup validation (pure, no SGLang needed)."""

from __future__ import annotations

import pytest

from sglang_dflash.sglang_overlay import settings as s


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_unset_means_stock(raw):
    assert s.parse_budget(raw) is None


@pytest.mark.parametrize(("raw", "value"), [("1", 1), (" 31 ", 31), ("1023", 1023)])
def test_valid_budgets(raw, value):
    assert s.parse_budget(raw) == value


@pytest.mark.parametrize("raw", ["0", "1024", "-3", "abc", "1.5", "0x10"])
def test_invalid_budgets_one_line(raw):
    with pytest.raises(s.DDTreeConfigError) as exc:
        s.parse_budget(raw)
    msg = str(exc.value)
    assert s.BUDGET_ENV in msg and "\n" not in msg
    assert isinstance(exc.value, ValueError)  # SGLang's arg handling reports ValueErrors


def test_env_reading_uses_the_given_mapping():
    assert s.budget_from_env({s.BUDGET_ENV: "7"}) == 7
    assert s.budget_from_env({}) is None
    assert s.is_requested({s.BUDGET_ENV: "x"}) and not s.is_requested({s.BUDGET_ENV: " "})


@pytest.mark.parametrize(
    ("budget", "block", "verify", "draft", "depth"),
    [
        (31, 16, 32, 16, 15),
        (15, 16, 16, 16, 15),
        (3, 16, 4, 4, 3),
        (1, 16, 2, 2, 1),
        (1023, 16, 1024, 16, 15),
    ],
)
def test_widths(budget, block, verify, draft, depth):
    m = s.DDTreeMode(budget=budget, block_size=block)
    assert (m.verify_width, m.draft_width, m.max_depth) == (verify, draft, depth)
    # the draft block always fits the 2*(N+1) KV slots DFlash reserves ahead
    assert m.draft_width + m.verify_width <= 2 * m.verify_width


def _facts(**kw):
    base = dict(attention_backend="flashinfer")
    base.update(kw)
    return s.TargetFacts(**base)


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
def test_supported_backends(backend):
    assert s.unsupported_reason(_facts(attention_backend=backend), 8) is None


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"attention_backend": "fa3"}, "--attention-backend is fa3"),
        ({"attention_backend": "fa4"}, "fa4"),
        ({"attention_backend": "trtllm_mha"}, "trtllm_mha"),
        ({"prefill_attention_backend": "fa3"}, "--prefill-attention-backend"),
        ({"decode_attention_backend": "trtllm_mha"}, "--decode-attention-backend"),
        ({"attention_backend": None}, "none was resolved"),
        ({"page_size": 16}, "--page-size 1"),
        ({"pp_size": 2}, "--pp-size 1"),
        ({"enable_dp_attention": True}, "--enable-dp-attention"),
        ({"draft_window_size": 512}, "--speculative-draft-window-size"),
        ({"speculative_num_draft_tokens": 16}, "N+1=9"),
    ],
)
def test_unsupported_combinations(kw, needle):
    reason = s.unsupported_reason(_facts(**kw), 8)
    assert reason is not None and needle in reason and "\n" not in reason


def test_explicit_matching_verify_width_is_fine():
    assert s.unsupported_reason(_facts(speculative_num_draft_tokens=9), 8) is None


def test_hybrid_reason_names_the_arch():
    r = s.hybrid_target_reason(8, "Qwen3NextConfig")
    assert "Qwen3NextConfig" in r and "\n" not in r


# ---- FlashInfer workspace for the tree verify ------------------------------------------------

H200 = {"qo_heads": 32, "kv_heads": 8, "head_dim": 128, "num_sm": 132}  # Qwen3-8B shape


def test_workspace_need_matches_flashinfers_own_number_on_the_h200():
    # FlashInfer's error at N=256, bs=32 (H200, 2026-12-02, s2-runB/serve-ddtree-256.log,
    # summarised in docs/gpu-runs/2026-12-02/s2-runB.json):
    # "batch_prefill_tmp_v with size 603979776"; tmp_s adds 1/128 of it.
    need = s.flashinfer_verify_float_bytes(32, 257, **H200)
    assert need == 603979776 + 603979776 // 128
    assert need > 512 * s.MIB  # SGLang's fixed Qwen size: capture fails


def test_workspace_need_of_the_widths_that_captured():
    # N=56 and stock DFLASH (16) captured at bs=32 with SGLang's 512 MiB on the H200.
    for width in (16, 57, 65):
        assert s.flashinfer_verify_float_bytes(32, width, **H200) < 512 * s.MIB


def test_workspace_need_grows_with_width_and_batch():
    sizes = [s.flashinfer_verify_float_bytes(bs, w, **H200)
             for bs, w in ((1, 17), (8, 65), (32, 65), (32, 257), (64, 257))]
    assert sizes == sorted(sizes) and len(set(sizes[1:])) == 4
    assert sizes[0] == sizes[1]  # both below the SM-derived split batch (33 here)
    # small verifies are bounded by the SM-derived split batch, not by the rows
    small = s.flashinfer_verify_float_bytes(1, 2, **H200)
    assert small == 32 * 33 * 16 * 129 * 4  # padded batch 2*132//8 = 33, tile 16


@pytest.mark.parametrize(
    ("current", "need", "out"),
    [
        (512 << 20, 100 << 20, 512 << 20),  # enough: SGLang's size stands
        (512 << 20, 512 << 20, 512 << 20),
        (512 << 20, (580 << 20) + 5, (645 << 20)),  # need + 64 MiB, rounded up to a MiB
    ],
)
def test_workspace_bytes(current, need, out):
    assert s.flashinfer_workspace_bytes(current, need) == out
