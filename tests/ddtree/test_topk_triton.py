"""The fused row logsumexp equals torch's float32 logsumexp of the same half-precision rows.

Under the Triton interpreter without a GPU (bf16 and fp16 rows, a vocabulary that is not a
multiple of the block, -inf entries, a row of only -inf); a subprocess lowers it for sm_90.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")
from .triton_env import DEV, import_triton_module, lower_for_sm90  # noqa: E402

tk = import_triton_module("sglang_dflash.ddtree.topk_triton")
pytestmark = pytest.mark.usefixtures("triton_interpret")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [7, 1024, 2500])
def test_row_logsumexp_equals_torch_float(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn((5, vocab), generator=g) * 6).to(dtype)
    x[1, : vocab // 2] = float("-inf")  # masked vocabulary entries
    x[3] = float("-inf")  # nothing possible: -inf, not NaN
    ref = torch.logsumexp(x.float(), dim=-1, keepdim=True)
    got = tk.row_logsumexp(x.to(DEV)).cpu()
    assert got.dtype == torch.float32 and got.shape == (5, 1)
    assert torch.isneginf(got[3]).all()
    fin = torch.isfinite(ref)
    assert torch.allclose(got[fin], ref[fin], rtol=0, atol=1e-5)


def test_row_logsumexp_reads_a_strided_view():
    """Rows of a wider buffer (row stride > vocab), as a slice of the head's logits."""
    big = torch.randn((4, 3000)).to(torch.bfloat16)
    view = big[:, :2000]
    ref = torch.logsumexp(view.float(), dim=-1, keepdim=True)
    assert torch.allclose(tk.row_logsumexp(view.to(DEV)).cpu(), ref, rtol=0, atol=1e-5)


def test_kernel_compiles_for_sm90():
    code = """
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from sglang_dflash.ddtree import topk_triton as tk
        sig = {"x_ptr": "*bf16", "out_ptr": "*fp32", "stride": "i32", "V": "constexpr",
               "BLOCK": "constexpr"}
        k = triton.compile(ASTSource(tk._row_lse_kernel, sig,
                                     constexprs={"V": 151936, "BLOCK": tk.BLOCK}),
                           target=GPUTarget("cuda", 90, 32))
        assert k.asm["cubin"]
        assert {p.name for p in tk._row_lse_kernel.params if p.do_not_specialize} == {
            "stride"}
        print("ok")
    """
    lower_for_sm90(code)
