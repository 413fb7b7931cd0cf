"""Two DDTree servers on one GPU behind SGLang's router (smg, started by ``sglang-dflash
router``) against one reference server, for issue 17 item 5.

Runs ON the GPU host (staged site first on PYTHONPATH, no network, one GPU), from the repo root:

    PYTHONPATH=/root/site:src:benchmarks python3 -m router_pair.router_pair \\
        --dummy --pair /root/pair-dummy --out $OUT/router --site /root/site --time-budget-s 540

Phases, in this order (``--phases``), each server started with ``sglang-dflash serve --config``
(``scripts/gpu_e2e.py``'s ``running_server``) from ``real_drafter.serve_pair.pair_config``
(``--pair DIR``: a pair trained by ``real_drafter.train``; ``--dummy``: gpu_e2e's 8B-shaped
configs with random weights and random-id prompts), ``--enable-deterministic-inference`` in
extraArgs so that batching does not change numerics:

``reference``: one server at ``--mem-fraction-reference`` (0.6); the first
``--identity-prompts`` held-out prompts greedy (temperature 0, ignore_eos, 256 new tokens) one
at a time and all at once; one ``sglang-dflash bench --url`` at ``--concurrency`` (32) with
``--requests-per-level`` x c requests (steady state) of ``--max-new-tokens`` (256); stopped.

``router``: two servers at ``--mem-fraction-pair`` (0.3) each, started one after the other
on the same GPU (SGLang's fraction is of the memory free when a server starts, so the second
gets 0.3 of what the first left), then ``sglang-dflash router --config`` over their URLs
(``--policy``, default round_robin); the same prompts and the same bench through the router,
``sglang-dflash check --url <router>``, and each server's ``sglang:num_requests_total`` before
and after the bench (both served, and they served at least what the client got back).

``results.json`` under ``--out`` is rewritten after every step, so a call cut off at its time
limit keeps what was done; ``--time-budget-s`` skips a phase or step that would not fit.
``--reuse RESULTS_JSON`` takes the reference phase from an earlier call's results.json, so the
two phases can run in two device calls (``--phases reference``, then ``--reuse``).
``summary`` holds the answers: identity (router vs reference, per prompt), tok/s of both and
their ratio, the check's rc, and the request counts (sent = ok + errors, per bench and per
identity run).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gpu_e2e as e2e  # scripts/ is not a package
from real_drafter import serve_pair as sp  # benchmarks/ is on PYTHONPATH

PHASES = ("reference", "router")
REQUEST_METRIC = "sglang:num_requests_total"
ROUTER_START_S = 120  # smg up and both workers healthy (registration is asynchronous)
STEP_MIN_S = 30  # an identity run or a check


def server_config(args, name: str, port: int, mem: float) -> dict:
    """serve_pair's instance config for the mode, deterministic, with its own port, memory
    fraction and Prometheus metrics (the request counts)."""
    cfg = sp.pair_config(
        args.pair, name, args.mode, args.backend, deterministic=True, port=port, dummy=args.dummy
    )
    cfg["memFractionStatic"] = mem
    cfg["metrics"] = {"enable": True}
    return cfg


def router_config(args, urls: list[str]) -> dict:
    """The router config ``sglang-dflash router`` reads (docs/router.md): health checks slow
    enough not to count a busy server as dead, a request timeout above a whole bench level."""
    return {
        "name": "pair",
        "workers": urls,
        "policy": args.policy,
        "host": "127.0.0.1",
        "port": args.router_port,
        "metrics": {"port": args.metrics_port},
        "healthCheck": {
            "intervalSecs": 30,
            "timeoutSecs": 30,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        "requestTimeoutSecs": 900,
        "workerStartupTimeoutSecs": 120,
        "shutdownGraceSecs": 5,
        "logLevel": "warn",
        "startTimeout": 120,
    }


def get_json(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def running_router(opts, args, urls: list[str]):
    """Start ``sglang-dflash router --config`` over urls, wait until /readiness reports every
    worker healthy; yield (url, record); stop it (SIGTERM to its process group)."""
    cfg = router_config(args, urls)
    cfg_path = opts.out / "config-router.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    log_path = opts.out / "router.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed in finally
    t0 = time.monotonic()
    proc = subprocess.Popen(
        e2e.cli(["router", "--config", str(cfg_path), "--poll-interval", "0.2"]),
        env=opts.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{args.router_port}"
    rec: dict = {"config": cfg, "ready_seconds": None, "pid": proc.pid, "readiness": None}
    limit = min(ROUTER_START_S, max(opts.clock.left() - 20, 10))
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            rec["exit_before_ready"] = proc.returncode
            break
        try:
            rec["readiness"] = get_json(url + "/readiness", timeout=2)
            if rec["readiness"].get("healthy_workers") == len(urls):
                rec["ready_seconds"] = round(time.monotonic() - t0, 1)
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    try:
        yield url, rec
    except Exception as exc:  # recorded, never fatal
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        rec["exit"] = e2e.stop_group(proc, timeout=30)
        log.close()
        rec["log_tail"] = log_path.read_text(errors="replace")[-4000:]


# ---- requests -------------------------------------------------------------------------------


def one_request(url: str, ids: list[int]) -> dict:
    """One greedy /generate (serve_pair.generate: T = 0, ignore_eos, 256 tokens): its output
    and spec counters, or the error (counted, never raised)."""
    try:
        r = sp.generate(url, ids)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    meta = r.get("meta_info", {})
    return {
        "ok": True,
        "output": r.get("output_ids"),
        **{k: meta.get(k) for k in ("completion_tokens", "spec_accept_length", "spec_verify_ct")},
    }


def identity_run(url: str, prompts: list[dict], parallel: bool) -> dict:
    """The prompts one at a time or all at once; every request counted."""
    t0 = time.monotonic()
    ids = [p["input_ids"] for p in prompts]
    if parallel:
        with cf.ThreadPoolExecutor(max(1, len(ids))) as pool:
            rows = list(pool.map(lambda x: one_request(url, x), ids))
    else:
        rows = [one_request(url, x) for x in ids]
    ok = sum(r["ok"] for r in rows)
    return {
        "rows": rows,
        "seconds": round(time.monotonic() - t0, 2),
        "counts": {"sent": len(rows), "ok": ok, "errors": len(rows) - ok},
    }


def compare_outputs(got: dict | None, ref: dict | None) -> dict:
    """Per prompt: identical to the reference's output, and the first differing position."""
    if not got or not ref:
        return {"identical": None, "why": "a side has no outputs"}
    rows = []
    for g, r in zip(got["rows"], ref["rows"], strict=False):
        if not (g.get("ok") and r.get("ok")):
            rows.append({"identical": False, "first_diff": None, "error": True})
            continue
        rows.append(
            {
                "identical": g["output"] == r["output"],
                "first_diff": e2e.first_diff(g["output"], r["output"]),
                "tokens": len(g["output"]),
            }
        )
    complete = len(rows) == len(ref["rows"]) == len(got["rows"]) and bool(rows)
    return {
        "identical": complete and all(x["identical"] for x in rows),
        "prompts": len(rows),
        "identical_prompts": sum(x["identical"] for x in rows),
        "rows": rows,
    }


def request_count(url: str) -> float | None:
    """Sum of SGLang's ``sglang:num_requests_total`` series on /metrics (None: no metrics)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode(errors="replace")
    except OSError:
        return None
    vals = [
        float(line.rsplit(None, 1)[-1])
        for line in text.splitlines()
        if line.startswith(REQUEST_METRIC) and not line.startswith("#")
    ]
    return sum(vals) if vals else None


def count_records(records: list[dict], max_new_tokens: int) -> dict:
    """A bench level's per-request records: sent = ok + errors, each ok of full length."""
    ok = [r for r in records if r.get("ok")]
    errors = [r for r in records if not r.get("ok")]
    short = [r for r in ok if r.get("output_tokens") != max_new_tokens]
    return {
        "sent": len(records),
        "ok": len(ok),
        "errors": len(errors),
        "ok_short": len(short),
        "error_messages": sorted({str(r.get("error"))[:200] for r in errors})[:5],
    }


def bench(opts, args, url: str, name: str, prompts: Path) -> dict:
    """One ``sglang-dflash bench --url`` at --concurrency, --requests-per-level x c requests."""
    left = opts.clock.left()
    if left < e2e.BENCH_MIN_S:
        return {"skipped": f"time budget: {left:.0f}s left"}
    c = args.concurrency
    n = args.requests_per_level * c
    out = opts.out / f"bench-{name}-c{c}.json"
    argv = [
        "bench",
        "--url",
        url,
        "--concurrency",
        str(c),
        "--num-prompts",
        str(n),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--prompts",
        str(prompts),
        "--warmup",
        str(args.warmup),
        "--request-timeout",
        "600",
        "--json",
        str(out),
        "--quiet",
    ]
    res = e2e.sh(e2e.cli(argv), env=opts.env, timeout=max(10.0, min(420.0, left - 15)))
    row: dict = {
        "concurrency": c,
        "requests": n,
        "warmup": args.warmup,
        "rc": res["rc"],
        "seconds": res["seconds"],
    }
    if res["rc"] != 0:
        row["stderr"] = res["stderr"][-1500:]
    if out.exists():
        doc = json.loads(out.read_text())
        summ = [s for s in doc.get("summaries", []) if s.get("concurrency") == c]
        if summ:
            row |= {
                "tok_s": summ[0].get("output_tokens_per_s"),
                "accept_length": summ[0].get("accept_length"),
                "summary": summ[0],
            }
        row["counts"] = count_records(doc.get("records", []), args.max_new_tokens)
        row["counts"]["requested"] = n
    return row


def check_url(opts, args, url: str) -> dict:
    algorithm, budget, adaptive = sp.parse_mode(args.mode)
    expect = ["--expect-algorithm", algorithm]
    if budget is not None:
        expect += [
            "--expect-ddtree-budget",
            str(budget),
            "--expect-ddtree-policy",
            "adaptive" if adaptive else "fixed",
        ]
    res = e2e.sh(
        e2e.cli(["check", "--url", url, "--layer", "live", "--json", *expect]),
        env=opts.env,
        timeout=120,
    )
    rec: dict = {"rc": res["rc"], "stdout": res["stdout"][-4000:]}
    try:
        rec["results"] = {x["name"]: x["status"] for x in json.loads(res["stdout"])["results"]}
    except (ValueError, KeyError, TypeError):
        rec["stderr"] = res["stderr"][-1500:]
    return rec


# ---- phases ---------------------------------------------------------------------------------


def serve_and_measure(
    opts,
    args,
    url: str,
    rec: dict,
    name: str,
    head: list[dict],
    bprompts: Path,
    save,
    servers: list[str] | None = None,
) -> None:
    """Identity runs, (through the router) check --url, then the bench with request counts."""
    for kind, parallel in (("sequential", False), ("parallel", True)):
        if opts.clock.left() < STEP_MIN_S:
            rec[kind] = {"skipped": "time budget"}
            continue
        rec[kind] = identity_run(url, head, parallel)
        save()
    if servers is not None:
        rec["check_url"] = (
            check_url(opts, args, url)
            if opts.clock.left() >= STEP_MIN_S
            else {"skipped": "time budget"}
        )
        save()
    watch = servers if servers is not None else [url]
    before = [request_count(u) for u in watch]
    rec["bench"] = bench(opts, args, url, name, bprompts)
    after = [request_count(u) for u in watch]
    rec["server_requests"] = {
        u: (None if b is None or a is None else a - b)
        for u, b, a in zip(watch, before, after, strict=True)
    }
    save()


def phase_reference(opts, args, results: dict, head, bprompts, save) -> None:
    cfg = server_config(args, "reference", args.ports[0], args.mem_fraction_reference)
    with e2e.running_server(opts, cfg, "reference") as (url, rec):
        results["reference"] = rec
        save()
        if rec["ready_seconds"]:
            serve_and_measure(opts, args, url, rec, "reference", head, bprompts, save)


def phase_router(opts, args, results: dict, head, bprompts, save) -> None:
    pair: dict = {}
    results["router"] = {"servers": pair}
    with contextlib.ExitStack() as stack:
        urls = []
        for name, port in (("pair-a", args.ports[1]), ("pair-b", args.ports[2])):
            left = opts.clock.left()
            if left < e2e.STEP_MIN_S:
                pair[name] = {"skipped": f"time budget: {left:.0f}s left"}
                save()
                return
            cfg = server_config(args, name, port, args.mem_fraction_pair)
            url, rec = stack.enter_context(e2e.running_server(opts, cfg, name))
            pair[name] = rec
            save()
            if not rec["ready_seconds"]:
                return
            urls.append(url)
        rurl, rrec = stack.enter_context(running_router(opts, args, urls))
        results["router"]["router"] = rrec
        save()
        if rrec["ready_seconds"]:
            serve_and_measure(
                opts, args, rurl, results["router"], "router", head, bprompts, save, servers=urls
            )
    save()


def summarise(results: dict) -> dict:
    ref, rt = results.get("reference") or {}, results.get("router") or {}
    base = ref.get("sequential") if isinstance(ref.get("sequential"), dict) else None
    identity = {
        "router_sequential_vs_reference": compare_outputs(rt.get("sequential"), base),
        "router_parallel_vs_reference": compare_outputs(rt.get("parallel"), base),
        "reference_parallel_vs_sequential": compare_outputs(ref.get("parallel"), base),
    }
    tok = {k: (r.get("bench") or {}).get("tok_s") for k, r in (("reference", ref), ("router", rt))}
    counts = {}
    for side, r in (("reference", ref), ("router", rt)):
        for kind in ("sequential", "parallel"):
            if isinstance(r.get(kind), dict) and "counts" in r[kind]:
                counts[f"{side}_{kind}"] = r[kind]["counts"]
        if (r.get("bench") or {}).get("counts"):
            counts[f"{side}_bench"] = r["bench"]["counts"]
    served = rt.get("server_requests") or {}
    bench_ok = ((rt.get("bench") or {}).get("counts") or {}).get("ok")
    deltas = list(served.values())
    return {
        "identical": {k: v.get("identical") for k, v in identity.items()},
        "identity": identity,
        "tok_s": tok
        | {
            "ratio_router_over_reference": (
                round(tok["router"] / tok["reference"], 3)
                if tok["reference"] and tok["router"]
                else None
            )
        },
        "check_url_rc": (rt.get("check_url") or {}).get("rc"),
        "check_url": (rt.get("check_url") or {}).get("results"),
        "counts": counts,
        "all_accounted": bool(counts)
        and all(
            c["sent"] == c["ok"] + c["errors"]
            and c.get("requested", c["sent"]) == c["sent"]
            and not c.get("ok_short")
            for c in counts.values()
        ),
        "errors": sum(c["errors"] for c in counts.values()),
        "router_bench_server_requests": served,
        # both servers served, and together at least every ok request plus bench's warm-up
        # (health checks and retries may add more)
        "both_servers_served": bool(deltas) and all(d is not None and d > 0 for d in deltas),
        "servers_cover_client": (
            None
            if bench_ok is None or None in deltas
            else sum(deltas) >= bench_ok + (rt.get("bench") or {}).get("warmup", 0)
        ),
    }


def smg_present(env: dict) -> bool:
    """Whether the site the children run with has the router's wheel (smg)."""
    code = "import importlib.util,sys; sys.exit(importlib.util.find_spec('smg') is None)"
    return subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pair",
        type=Path,
        required=True,
        help="real_drafter.train's --out (with --dummy: where to write configs)",
    )
    ap.add_argument(
        "--dummy",
        action="store_true",
        help="random weights (serve_pair --dummy): gpu_e2e's 8B-shaped configs and "
        "64 random-id prompts written to --pair if it has no prompts.jsonl",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--site",
        required=True,
        help="the staged site dir(s), os.pathsep-separated: the children's "
        "PYTHONPATH (needs sglang, sglang_dflash and, for the router, smg)",
    )
    ap.add_argument(
        "--mode",
        default="ddtree:16",
        help="serve_pair's mode of all three servers (default ddtree:16)",
    )
    ap.add_argument("--backend", default="triton", choices=e2e.BACKENDS)
    ap.add_argument(
        "--phases", default=",".join(PHASES), help="comma-separated, in order: reference, router"
    )
    ap.add_argument(
        "--ports", default="30000,30001,30002", help="reference, pair-a, pair-b server ports"
    )
    ap.add_argument("--router-port", type=int, default=30080)
    ap.add_argument("--metrics-port", type=int, default=29000, help="the router's Prometheus")
    ap.add_argument("--policy", default="round_robin", help="the router's policy")
    ap.add_argument("--mem-fraction-reference", type=float, default=0.6)
    ap.add_argument("--mem-fraction-pair", type=float, default=0.3)
    ap.add_argument("--identity-prompts", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument(
        "--requests-per-level",
        type=int,
        default=4,
        help="bench requests = this x concurrency (>= 4: steady state)",
    )
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=sp.NEW_TOKENS,
        help="bench output length (identity requests are serve_pair's 256)",
    )
    ap.add_argument("--warmup", type=int, default=1, help="bench's unrecorded requests")
    ap.add_argument("--time-budget-s", type=float, default=0)
    ap.add_argument(
        "--reuse",
        type=Path,
        metavar="RESULTS_JSON",
        help="take the reference phase from an earlier run's results.json (same machine, "
        "pair and flags) instead of running it: the two phases in two device calls",
    )
    args = ap.parse_args(argv)
    args.ports = [int(p) for p in args.ports.split(",")]
    phases = [p for p in args.phases.split(",") if p]
    if len(args.ports) != 3 or len(set(args.ports)) != 3:
        ap.error("--ports: three different ports (reference, pair-a, pair-b)")
    if not phases or set(phases) - set(PHASES):
        ap.error(f"--phases: a comma-separated list of {', '.join(PHASES)}")
    sp.parse_mode(args.mode)
    args.phases = phases
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dummy and not (args.pair / "prompts.jsonl").exists():
        sp.write_dummy_pair(args.pair)
    if not (args.pair / "prompts.jsonl").is_file():
        print(
            f"router_pair: {args.pair}/prompts.jsonl missing: run real_drafter.train first "
            "or pass --dummy",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    site = [p for p in args.site.split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site), PYTHONUNBUFFERED="1")
    opts = e2e.Opts(
        out=args.out,
        env=env,
        models=(args.pair / "target", args.pair / "draft"),
        backend=args.backend,
        bench=True,
        bench_prompts="pair",
        bench_concurrency=str(args.concurrency),
        bench_num_prompts=args.requests_per_level,
        clock=e2e.Clock(args.time_budget_s),
    )
    prompts = sp.load_prompts(args.pair)
    head = prompts[: args.identity_prompts]
    bprompts = sp.bench_file(args.out, prompts)
    results: dict = {
        "argv": sys.argv if argv is None else list(argv),
        "phases": args.phases,
        "mode": args.mode,
        "backend": args.backend,
        "dummy": args.dummy,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "skipped": {},
    }

    def save() -> None:
        results["summary"] = summarise(results)
        results["elapsed_s"] = round(time.monotonic() - opts.clock.t0, 1)
        tmp = args.out / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(args.out / "results.json")

    if "router" in args.phases and not smg_present(env):
        results["error"] = (
            "the router's wheel (smg 1.13.0) is not importable with PYTHONPATH="
            f"{env['PYTHONPATH']}: stage it and add it to --site"
        )
        save()
        print(f"router_pair: {results['error']}", file=sys.stderr)
        return 2
    need = {"reference": e2e.STEP_MIN_S, "router": 2 * e2e.STEP_MIN_S}
    for phase in args.phases:
        t0 = time.monotonic()
        left = opts.clock.left()
        if phase == "reference" and args.reuse:
            results["reference"] = json.loads(args.reuse.read_text())["reference"]
            results["reference"]["reused_from"] = str(args.reuse)
        elif left < need[phase]:
            results["skipped"][phase] = f"time budget: {left:.0f}s left, needs {need[phase]}"
        else:
            try:
                (phase_reference if phase == "reference" else phase_router)(
                    opts, args, results, head, bprompts, save
                )
            except Exception as exc:  # recorded; the next phase still runs
                results.setdefault("errors", {})[phase] = f"{type(exc).__name__}: {exc}"
        results.setdefault("phase_seconds", {})[phase] = round(time.monotonic() - t0, 1)
        save()
        print(f"[router_pair] {phase}: {time.monotonic() - t0:.1f}s", flush=True)
    s = results["summary"]
    print(
        json.dumps(
            {
                k: s[k]
                for k in (
                    "identical",
                    "tok_s",
                    "check_url_rc",
                    "counts",
                    "all_accounted",
                    "router_bench_server_requests",
                    "both_servers_served",
                    "servers_cover_client",
                )
            }
            | {
                "skipped": results["skipped"],
                "errors": results.get("errors"),
                "elapsed_s": results["elapsed_s"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
