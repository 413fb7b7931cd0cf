"""Benchmark: batched DDTree tree build vs the per-request Python heap reference.

Both paths start from the same random drafter logits [bs*(B-1), V] on --device and include the
top-K log-prob head. The batched path then builds every tree on the device with torch ops; the
heap path copies the top-K to the host (a sync) and runs the heapq reference per request, as the
liranringel/ddtree reference does. Prints one JSON document.

    python benchmarks/tree_build.py --device cpu
    python benchmarks/tree_build.py --device cuda --check-sync
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--block", type=int, default=16, help="B; the tree depth is L = B-1")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="logits dtype (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--logit-scale", type=float, default=4.0)
    p.add_argument("--seq-len", type=int, default=1024, help="prefix length for the mask timing")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--check-sync", action="store_true",
                   help="cuda: run the batched path once under set_sync_debug_mode('error')")
    p.add_argument("--cuda-graph", action="store_true",
                   help="cuda: also time top-K + build captured in one CUDA graph")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _timer(device: str, torch):
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def measure(fn, repeats: int, warmup: int) -> tuple[float, object]:
        out = None
        for _ in range(warmup):
            out = fn()
        sync()
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            out = fn()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), out

    return measure


def _machine(torch, device: str) -> dict:
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    return info


def _bench_one(torch, args, measure, logits, bs: int, n: int) -> dict:
    """Time one (batch size, budget) point; every closure binds this call's locals."""
    from sglang_dflash.ddtree.mask import full_mask
    from sglang_dflash.ddtree.reference import build_tree_reference
    from sglang_dflash.ddtree.topk import topk_logprobs
    from sglang_dflash.ddtree.tree import build_tree

    dev, depth, k = logits.device, args.block - 1, min(n, args.vocab)
    roots = torch.zeros(bs, dtype=torch.long, device=dev)
    seq_lens = torch.full((bs,), args.seq_len, dtype=torch.long, device=dev)

    def heap_trees(lp, ids):
        lp_h, ids_h = lp.view(bs, depth, k).tolist(), ids.view(bs, depth, k).tolist()
        return [build_tree_reference(lp_h[b], ids_h[b], 0, args.seq_len, n, f32=False)
                for b in range(bs)]

    def batched_tree(lp, ids):
        return build_tree(lp.view(bs, depth, k), ids.view(bs, depth, k), roots, seq_lens, n)

    lp, ids = topk_logprobs(logits, k)
    t_topk, _ = measure(lambda: topk_logprobs(logits, k), args.repeats, args.warmup)
    t_build, tree = measure(lambda: batched_tree(lp, ids), args.repeats, args.warmup)
    t_batched, _ = measure(lambda: batched_tree(*topk_logprobs(logits, k)),
                           args.repeats, args.warmup)
    t_heap_build, _ = measure(lambda: heap_trees(lp.cpu(), ids.cpu()), args.repeats, 1)
    t_heap, ref = measure(lambda: heap_trees(*topk_logprobs(logits, k)), args.repeats, 1)
    t_mask, _ = measure(lambda: full_mask(tree, seq_lens, seq_lens_sum=bs * args.seq_len),
                        args.repeats, args.warmup)
    # correctness (untimed): the float32-exact reference must give the very same trees
    lp_h, ids_h = lp.view(bs, depth, k).tolist(), ids.view(bs, depth, k).tolist()
    exact = [build_tree_reference(lp_h[b], ids_h[b], 0, args.seq_len, n) for b in range(bs)]
    same = all(
        tree.tokens[b, : len(r.tokens)].tolist() == r.tokens
        and tree.parents[b, : len(r.parents)].tolist() == r.parents
        for b, r in enumerate(exact)
    )
    del ref
    graph = _graph_time(torch, args, measure, lambda: batched_tree(*topk_logprobs(logits, k)))
    return {
        "bs": bs, "budget": n, "K": k, "L": depth,
        "topk_ms": round(t_topk, 3),
        "build_ms": round(t_build, 3),
        "batched_total_ms": round(t_batched, 3),
        "heap_build_ms": round(t_heap_build, 3),
        "heap_total_ms": round(t_heap, 3),
        "speedup_total": round(t_heap / t_batched, 2),
        "speedup_build": round(t_heap_build / t_build, 2),
        "full_mask_ms": round(t_mask, 3),
        "trees_equal": same,
        **graph,
    }


def _graph_time(torch, args, measure, fn) -> dict:
    """cuda + --cuda-graph: capture top-K + build once and time graph replays."""
    if not (args.cuda_graph and args.device == "cuda"):
        return {}
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        t_replay, _ = measure(graph.replay, args.repeats, args.warmup)
        return {"graph_total_ms": round(t_replay, 3)}
    except Exception as exc:  # report, don't abort the sweep
        return {"graph_error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}


def _sync_check(torch, args, logits) -> dict:
    """Run the batched path once with CUDA sync debugging set to raise."""
    from sglang_dflash.ddtree.mask import full_mask
    from sglang_dflash.ddtree.topk import topk_logprobs
    from sglang_dflash.ddtree.tree import build_tree

    bs, n, depth = args.bs[-1], args.budgets[-1], args.block - 1
    roots = torch.zeros(bs, dtype=torch.long, device=logits.device)
    seq_lens = torch.full((bs,), args.seq_len, dtype=torch.long, device=logits.device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        lp, ids = topk_logprobs(logits, n)
        tree = build_tree(lp.view(bs, depth, n), ids.view(bs, depth, n), roots, seq_lens, n)
        full_mask(tree, seq_lens, seq_lens_sum=bs * args.seq_len)
        return {"sync_free": True}
    except RuntimeError as exc:
        return {"sync_free": False, "sync_error": str(exc).splitlines()[0]}
    finally:
        torch.cuda.set_sync_debug_mode("default")


def run(args: argparse.Namespace) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    dtype = getattr(torch, args.dtype or ("bfloat16" if dev == "cuda" else "float32"))
    measure = _timer(dev, torch)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    results, logits = [], None
    for bs in args.bs:
        logits = (torch.randn(bs * (args.block - 1), args.vocab, generator=gen, device=dev)
                  * args.logit_scale).to(dtype)
        results.extend(_bench_one(torch, args, measure, logits, bs, n) for n in args.budgets)
    out = {
        "command": " ".join(["python", "benchmarks/tree_build.py", *sys.argv[1:]]),
        "machine": _machine(torch, dev),
        "config": {"device": dev, "dtype": str(dtype).replace("torch.", ""),
                   "vocab": args.vocab, "block": args.block, "repeats": args.repeats,
                   "seq_len_for_mask": args.seq_len, "statistic": "median ms"},
        "results": results,
    }
    if args.check_sync and dev == "cuda" and logits is not None:
        out.update(_sync_check(torch, args, logits))
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError:
        print("tree_build: torch is not importable", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("tree_build: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    print(json.dumps(run(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
