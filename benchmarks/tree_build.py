"""Benchmark: batched DDTree tree build vs the per-request Python heap reference.

Both paths start from the same random drafter logits [bs*(B-1), V] on --device and include the
top-K log-prob head. The batched path then builds every tree on the device with torch ops; the
heap path copies the top-K to the host (a sync) and runs the heapq reference per request, as the
liranringel/ddtree reference does. Prints one JSON document.

--impl picks the batched builder: ``torch`` (tree.build_tree_torch, ~150 small ops) and/or
``triton`` (tree_triton.build_tree_triton, one kernel launch; CUDA only). With ``both`` every
config reports each impl's times, whether the two trees are identical field for field
(``trees_equal``), and the speedup of each over the heap.

    python benchmarks/tree_build.py --device cpu
    python benchmarks/tree_build.py --device cuda --cuda-graph --check-sync --impl both
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
    p.add_argument("--impl", choices=["torch", "triton", "both"], default=None,
                   help="batched builder(s) to time (default: both on cuda, torch on cpu)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.impl is None:
        args.impl = "both" if args.device == "cuda" else "torch"
    return args


def _impls(args) -> list[str]:
    return ["torch", "triton"] if args.impl == "both" else [args.impl]


def _builders(names: list[str]) -> dict:
    """name -> build function; raises ImportError when triton is wanted but missing."""
    from sglang_dflash.ddtree.tree import build_tree_torch

    out = {}
    for name in names:
        if name == "torch":
            out[name] = build_tree_torch
        else:
            from sglang_dflash.ddtree.tree_triton import build_tree_triton

            out[name] = build_tree_triton
    return out


TREE_FIELDS = ("tokens", "parents", "depths", "ranks", "scores", "visibility", "retrieve_index",
               "next_token", "next_sibling", "positions", "valid", "num_nodes")


def _same_tree(torch, a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in TREE_FIELDS)


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

    dev, depth, k = logits.device, args.block - 1, min(n, args.vocab)
    roots = torch.zeros(bs, dtype=torch.long, device=dev)
    seq_lens = torch.full((bs,), args.seq_len, dtype=torch.long, device=dev)

    def heap_trees(lp, ids):
        lp_h, ids_h = lp.view(bs, depth, k).tolist(), ids.view(bs, depth, k).tolist()
        return [build_tree_reference(lp_h[b], ids_h[b], 0, args.seq_len, n, f32=False)
                for b in range(bs)]

    lp, ids = topk_logprobs(logits, k)
    t_topk, _ = measure(lambda: topk_logprobs(logits, k), args.repeats, args.warmup)
    t_heap_build, _ = measure(lambda: heap_trees(lp.cpu(), ids.cpu()), args.repeats, 1)
    t_heap, _ = measure(lambda: heap_trees(*topk_logprobs(logits, k)), args.repeats, 1)
    # the float32-exact reference: every impl must give these very trees
    lp_h, ids_h = lp.view(bs, depth, k).tolist(), ids.view(bs, depth, k).tolist()
    exact = [build_tree_reference(lp_h[b], ids_h[b], 0, args.seq_len, n) for b in range(bs)]

    per_impl, trees = {}, {}
    for name, build in _builders(_impls(args)).items():
        def one(lp_, ids_, build=build):
            return build(lp_.view(bs, depth, k), ids_.view(bs, depth, k), roots, seq_lens, n)

        t_build, tree = measure(lambda one=one: one(lp, ids), args.repeats, args.warmup)
        t_total, _ = measure(lambda one=one: one(*topk_logprobs(logits, k)),
                             args.repeats, args.warmup)
        trees[name] = tree
        per_impl[name] = {
            "build_ms": round(t_build, 3),
            "batched_total_ms": round(t_total, 3),
            "speedup_build": round(t_heap_build / t_build, 2),
            "speedup_total": round(t_heap / t_total, 2),
            "trees_equal_heap": all(
                tree.tokens[b, : len(r.tokens)].tolist() == r.tokens
                and tree.parents[b, : len(r.parents)].tolist() == r.parents
                for b, r in enumerate(exact)
            ),
            **_graph_time(torch, args, measure, {
                "graph_build_ms": lambda one=one: one(lp, ids),
                "graph_total_ms": lambda one=one: one(*topk_logprobs(logits, k)),
            }),
        }
    first = next(iter(trees.values()))
    t_mask, _ = measure(lambda: full_mask(first, seq_lens, seq_lens_sum=bs * args.seq_len),
                        args.repeats, args.warmup)
    row = {
        "bs": bs, "budget": n, "K": k, "L": depth,
        "topk_ms": round(t_topk, 3),
        "heap_build_ms": round(t_heap_build, 3),
        "heap_total_ms": round(t_heap, 3),
        "full_mask_ms": round(t_mask, 3),
        "impls": per_impl,
    }
    if len(trees) > 1:  # every field, padding included, bit for bit
        row["trees_equal"] = all(_same_tree(torch, first, t) for t in trees.values())
    return row


def _summary(row: dict) -> str:
    parts = [f"bs={row['bs']} N={row['budget']}: heap build {row['heap_build_ms']} ms"]
    for name, r in row["impls"].items():
        graph = f", graph {r['graph_build_ms']} ms" if "graph_build_ms" in r else ""
        parts.append(f"{name} build {r['build_ms']} ms ({r['speedup_build']}x{graph})")
    if "trees_equal" in row:
        parts.append(f"trees_equal={row['trees_equal']}")
    return "; ".join(parts)


def _graph_time(torch, args, measure, fns: dict) -> dict:
    """cuda + --cuda-graph: capture each function once and time graph replays."""
    if not (args.cuda_graph and args.device == "cuda"):
        return {}
    out = {}
    for key, fn in fns.items():
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
            out[key] = round(t_replay, 3)
        except Exception as exc:  # report, don't abort the sweep
            out[key.replace("_ms", "_error")] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return out


def _sync_check(torch, args, logits) -> dict:
    """Run top-K + each impl's build + full_mask once with CUDA sync debugging set to raise."""
    from sglang_dflash.ddtree.mask import full_mask
    from sglang_dflash.ddtree.topk import topk_logprobs

    bs, n, depth = args.bs[-1], args.budgets[-1], args.block - 1
    k = min(n, args.vocab)
    roots = torch.zeros(bs, dtype=torch.long, device=logits.device)
    seq_lens = torch.full((bs,), args.seq_len, dtype=torch.long, device=logits.device)
    out = {}
    for name, build in _builders(_impls(args)).items():
        build(*(t.view(bs, depth, k) for t in topk_logprobs(logits, k)), roots, seq_lens, n)
        torch.cuda.synchronize()  # compile/warm outside the checked region
        torch.cuda.set_sync_debug_mode("error")
        try:
            lp, ids = topk_logprobs(logits, k)
            tree = build(lp.view(bs, depth, k), ids.view(bs, depth, k), roots, seq_lens, n)
            full_mask(tree, seq_lens, seq_lens_sum=bs * args.seq_len)
            out[name] = {"sync_free": True}
        except RuntimeError as exc:
            out[name] = {"sync_free": False, "sync_error": str(exc).splitlines()[0]}
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return {"sync_free": all(v["sync_free"] for v in out.values()), "sync_check": out}


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
        "impls": _impls(args),
        "summary": [_summary(r) for r in results],
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
    if "triton" in _impls(args):
        if args.device != "cuda":
            print("tree_build: --impl triton/both needs --device cuda (the Triton interpreter "
                  "is for correctness tests, not timings)", file=sys.stderr)
            return 2
        try:
            _builders(["triton"])
        except ImportError as exc:
            print(f"tree_build: --impl {args.impl} but triton is not importable: {exc}",
                  file=sys.stderr)
            return 2
    print(json.dumps(run(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
