"""How far the split tree verify's attention is from the masked one, kernel by kernel.

The split verify (``SGLANG_DFLASH_DDTREE_SPLIT_VERIFY=1``) computes a tree verify's attention as
FlashInfer's unmasked paged attention over the prefix (output rounded to the model dtype, plus
its base-2 log-sum-exp) folded with the W x W tree block by ``ddtree/tree_attn_triton.py``; the
masked verify it replaces is one FlashInfer custom-mask pass over prefix + tree. Both are the
same softmax; they round differently. This script tells the two apart on real kernels: for each
case (batch, width, prefix lengths, the 4B target's heads) the max error of each against an
fp32 reference, and how many output elements the split leaves bit-identical to the masked
pass. A split with errors at the masked pass's own level and few identical bits is right but
not bitwise (a seeded T > 0 run, which samples over sorted probabilities, then differs from
plain decoding); errors far above it are a bug.

``--prefix torch`` computes the prefix part with the torch reference instead of FlashInfer (no
GPU needed: under ``TRITON_INTERPRET=1`` the CPU tests run the whole script this way). Prints
one JSON object, also written to ``--out``; a bad flag exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# (batch, width, prefix lengths): one at a time and batched, the adaptive policy's widths,
# prefixes from a few tokens to past FlashInfer's first KV split
CASES = (
    (1, 17, (5,)),
    (1, 17, (1500,)),
    (8, 4, (5, 40, 300, 1500, 7, 64, 900, 2)),
    (8, 8, (5, 40, 300, 1500, 7, 64, 900, 2)),
    (8, 17, (5, 40, 300, 1500, 7, 64, 900, 2)),
    (32, 17, tuple(5 + 97 * i for i in range(32))),
)


@dataclass(frozen=True)
class CaseResult:
    """One case: each path's max |error| against fp32, and split vs masked bit for bit."""

    bs: int
    width: int
    max_prefix: int
    split_err: float
    masked_err: float | None  # None without FlashInfer (--prefix torch)
    split_vs_masked_max: float | None
    bit_identical_share: float | None  # of the output elements, split == masked exactly


def paged(parts: list, device):
    """A page-size-1 paged cache holding ``parts`` (one [n, Hkv, D] per request) back to back:
    (cache [N, 1, Hkv, D], kv_indptr int32, kv_indices int32)."""
    import torch

    cache = torch.cat(parts).unsqueeze(1).contiguous()
    lens = torch.tensor([p.shape[0] for p in parts], dtype=torch.int32)
    indptr = torch.zeros(len(parts) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    return cache, indptr.to(device), torch.arange(int(indptr[-1]), dtype=torch.int32,
                                                  device=device)


def flashinfer_attention(q, k_parts, v_parts, width: int, scale: float, mask=None):
    """FlashInfer's paged prefill (fa2, as SGLang plans it): unmasked with its base-2 lse, or
    with a flat custom mask. Returns (out, lse)."""
    import flashinfer
    import torch

    device = q.device
    bs = len(k_parts)
    kc, kv_indptr, kv_indices = paged(k_parts, device)
    vc, _, _ = paged(v_parts, device)
    qo_indptr = torch.arange(0, (bs + 1) * width, width, dtype=torch.int32, device=device)
    last = torch.ones(bs, dtype=torch.int32, device=device)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(qo_indptr, kv_indptr, kv_indices, last, q.shape[1], kc.shape[2], q.shape[2], 1,
           custom_mask=mask, q_data_type=q.dtype, kv_data_type=kc.dtype, sm_scale=scale)
    out, lse = w.run(q, (kc, vc), return_lse=True)
    return out, lse


def masked_flat(vis, prefixes) -> object:
    """The FULL_MASK the masked verify plans: each node's row over prefix (all visible) + W."""
    import torch

    rows = []
    for r, p in enumerate(prefixes):
        width = vis.shape[1]
        pre = torch.ones(width, p, dtype=torch.bool, device=vis.device)
        rows.append(torch.cat([pre, vis[r]], dim=1).reshape(-1))
    return torch.cat(rows)


def run_case(seed: int, bs: int, width: int, prefixes, use_flashinfer: bool, heads=32,
             kv_heads=8, dim=128) -> CaseResult:
    import torch

    from sglang_dflash.ddtree import tree_attn_triton as ta

    device = "cuda" if use_flashinfer else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, vis, kp, vp = ta.random_case(seed, prefixes[:bs], width, heads, kv_heads, dim,
                                          dtype, device)
    scale = dim ** -0.5
    want = ta.tree_attn_reference(q.float().cpu(), k.float().cpu(), v.float().cpu(),
                                  vis.cpu(), [t.float().cpu() for t in kp],
                                  [t.float().cpu() for t in vp], scale)
    masked = None
    if use_flashinfer:
        o_pre, lse_pre = flashinfer_attention(q, kp, vp, width, scale)
        parts_k = [torch.cat([kp[r], k[r * width:(r + 1) * width]]) for r in range(bs)]
        parts_v = [torch.cat([vp[r], v[r * width:(r + 1) * width]]) for r in range(bs)]
        masked, _ = flashinfer_attention(q, parts_k, parts_v, width, scale,
                                         mask=masked_flat(vis, prefixes[:bs]))
    else:
        o_pre, lse_pre = ta.prefix_attn_reference(q.cpu(), [t.cpu() for t in kp],
                                                  [t.cpu() for t in vp], width, scale)
        o_pre, lse_pre = o_pre.to(device), lse_pre.to(device)
    split = ta.tree_attn_triton(q, k, v, vis, o_pre, lse_pre.float(), scale)

    def err(x):
        return float((x.float().cpu() - want).abs().max())

    res = CaseResult(bs=bs, width=width, max_prefix=max(prefixes[:bs]), split_err=err(split),
                     masked_err=None, split_vs_masked_max=None, bit_identical_share=None)
    if masked is not None:
        same = (split.view(masked.shape) == masked).float().mean()
        res = CaseResult(**{**asdict(res), "masked_err": err(masked),
                            "split_vs_masked_max": float((split.float() - masked.float())
                                                         .abs().max()),
                            "bit_identical_share": round(float(same), 4)})
    return res


def verdict(results: list[CaseResult], slack: float = 4.0) -> str:
    """``bug`` when a split's error is more than ``slack`` x the masked pass's own (without
    FlashInfer: above 1e-3 in fp32); else ``identical`` when every element matches the masked
    pass bit for bit, ``rounding`` when some do not, ``correct`` when there was no masked pass
    to compare bits with (``--prefix torch``)."""
    for r in results:
        bound = 1e-3 if r.masked_err is None else slack * max(r.masked_err, 1e-6)
        if r.split_err > bound:
            return "bug"
    shares = [r.bit_identical_share for r in results if r.bit_identical_share is not None]
    if not shares:
        return "correct"
    return "identical" if all(s == 1.0 for s in shares) else "rounding"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", choices=("flashinfer", "torch"), default="flashinfer",
                    help="the prefix part: FlashInfer on the GPU, or the torch reference")
    ap.add_argument("--cases", type=int, default=len(CASES),
                    help=f"run the first N of the {len(CASES)} cases")
    ap.add_argument("--max-prefix", type=int, default=0,
                    help="cap every prefix length (0: as listed; the CPU tests keep it short)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not 1 <= args.cases <= len(CASES):
        print(f"gpu_split_numerics: --cases must be 1..{len(CASES)}, got {args.cases}",
              file=sys.stderr)
        return 2
    if args.max_prefix < 0:
        print(f"gpu_split_numerics: --max-prefix must be >= 0, got {args.max_prefix}",
              file=sys.stderr)
        return 2
    use_fi = args.prefix == "flashinfer"
    if use_fi:
        try:
            import flashinfer  # noqa: F401
            import torch
        except ImportError as exc:
            print(f"gpu_split_numerics: --prefix flashinfer needs FlashInfer ({exc}); "
                  "use --prefix torch", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("gpu_split_numerics: --prefix flashinfer needs a CUDA GPU; use --prefix torch",
                  file=sys.stderr)
            return 2
    results = []
    for i, (bs, width, prefixes) in enumerate(CASES[:args.cases]):
        if args.max_prefix:
            prefixes = tuple(min(p, args.max_prefix) for p in prefixes)
        results.append(run_case(i, bs, width, prefixes, use_fi))
    doc = {"prefix": args.prefix, "verdict": verdict(results),
           "cases": [asdict(r) for r in results]}
    text = json.dumps(doc, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
