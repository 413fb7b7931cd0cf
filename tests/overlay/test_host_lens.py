"""SGLANG_DFLASH_DDTREE_HOST_LENS: the switch, and what SGLang's scheduler decides from it.

With ``bound`` the DDTree worker tells SGLang that no attention backend of its round needs the
exact lengths on the host, so the scheduler stops copying them (and waiting for the copy) before
each round; the round's plans then read the reserved bound (``_verify_inputs``, ``_draft_topk``,
and ``fast_plan.bound_violation`` under ``FAST_PLAN=check``). The decision is SGLang's own
function on the real worker class (SGLang CPU env). That it pays was measured on a GPU
(docs/gpu-results.md §26). On FlashInfer it is wrong: FlashInfer's split-KV plan lays out each
row's partial outputs by the host length's chunk count and the kernel writes them by the device
length's, so a bound mixes the rows of a tree verify (real weights, §29; ``test_flashinfer_
split_kv_model`` below replays FlashInfer's own chunk arithmetic). Unset is ``auto``: the bound
off FlashInfer, exact lengths on it; ``bound`` with FlashInfer is refused.
"""

from __future__ import annotations

import os

import pytest
from test_sglang_hooks import _python, _run_script

from sglang_dflash.sglang_overlay import settings


def test_switch_defaults_to_auto_and_is_strict():
    env = settings.HOST_LENS_ENV
    assert settings.host_lens_from_env({}) == "auto"
    assert settings.host_lens_from_env({env: " bound "}) == "bound"
    assert settings.host_lens_from_env({env: "sync"}) == "sync"
    for bad in ("1", "on", "BOUND", "reserved", "auto"):
        with pytest.raises(settings.DDTreeConfigError) as exc:
            settings.host_lens_from_env({env: bad})
        assert "\n" not in str(exc.value) and "unset (auto)" in str(exc.value)
        assert "or sync" in str(exc.value)


def test_the_bound_needs_the_sync_free_plan_and_no_flashinfer():
    """FAST_PLAN=0 hands planning back to FlashInfer, which reads SGLang's host lengths; a
    FlashInfer backend's split-KV plans need them exact, so unset means sync there and an
    explicit bound is refused in one line."""
    for fast_plan in ("on", "check"):
        assert settings.resolve_host_lens("auto", fast_plan) == "bound"
        assert settings.resolve_host_lens("bound", fast_plan) == "bound"
        assert settings.resolve_host_lens("sync", fast_plan) == "sync"
        assert settings.resolve_host_lens("auto", fast_plan, flashinfer=True) == "sync"
        assert settings.resolve_host_lens("sync", fast_plan, flashinfer=True) == "sync"
        with pytest.raises(settings.DDTreeConfigError) as exc:
            settings.resolve_host_lens("bound", fast_plan, flashinfer=True)
        assert "\n" not in str(exc.value) and "§29" in str(exc.value)
        assert "the drafter's attention is FlashInfer too" in str(exc.value)
    assert settings.resolve_host_lens("bound", "off") == "sync"
    assert settings.resolve_host_lens("auto", "off") == "sync"


def test_an_explicit_bound_pads_a_flashinfer_verify_when_the_drafter_is_elsewhere():
    """The padded verify: a FlashInfer target, the drafter on another backend, the sync-free
    masked verify. Unset stays sync on FlashInfer (not yet judged on a GPU); every other
    combination is refused in one line that says which part is missing."""
    ok = settings.resolve_host_lens("bound", "on", flashinfer=True, draft_flashinfer=False)
    assert ok == "bound"
    assert settings.resolve_host_lens("auto", "on", True, draft_flashinfer=False) == "sync"
    for args, why in (((True, None, False), "the drafter's attention is FlashInfer too"),
                      ((True, True, False), "--speculative-draft-attention-backend triton"),
                      ((False, False, True), "attends the prefix without a mask")):
        draft, fast, split = args[1], "on", args[2]
        with pytest.raises(settings.DDTreeConfigError) as exc:
            settings.resolve_host_lens("bound", fast, True, draft, split)
        assert why in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(settings.DDTreeConfigError, match="FAST_PLAN=0 plans FlashInfer"):
        settings.resolve_host_lens("bound", "off", True, False)
    assert settings.draft_is_flashinfer({"flashinfer"}, None) is True
    assert settings.draft_is_flashinfer({"flashinfer"}, "triton") is False
    assert settings.draft_is_flashinfer({"triton"}, "flashinfer") is True
    assert settings.draft_is_flashinfer({"triton"}, None) is False
    line = settings.host_lens_line("bound", "on", flashinfer=True)
    assert "the tree verify padded to it on FlashInfer" in line


def test_flashinfer_backends_are_recognised_by_class():
    class FlashInferAttnBackend:  # SGLang's class name; a subclass counts too
        pass

    class Wrapped(FlashInferAttnBackend):
        pass

    class TritonAttnBackend:
        pass

    class HybridAttnBackend:  # SGLang's: --prefill-/--decode-attention-backend differ
        def __init__(self, prefill, decode):
            self.prefill_backend, self.decode_backend = prefill, decode

    assert settings.is_flashinfer_backend(FlashInferAttnBackend())
    assert settings.is_flashinfer_backend(Wrapped())
    assert not settings.is_flashinfer_backend(TritonAttnBackend())
    assert not settings.is_flashinfer_backend(None)
    assert settings.is_flashinfer_backend(HybridAttnBackend(TritonAttnBackend(), Wrapped()))
    assert not settings.is_flashinfer_backend(HybridAttnBackend(TritonAttnBackend(),
                                                                TritonAttnBackend()))


def test_the_start_up_line_says_which_and_why():
    host_lens_line = settings.host_lens_line
    assert host_lens_line("bound", "on").startswith("DDTree host lengths: bound (")
    assert "FAST_PLAN=0" in host_lens_line("sync", "off")
    assert f"{settings.HOST_LENS_ENV}=sync" in host_lens_line("sync", "on")
    assert "exact lengths" in host_lens_line("sync", "on", flashinfer=True)


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_DDTREE")}
    return _run_script(_python(), "sglang_host_lens_probe.py", [], env)


def test_sglang_copies_the_lengths_unless_the_round_plans_from_the_bound(probe):
    assert probe["flashinfer_needs"] is True  # what makes SGLang copy them at all
    # asked before SGLang builds the backends: the safe answer, and not kept
    assert probe["before_backends"] == "sync"
    # unset, FlashInfer backends built after the worker (SGLang's order): the exact lengths,
    # SGLang's own backends handed back unwrapped (§30: decided at construction, they were not)
    assert probe["unset_flashinfer"] is True and probe["unset_flashinfer_mode"] == "sync"
    assert probe["unset_flashinfer_wraps"] == [True, True]
    assert probe["triton_and_flashinfer_drafter"] == "sync"  # either one plans with FlashInfer
    # unset off FlashInfer: the bound, SGLang stops copying; sync asks for them again
    assert probe["unset_triton_mode"] == "bound"
    assert probe["unset_triton"] is False
    assert probe["sync_triton"] is probe["triton_needs"]  # unwrapped: SGLang decides as it would
    # an explicit bound with FlashInfer: refused in one line, not planned wrong
    assert probe["bound_flashinfer"].startswith(f"{settings.HOST_LENS_ENV}=bound with FlashInfer")
    # ... unless the drafter is on another backend: then the verify is padded to the bound
    assert probe["bound_flashinfer_target"] == ["bound", True]
    assert probe["unset_flashinfer_padded"] is False and probe["bound_triton_padded"] is False
    # P = bound - 8 = 32, 17, 82; the mask clears up to max(P - committed) = 12 columns a row
    assert probe["padded_prefixes"] == [[32, 17, 82], 131, 12]
    assert probe["padded_prefixes_no_reqs"] == [[32, 17, 82], 131, 82]


def test_two_batch_overlap_still_gets_the_lengths(probe):
    assert probe["unset_triton_tbo"] is True  # SGLang forces them there; the switch does not


# ---- why FlashInfer needs exact lengths: its own chunk arithmetic, replayed -----------------


def _chunk_size(packed_qo: int, host_kv: int, cta_tile_q: int, max_bs_if_split: int) -> int:
    """``PrefillBinarySearchKVChunkSize`` (flashinfer 0.6.15 scheduler.cuh), one request, page 1:
    the smallest chunk (>= 128) whose work items fit the split grid."""
    low, high = 128, max(host_kv, 1)
    while low < high:
        mid = (low + high) // 2
        if -(-packed_qo // cta_tile_q) * -(-host_kv // mid) > max_bs_if_split:
            low = mid + 1
        else:
            high = mid
    return low


def _merge_reads_own_rows(host_kv: int, dev_kv: int, qo_len: int, group: int = 2,
                          kv_heads: int = 4, sms: int = 132) -> bool:
    """One request under CUDA-graph planning: the plan lays row r's partials at
    ``r * ceil(host_kv / C) + t`` and the merge reads them there; the kernel
    (prefill.cuh, ``num_kv_chunks = ceil_div(kv_len, kv_chunk_size)`` with the DEVICE kv_len)
    writes them at ``r * ceil(dev_kv / C) + t``. True when every row's merge reads only what
    that row wrote (or nothing written at all)."""
    cta_tile_q = 16 if qo_len * group <= 16 else 64 if qo_len * group <= 64 else 128
    c = _chunk_size(qo_len * group, host_kv, cta_tile_q, 2 * sms // kv_heads)
    n_plan, n_kernel = -(-host_kv // c), -(-dev_kv // c)
    written = {}  # slot -> (row, chunk); the launched tiles are the plan's n_plan per row
    for r in range(qo_len):
        for t in range(n_plan):
            written[r * n_kernel + t] = (r, t)
    return all(written.get(r * n_plan + t, (r, t))[0] == r
               for r in range(qo_len) for t in range(n_plan))


def test_flashinfer_split_kv_model():
    """With the exact length every row reads its own partials; planned from a bound a
    chunk above the device length, a tree verify's rows (W > 1) read each other's — the §29
    failure — while a width-1 forward (the no-draft round) stays right."""
    prefix, w = 400, 65
    assert _merge_reads_own_rows(prefix + w, prefix + w, w)
    assert not _merge_reads_own_rows(prefix + 2 * w, prefix + w, w)  # the reserved bound
    assert _merge_reads_own_rows(prefix + 2 * w, prefix + 1, 1)


def test_a_padded_verify_reads_its_own_rows_from_the_bound():
    """The padded verify (``SGLANG_DFLASH_DDTREE_HOST_LENS=bound`` with FlashInfer, the drafter
    on another backend): the device kv lengths are the host bound too (the KV slots past the
    tree, masked), so the kernel's chunk count is the plan's for every prefix and bound."""
    w = 65
    cases = [(prefix, slack) for prefix in (1, 127, 128, 400, 1023, 4000)
             for slack in (0, 1, w, 2 * w, 700)]
    unpadded = [_merge_reads_own_rows(p + w + d, p + w, w) for p, d in cases]
    assert not all(unpadded)  # the bound alone mixes rows somewhere (§29)
    assert all(_merge_reads_own_rows(p + w + d, p + w + d, w) for p, d in cases)  # padded
