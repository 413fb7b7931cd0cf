"""Serve the trained pair (``real_drafter.train``) through ``sglang-dflash serve``, one mode
after another, and record what issue 15 asks: ``check --url``, greedy identity across modes,
seeded T > 0 identity, accept length per mode, tok/s at c = 1 / 8 / 32 with 256-token outputs.

Runs ON the GPU host (staged site first on PYTHONPATH, no network), from the repo root:

    PYTHONPATH=/root/site:src:benchmarks python3 -m real_drafter.serve_pair \\
        --pair /root/pair --out $OUT/serve --site /root/site --time-budget-s 540 \\
        none dflash ddtree:16 adaptive:16 ddtree:64

Modes (each may end in ``@flashinfer`` / ``@triton``, default ``--backend``):
``none``, ``dflash``, ``ddtree:<N>`` (fixed budget), ``adaptive:<N>`` (DDTree with
``ddtree.policy`` adaptive, largest budget N), ``seeded:<mode>`` (T > 0 as token
identity under ``--enable-deterministic-inference``: a seeded no-speculation server once per
run, then ``<mode>``; the drafter is the real one, nothing planted), ``profile:<mode>`` (SGLang's
own torch profiler over ``--profile-steps`` forward steps at c = 1 and 8, each trace reduced on
the host by ``benchmarks/trace_summary.py`` to a per-step table and then deleted). Modifiers
(``<mode>+<modifier>``): ``+no-overlap`` (``--disable-overlap-schedule``), ``+k<K>`` (a DDTree
mode's no-draft round as K decode steps: ``SGLANG_DFLASH_DDTREE_NODRAFT_STEPS=K``), ``+tree``
(an adaptive mode whose schedule is N alone, ``ddtree.policy = "adaptive:1:<N>"``: every round a
tree of N with the policy's meter and choice running, so a profile sets its cost against the
fixed policy's on dummy weights, where the default schedule would fall back to no draft),
``+bound`` / ``+sync`` (a DDTree mode's ``SGLANG_DFLASH_DDTREE_HOST_LENS``: its rounds plan
from the reserved bound and SGLang stops copying each round's lengths to the host, the Triton
default; refused with FlashInfer since §29; or SGLang copies and waits for them each round, the
FlashInfer default), ``+split`` (a FlashInfer DDTree mode's split verify,
``SGLANG_DFLASH_DDTREE_SPLIT_VERIFY=1``: the prefix attended without a mask, the tree block in
one Triton launch; off by default, to be judged by the tie margin on real weights), ``+pad``
(a FlashInfer DDTree mode's padded verify: ``SGLANG_DFLASH_DDTREE_HOST_LENS=bound`` with the
drafter's attention on Triton, the verify's kv lengths padded to the bound and the slots past
the tree masked; off by default, to be judged by the tie margin and timed against ``sync``),
``+draft-triton`` (a speculative mode's drafter on Triton attention, the target on the mode's
backend: ``+pad``'s drafter without the padding, so a profile prices the two apart and DFLASH
is timed with the drafter ``+pad`` uses).

Per mode: ready time, ``check --url``, the first ``--greedy-prompts`` held-out prompts one at a
time (output ids, SGLang's per-request spec_accept_length / verify_ct / histogram), the same
prompts at once (batch-size > 1 identity), then one ``sglang-dflash bench`` per level (steady
state: ``--requests-per-level`` x c requests, 256 tokens, ignore_eos). ``results.json`` is
rewritten after every mode, so a call cut off at its time limit still returns the rest.
The server helpers are ``scripts/gpu_e2e.py``'s (one implementation of start/wait/stop).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gpu_e2e as e2e  # scripts/ is not a package
import trace_summary  # benchmarks/trace_summary.py (benchmarks/ is on PYTHONPATH)

from sglang_dflash.sglang_overlay import settings as overlay_settings

LEVELS = (1, 8, 32)
NEW_TOKENS = 256
POLICY_LOG = "DDTree adaptive policy: "
DETERMINISTIC = "--enable-deterministic-inference"
# a seeded mode starts two servers (no speculation, then the mode): it needs --step-min-s for
# each, or a call's limit stops it half-started (gpu-results.md §34, call C)
SEEDED_SERVERS = 2


# ``<mode>+<modifier>``: server flags a mode can add (each also named in the mode's label).
MODIFIERS = {"no-overlap": "--disable-overlap-schedule"}
# ``+tree``: an adaptive mode's schedule is its budget N alone (the policy runs, never falls back)
TREE_MODIFIER = "tree"
# ``+bound`` / ``+sync``: a DDTree mode's host-lengths switch (the overlay's setting)
HOST_LENS_MODIFIERS = ("bound", "sync")
# ``+k<K>``: the server's no-draft round as K decode steps (the overlay's setting; a DDTree mode)
STEPS_MODIFIER = re.compile(r"k([0-9]+)")
# ``+split``: a FlashInfer DDTree mode's split verify (the overlay's setting; §33's item 2: the
# custom-mask attention is most of a tree round's extra GPU time)
SPLIT_MODIFIER = "split"
# ``+pad``: a FlashInfer DDTree mode's padded verify (the bound, the drafter on Triton)
PAD_MODIFIER = "pad"
# ``+draft-triton``: a speculative mode's drafter attention on Triton (what ``+pad`` implies)
DRAFT_TRITON_MODIFIER = "draft-triton"
FLASHINFER_ONLY = (SPLIT_MODIFIER, PAD_MODIFIER)
MODIFIER_NAMES = (*("+" + k for k in MODIFIERS), "+" + TREE_MODIFIER,
                  *("+" + k for k in HOST_LENS_MODIFIERS), "+k<K>",
                  *("+" + k for k in FLASHINFER_ONLY), "+" + DRAFT_TRITON_MODIFIER)


def _modifier_env(mod: str, head: str, mode: str) -> dict[str, str]:
    """The server environment of one modifier of ``mode`` ({} for a flag modifier); a
    one-line ValueError for an unknown or bad one."""
    if mod in MODIFIERS:
        return {}
    if mod == TREE_MODIFIER:
        if not head.startswith("adaptive:"):
            raise ValueError(f"+{mod} needs an adaptive mode (adaptive:<N>), not {head!r}")
        return {}
    if mod == DRAFT_TRITON_MODIFIER:
        if not head.startswith(("dflash", "ddtree:", "adaptive:")):
            raise ValueError(f"+{mod} needs a speculative mode (dflash, ddtree:<N>, "
                             f"adaptive:<N>), not {head!r}")
        return {}
    hit = STEPS_MODIFIER.fullmatch(mod)
    if hit is None and mod not in (*HOST_LENS_MODIFIERS, *FLASHINFER_ONLY):
        raise ValueError(f"unknown modifier +{mod} in {mode!r}: " + ", ".join(MODIFIER_NAMES))
    if not head.startswith(("ddtree:", "adaptive:")):
        raise ValueError(f"+{mod} needs a DDTree mode (ddtree:<N> or adaptive:<N>), not {head!r}")
    if mod == SPLIT_MODIFIER:
        return {overlay_settings.SPLIT_VERIFY_ENV: "1"}
    if mod == PAD_MODIFIER:
        return overlay_settings.padded_verify_env()
    if hit is None:
        return {overlay_settings.HOST_LENS_ENV: overlay_settings.parse_host_lens(mod)}
    try:
        steps = overlay_settings.parse_nodraft_steps(hit.group(1))  # 1..64: the overlay's rule
    except overlay_settings.DDTreeConfigError as exc:
        raise ValueError(str(exc)) from None
    return {overlay_settings.NODRAFT_STEPS_ENV: str(steps)}


def split_modifiers(mode: str) -> tuple[str, tuple[str, ...]]:
    """``none+no-overlap`` -> ("none", ("no-overlap",)); a one-line ValueError otherwise."""
    head, *mods = mode.split("+")
    for m in mods:
        _modifier_env(m, head, mode)
    return head, tuple(mods)


def modifier_env(mode: str) -> dict[str, str]:
    """The server environment a mode's modifiers set (``adaptive:16+k16`` -> the step count)."""
    head, *mods = mode.split("+")
    env: dict[str, str] = {}
    for m in mods:
        env |= _modifier_env(m, head, mode)
    return env


def parse_mode(mode: str) -> tuple[str, int | None, bool]:
    """``ddtree:16`` -> (algorithm, budget, adaptive); a one-line ValueError otherwise."""
    head, _, arg = split_modifiers(mode)[0].partition(":")
    if head in ("none", "dflash") and not arg:
        return head, None, False
    if head in ("ddtree", "adaptive") and arg.isdigit() and int(arg) > 0:
        return "ddtree", int(arg), head == "adaptive"
    raise ValueError(f"unknown mode {mode!r}: none, dflash, ddtree:<N>, adaptive:<N> "
                     "(each may end in " + ", ".join(MODIFIER_NAMES) + ")")


def mode_label(mode: str) -> str:
    """The label issue 15's JSON uses: none | dflash | ddtree-<N> | ddtree-adaptive-<N>, then
    each modifier (``none+no-overlap``)."""
    algorithm, budget, adaptive = parse_mode(mode)
    mods = "".join("+" + m for m in split_modifiers(mode)[1])
    if algorithm != "ddtree":
        return algorithm + mods
    return (f"ddtree-adaptive-{budget}" if adaptive else f"ddtree-{budget}") + mods


def file_name(mode: str) -> str:
    """A mode as part of a file name: letters, digits and '-' (the device tool brings back
    nothing else)."""
    return mode.replace(":", "-").replace("+", "-")


def pair_config(pair: Path, name: str, mode: str, backend: str, *,
                deterministic: bool = False, port: int = e2e.PORT, dummy: bool = False,
                graph_max_bs: int = 32) -> dict:
    """The instance config of one mode: the pair's real weights and tokenizer (``dummy``:
    random weights and no tokenizer, for round-cost profiles where acceptance is not the
    point)."""
    algorithm, budget, adaptive = parse_mode(mode)
    extra = ["--sampling-backend", "pytorch", "--cuda-graph-max-bs", str(graph_max_bs),
             "--cuda-graph-backend-prefill", "disabled", "--dtype", "bfloat16",
             *(MODIFIERS[m] for m in split_modifiers(mode)[1] if m in MODIFIERS)]
    if deterministic:
        extra.append(DETERMINISTIC)
    cfg: dict = {
        "name": name, "model": str(pair / "target"), "algorithm": algorithm,
        "port": port, "gpus": [0], "memFractionStatic": 0.6, "attentionBackend": backend,
        "contextLength": 2048, "preflight": False, "startTimeout": 420, "extraArgs": extra,
    }
    if dummy:
        cfg |= {"loadFormat": "dummy", "skipTokenizerInit": True}
    if algorithm != "none":
        mods = set(split_modifiers(mode)[1])
        draft_backend = (overlay_settings.PADDED_VERIFY_DRAFT_BACKEND if PAD_MODIFIER in mods
                         else "triton" if DRAFT_TRITON_MODIFIER in mods else backend)
        cfg |= {"draftModel": str(pair / "draft"), "draftAttentionBackend": draft_backend}
        if dummy:
            cfg["draftLoadFormat"] = "dummy"
    if budget is not None:
        policy = "adaptive" if adaptive else "fixed"
        if TREE_MODIFIER in split_modifiers(mode)[1]:
            policy = f"adaptive:1:{budget}"
        cfg["ddtree"] = {"budget": budget, "policy": policy}
    env = modifier_env(mode)
    if env:
        cfg["environment"] = env
    return cfg


def pair_shape_configs() -> tuple[dict, dict]:
    """The trained pair's (target, draft) config.json, as ``real_drafter.train`` writes them
    (its full plan; special ids 0 / 1 / 2 as its tokenizer assigns them): served with random
    weights, its kernels (head dim 64) compile on a lease before the pair itself exists."""
    from .checkpoint import draft_config
    from .config import EOS_TOKEN, MASK_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, full_plan
    from .target import qwen3_config

    plan = full_plan()
    eos, mask, pad = (SPECIAL_TOKENS.index(t) for t in (EOS_TOKEN, MASK_TOKEN, PAD_TOKEN))
    target = qwen3_config(plan.target, eos_id=eos, pad_id=pad).to_dict()
    target["dtype"] = "bfloat16"  # what save_target writes
    return target, draft_config(target, plan, mask)


def write_dummy_pair(root: Path, seed: int = 0, shape: str = "8b") -> None:
    """The target/draft configs of a shape (adaptive_grid's: ``8b`` = gpu_e2e's, ``4b`` the
    adaptive grid's; ``pair`` the trained pair's) and 64 prompts of 64-496 random ids."""
    import random

    import adaptive_grid  # benchmarks/ is on PYTHONPATH

    configs = pair_shape_configs() if shape == "pair" else adaptive_grid.shape_configs(shape)
    e2e.write_models(root, *configs)
    rng = random.Random(seed)
    vocab = configs[0]["vocab_size"]
    lines = [json.dumps({"input_ids": [rng.randrange(1000, vocab - 1000)
                                       for _ in range(rng.randint(64, 496))]})
             for _ in range(64)]
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")


def load_prompts(pair: Path) -> list[dict]:
    return [json.loads(line) for line in (pair / "prompts.jsonl").read_text().splitlines()
            if line.strip()]


def bench_file(out: Path, prompts: list[dict]) -> Path:
    """The held-out prompts as bench input (ids only: bench takes exactly one of text/ids)."""
    path = out / "bench-prompts.jsonl"
    path.write_text("".join(json.dumps({"input_ids": p["input_ids"]}) + "\n" for p in prompts))
    return path


def generate(url: str, ids: list[int], params: dict | None = None) -> dict:
    sp = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True} | (params or {})
    return e2e.http_json(url + "/generate", {"input_ids": ids, "sampling_params": sp},
                         timeout=300)


def seeded_params(i: int) -> dict:
    return {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1000 + i}


def run_requests(url: str, prompts: list[dict], params, parallel: bool) -> list[dict]:
    """Outputs and SGLang's per-request spec counters, one at a time or all at once."""
    def one(i: int) -> dict:
        r = generate(url, prompts[i]["input_ids"], params(i) if params else None)
        meta = r.get("meta_info", {})
        return {"output": r["output_ids"],
                **{k: meta.get(k) for k in ("spec_accept_length", "spec_verify_ct",
                                            "spec_accept_histogram", "completion_tokens")}}
    idx = range(len(prompts))
    if not parallel:
        return [one(i) for i in idx]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, idx))


def bench_levels(opts, url: str, name: str, prompts: Path, per_level: int) -> list[dict]:
    """One bench per concurrency level, each with per_level x c requests (steady state)."""
    rows = []
    for c in LEVELS:
        out = opts.out / f"bench-{name}-c{c}.json"
        left = opts.clock.left()
        if left < e2e.BENCH_MIN_S:
            rows.append({"concurrency": c, "skipped": f"time budget: {left:.0f}s left"})
            continue
        args = ["bench", "--url", url, "--concurrency", str(c), "--num-prompts",
                str(per_level * c), "--max-new-tokens", str(NEW_TOKENS), "--prompts",
                str(prompts), "--warmup-waves", str(e2e.WARMUP_WAVES), "--json", str(out),
                "--quiet", *(["--freeze-gc"] if getattr(opts, "freeze_gc", False) else [])]
        res = e2e.sh(e2e.cli(args), env=opts.env, timeout=max(10.0, min(200.0, left - 15)))
        row: dict = {"concurrency": c, "rc": res["rc"], "seconds": res["seconds"]}
        if out.exists():
            summ = [s for s in json.loads(out.read_text()).get("summaries", [])
                    if s.get("concurrency") == c]
            if summ:
                row |= {"tok_s": summ[0].get("output_tokens_per_s"),
                        "accept_length": summ[0].get("accept_length"), "summary": summ[0]}
        if res["rc"] != 0:
            row["stderr"] = res["stderr"][-1500:]
        rows.append(row)
    return rows


def policy_lines(lines: list[str]) -> list[dict]:
    """The adaptive policy's periodic summaries among the server log's lines (the worker logs
    one every 500 rounds)."""
    out = []
    for line in lines:
        _, hit, tail = line.partition(POLICY_LOG)
        if hit:
            try:
                out.append(json.loads(tail))
            except json.JSONDecodeError:
                out.append({"unparsed": tail[:300]})
    return out


# the worker's start-up lines that say how its rounds plan (host lengths, the sync-free plan):
# §30's servers said "host lengths: bound" on FlashInfer, the whole diagnosis in one line
WORKER_LOG_MARKS = ("DDTree host lengths: ", "sync-free FlashInfer plan")


def worker_lines(lines: list[str]) -> list[str]:
    """The DDTree worker's planning lines among the server log's, from ``DDTree`` on (no
    timestamp), each once (TP ranks and budgets repeat them)."""
    out: list[str] = []
    for line in lines:
        if any(m in line for m in WORKER_LOG_MARKS):
            text = line[max(line.find("DDTree"), 0):].strip()[:300]
            if text not in out:
                out.append(text)
    return out


def server_log_fields(log: Path) -> dict:
    """What a mode's record keeps from its server log, read once: ``policy`` (the adaptive
    policy's summaries) and ``worker`` (how the rounds planned); empty when there is no log."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return {"policy": policy_lines(lines), "worker": worker_lines(lines)}


def serve_mode(opts, pair: Path, mode: str, backend: str, prompts: list[dict],
               greedy_n: int, per_level: int, bench_prompts: Path) -> dict:
    algorithm, budget, adaptive = parse_mode(mode)
    name = file_name(mode) + f"-{backend}"
    cfg = pair_config(pair, name, mode, backend, port=opts.port, dummy=opts.dummy)
    head = prompts[:greedy_n]
    with e2e.running_server(opts, cfg, name) as (url, rec):
        rec |= {"mode": mode, "label": mode_label(mode), "backend": backend}
        if rec["ready_seconds"]:
            expect = ["--expect-algorithm", algorithm]
            if budget is not None:
                expect += ["--expect-ddtree-budget", str(budget), "--expect-ddtree-policy",
                           "adaptive" if adaptive else "fixed"]
            chk = e2e.sh(e2e.cli(["check", "--url", url, "--layer", "live", *expect]),
                         env=opts.env, timeout=120)
            rec["check_url"] = {"rc": chk["rc"], "stdout": chk["stdout"][-3000:]}
            t1 = time.monotonic()
            rec["greedy"] = run_requests(url, head, None, parallel=False)
            rec["greedy_seconds"] = round(time.monotonic() - t1, 2)
            rec["greedy_parallel"] = run_requests(url, head, None, parallel=True)
            _write_partial(opts, name, rec)
            rec["bench"] = bench_levels(opts, url, name, bench_prompts, per_level)
    rec.update(server_log_fields(opts.out / f"serve-{name}.log"))
    return rec


def seeded_mode(opts, pair: Path, mode: str, backend: str, prompts: list[dict],
                cache: dict) -> dict:
    """Seeded T > 0: the no-speculation server's outputs (once per backend) vs ``mode``'s."""
    head = prompts[: opts.seeded_n]
    rec: dict = {"mode": f"seeded:{mode}", "backend": backend}
    if backend not in cache:
        name = f"seeded-none-{backend}"
        cfg = pair_config(pair, name, "none", backend, deterministic=True, port=opts.port,
                          dummy=opts.dummy)
        with e2e.running_server(opts, cfg, name) as (url, r0):
            if r0["ready_seconds"]:
                r0["outputs"] = [r["output"] for r in run_requests(url, head, seeded_params,
                                                                   parallel=False)]
                r0["greedy"] = [r["output"] for r in run_requests(url, head, None,
                                                                  parallel=False)]
        cache[backend] = r0
    base = cache[backend]
    rec["none"] = {k: base.get(k) for k in ("ready_seconds", "serve_exit", "error")}
    if not base.get("outputs"):
        rec["error"] = "the seeded no-speculation server gave no outputs"
        return rec
    name = f"seeded-{file_name(mode)}-{backend}"
    cfg = pair_config(pair, name, mode, backend, deterministic=True, port=opts.port,
                      dummy=opts.dummy)
    with e2e.running_server(opts, cfg, name) as (url, r1):
        if r1["ready_seconds"]:
            r1["rows"] = run_requests(url, head, seeded_params, parallel=False)
    rows = r1.get("rows", [])
    rec["spec"] = {k: r1.get(k) for k in ("ready_seconds", "serve_exit", "error")}
    # The outputs and the sampling parameters stay in the record: tie_margin judges each
    # divergence from them (the seeded sampler's draw within bf16's error).
    rec["rows"] = [{"identical": r["output"] == ref,
                    "first_diff": e2e.first_diff(r["output"], ref),
                    "accept_length": r["spec_accept_length"],
                    "params": seeded_params(i), "output": r["output"], "reference": ref}
                   for i, (r, ref) in enumerate(zip(rows, base["outputs"], strict=False))]
    rec["summary"] = seeded_summary(rec["rows"], base)
    if not rows:
        rec["error"] = ("the seeded speculative server gave no outputs (not ready: stopped by "
                        "the time budget or failed; see spec)")
    rec.update(server_log_fields(opts.out / f"serve-{name}.log"))
    return rec


def seeded_summary(rows: list[dict], base: dict) -> dict:
    """A seeded mode's verdict; ``all_identical`` is None when the speculative server gave no
    rows (§33: one stopped by the budget read as "not identical")."""
    return {
        "all_identical": all(r["identical"] for r in rows) if rows else None,
        "prompts": len(rows),
        "sampled": any(o != g for o, g in zip(base["outputs"], base["greedy"], strict=False)),
        "accept_length_mean": (sum(r["accept_length"] or 0 for r in rows) / len(rows)
                               if rows else None),
    }


PROFILE_LEVELS = (1, 8)


def profile_level(url: str, out: Path, prompts: list[dict], c: int, steps: int) -> dict:
    """SGLang's own torch profiler over ``steps`` forward steps while c requests decode, then
    the trace summarised (trace_summary) and deleted: only the table comes back."""
    import threading

    out.mkdir(parents=True, exist_ok=True)
    body = {"output_dir": str(out), "num_steps": steps, "activities": ["CPU", "GPU"],
            "with_stack": False, "record_shapes": False, "profile_id": f"c{c}"}
    answer: dict = {}

    def start() -> None:
        try:
            answer["start"] = e2e.http_json(url + "/start_profile", body, timeout=120)
        except Exception as exc:  # /start_profile answers with plain text on some paths
            answer["start"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=start, daemon=True)
    t.start()
    time.sleep(0.5)
    run_requests(url, prompts[:c], None, parallel=c > 1)
    t.join(timeout=60)
    deadline = time.monotonic() + 90
    traces: list[Path] = []
    while time.monotonic() < deadline and not traces:
        traces = sorted(out.glob("*.trace.json*"))
        time.sleep(1)
    rec: dict = {"concurrency": c, "start": answer.get("start")}
    if not traces:
        rec["error"] = f"no trace file under {out} after the run"
        return rec
    time.sleep(2)  # the export may still be writing
    path = traces[0]
    try:
        rec["summary"] = trace_summary.summarise(trace_summary.load(path), steps)
    except (OSError, ValueError) as exc:
        rec["error"] = f"{path.name}: {exc}"
    rec["trace"] = {"name": path.name, "bytes": path.stat().st_size}
    for p in traces:
        p.unlink()
    return rec


def timed_level(url: str, prompts: list[dict], c: int) -> dict:
    """c requests at once without the profiler: wall ms per verify round (or decode step)."""
    t0 = time.monotonic()
    rows = run_requests(url, prompts[:c], None, parallel=c > 1)
    wall = time.monotonic() - t0
    tokens = sum(r.get("completion_tokens") or 0 for r in rows)
    rounds = max((r.get("spec_verify_ct") or r.get("completion_tokens") or 0) for r in rows)
    return {"concurrency": c, "wall_s": round(wall, 3), "output_tokens": tokens,
            "tok_s": round(tokens / wall, 1) if wall else None,
            "rounds_longest_request": rounds,
            "ms_per_round": round(1000 * wall / rounds, 3) if rounds else None}


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time among a level's repeats (the lower middle of an even
    count): one stalled wave neither hides nor becomes the figure."""
    ranked = sorted(runs, key=lambda r: r["wall_s"])
    return ranked[(len(ranked) - 1) // 2]


def timed_levels(url: str, prompts: list[dict], levels, repeats: int) -> tuple[list, list]:
    """Each level ``repeats`` times, level by level: (the median run per level, every run in
    order). The first run at a level is the first time the server sees that batch size
    outside its warm-up, so a per-shape stall (a lazy compile) shows as its outlier."""
    runs = [[timed_level(url, prompts, c) for _ in range(repeats)] for c in levels]
    return [median_run(r) for r in runs], runs


def profile_mode(opts, pair: Path, mode: str, backend: str, prompts: list[dict],
                 steps: int) -> dict:
    """One server of ``mode``, timed (``opts.timed_repeats`` runs per level) and then profiled
    at each of ``opts.profile_levels`` (default PROFILE_LEVELS) after a warm-up; ``steps`` 0
    times without profiling."""
    levels = getattr(opts, "profile_levels", PROFILE_LEVELS)
    repeats = getattr(opts, "timed_repeats", 1)
    name = "profile-" + file_name(mode) + f"-{backend}"
    cfg = pair_config(pair, name, mode, backend, port=opts.port, dummy=opts.dummy,
                      graph_max_bs=opts.graph_max_bs)
    with e2e.running_server(opts, cfg, name) as (url, rec):
        rec |= {"mode": f"profile:{mode}", "label": mode_label(mode), "backend": backend}
        if rec["ready_seconds"]:
            run_requests(url, prompts[:8], None, parallel=True)  # warm-up: graphs, JIT
            rec["timed"], rec["timed_runs"] = timed_levels(url, prompts, levels, repeats)
            rec["levels"] = [profile_level(url, opts.out / f"{name}-c{c}", prompts, c, steps)
                             for c in levels] if steps > 0 else []
    rec.update(server_log_fields(opts.out / f"serve-{name}.log"))
    return rec


def _write_partial(opts, name: str, rec: dict) -> None:
    (opts.out / f"{name}-partial.json").write_text(json.dumps(rec, indent=1))


def greedy_compare(serves: dict) -> dict:
    """Greedy outputs token-identical across modes, per backend (one at a time and at once)."""
    res = {}
    for kind in ("greedy", "greedy_parallel"):
        groups: dict[str, dict] = {}
        for m, r in serves.items():
            if r.get(kind):
                groups.setdefault(r["backend"], {})[m] = [x["output"] for x in r[kind]]
        res[kind] = {b: e2e.compare_group(g) for b, g in groups.items()}
    # every mode's all-at-once outputs against the none server's one-at-a-time ones
    res["parallel_vs_none_sequential"] = {}
    for m, r in serves.items():
        none = next((x for x in serves.values() if x["label"] == "none"
                     and x["backend"] == r["backend"] and x.get("greedy")), None)
        if none and r.get("greedy_parallel"):
            res["parallel_vs_none_sequential"][m] = [
                e2e.first_diff(a["output"], b["output"])
                for a, b in zip(r["greedy_parallel"], none["greedy"], strict=False)]
    return res


def served_rows(serves: dict) -> list[dict]:
    """issue 15's ``served`` list: one row per (mode, concurrency)."""
    rows = []
    for r in serves.values():
        for b in r.get("bench", []):
            if "tok_s" in b:
                rows.append({"mode": r["label"], "backend": r["backend"],
                             "concurrency": b["concurrency"], "tok_s": b["tok_s"],
                             "accept_length": b["accept_length"]})
    return rows


def _served_in_full(rec: dict) -> bool:
    """A served mode is finished when its server became ready and every bench level it ran
    measured (a level the time budget skipped, or one that failed, runs again)."""
    return bool(rec.get("ready_seconds")) and all("tok_s" in b for b in rec.get("bench", []))


def done_modes(paths: list[Path]) -> set[str]:
    """The modes earlier results.json files finished: a served mode whose server became ready
    and whose bench levels all measured, a seeded one with its rows, neither skipped nor
    failed. A missing file is a call that never got there (nothing done), a broken one a
    one-line ValueError."""
    done: set[str] = set()
    for path in paths:
        if not path.exists():
            continue
        try:
            res = json.loads(path.read_text())
            errors = res.get("errors", {})
            finished = {"serve": _served_in_full,
                        "seeded": lambda r: r.get("rows")}
            for group, ok in finished.items():
                done |= {m for m, rec in res.get(group, {}).items()
                         if m not in errors and "skipped" not in rec and "error" not in rec
                         and ok(rec)}
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"--skip-done {path}: not a serve_pair results.json ({exc})") \
                from None
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", type=Path, required=True, help="real_drafter.train's --out")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--site", required=True, help="the staged site dir")
    ap.add_argument("--backend", default="triton", choices=e2e.BACKENDS)
    ap.add_argument("--freeze-gc", action="store_true",
                    help="bench --freeze-gc: each server's garbage collector frozen after a "
                    "level's warm-up (SGLang's /freeze_gc), so a full collection's stall "
                    "stays out of the level")
    ap.add_argument("--port", type=int, default=e2e.PORT)
    ap.add_argument("--dummy", action="store_true",
                    help="random weights: --pair gets gpu_e2e's 8B-shaped Qwen3 configs and 64 "
                    "random-id prompts if it has no prompts.jsonl (round-cost profiles)")
    ap.add_argument("--shape", choices=("8b", "4b", "pair"), default="8b",
                    help="the --dummy pair's shape (4b = the adaptive grid's, pair = "
                         "real_drafter.train's: its kernels compile before it is trained)")
    ap.add_argument("--greedy-prompts", type=int, default=8)
    ap.add_argument("--seeded-prompts", type=int, default=6)
    ap.add_argument("--requests-per-level", type=int, default=4,
                    help="requests per level = this x concurrency (>= 4: steady state)")
    ap.add_argument("--profile-steps", type=int, default=40,
                    help="forward steps each profile:<mode> level records (0: timed only)")
    ap.add_argument("--timed-repeats", type=int, default=3,
                    help="timed runs per profile:<mode> level; the median is the figure, every "
                    "run is kept (the first shows a stall at a batch size's first use)")
    ap.add_argument("--profile-levels", default=",".join(map(str, PROFILE_LEVELS)),
                    help="concurrencies each profile:<mode> server is profiled at (each <= the "
                    "prompts and --graph-max-bs)")
    ap.add_argument("--graph-max-bs", type=int, default=32,
                    help="--cuda-graph-max-bs of profile:<mode> servers (8 covers c = 1, 8 and "
                    "starts faster)")
    ap.add_argument("--time-budget-s", type=float, default=0)
    ap.add_argument("--step-min-s", type=float, default=e2e.STEP_MIN_S,
                    help="seconds of the budget a mode needs to start (default %(default)s; a "
                    "byte-compiled small pair's mode takes ~50-75 s)")
    ap.add_argument("--skip-done", type=Path, action="append", default=[], metavar="RESULTS",
                    help="an earlier call's results.json: its finished modes are not run "
                         "again (back-to-back calls share one mode list)")
    ap.add_argument("modes", nargs="+")
    args = ap.parse_args(argv)
    try:
        profile_levels = tuple(int(x) for x in args.profile_levels.split(","))
        if not profile_levels or min(profile_levels) < 1:
            raise ValueError
    except ValueError:
        print(f"serve_pair: --profile-levels {args.profile_levels!r}: positive integers, "
              "comma-separated", file=sys.stderr)
        return 2
    if args.step_min_s < 0:
        print(f"serve_pair: --step-min-s {args.step_min_s}: seconds >= 0", file=sys.stderr)
        return 2
    if args.profile_steps < 0 or args.timed_repeats < 1:
        print(f"serve_pair: --profile-steps {args.profile_steps} / --timed-repeats "
              f"{args.timed_repeats}: steps >= 0 (0 = timed only), repeats >= 1", file=sys.stderr)
        return 2
    steps = []
    for m in args.modes:
        base, _, backend = m.partition("@")
        backend = backend or args.backend
        inner = base.removeprefix("seeded:").removeprefix("profile:")
        try:
            parse_mode(inner)
        except ValueError as exc:
            print(f"serve_pair: {exc}", file=sys.stderr)
            return 2
        if backend not in e2e.BACKENDS:
            print(f"serve_pair: unknown backend {backend!r}", file=sys.stderr)
            return 2
        fi_only = [x for x in split_modifiers(inner)[1] if x in FLASHINFER_ONLY]
        if fi_only and backend != "flashinfer":
            what = {SPLIT_MODIFIER: "splits FlashInfer's verify attention",
                    PAD_MODIFIER: "pads FlashInfer's verify to the bound"}[fi_only[0]]
            print(f"serve_pair: {m}: +{fi_only[0]} {what}; add @flashinfer (with {backend} "
                  "it has nothing to do)", file=sys.stderr)
            return 2
        steps.append((m, base, backend))
    # results are keyed by the mode, logs by its base and backend: a mode given twice (or
    # once with and once without its default @backend) would overwrite the first run's; the
    # (base, backend) pair is derived from the mode, so it alone tells both apart
    first_as: dict[tuple[str, str], str] = {}
    for m, base, backend in steps:
        first = first_as.get((base, backend))
        if first is not None:
            again = "" if first == m else f" (first as {first!r})"
            print(f"serve_pair: mode {m!r} given twice{again}: each mode's record and log are "
                  "keyed by its name; run it again in its own --out", file=sys.stderr)
            return 2
        first_as[(base, backend)] = m
    try:
        done = done_modes(args.skip_done)
    except ValueError as exc:
        print(f"serve_pair: {exc}", file=sys.stderr)
        return 2
    if done & set(args.modes):
        print(f"[serve_pair] done earlier, not run: {' '.join(m for m in args.modes if m in done)}",
              flush=True)
        steps = [s for s in steps if s[0] not in done]
    if args.dummy and not (args.pair / "prompts.jsonl").exists():
        write_dummy_pair(args.pair, shape=args.shape)
    if not (args.pair / "prompts.jsonl").is_file():
        print(f"serve_pair: {args.pair}/prompts.jsonl missing: run real_drafter.train first",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    site = [p for p in args.site.split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site), PYTHONUNBUFFERED="1")
    opts = e2e.Opts(out=args.out, env=env, models=(args.pair / "target", args.pair / "draft"),
                    backend=args.backend, bench=True, bench_prompts="pair",
                    bench_concurrency=",".join(map(str, LEVELS)),
                    bench_num_prompts=args.requests_per_level,
                    clock=e2e.Clock(args.time_budget_s))
    opts.seeded_n = args.seeded_prompts  # type: ignore[attr-defined]
    opts.port = args.port  # type: ignore[attr-defined]
    opts.dummy = args.dummy  # type: ignore[attr-defined]
    opts.graph_max_bs = args.graph_max_bs  # type: ignore[attr-defined]
    opts.freeze_gc = args.freeze_gc  # type: ignore[attr-defined]
    opts.profile_levels = profile_levels  # type: ignore[attr-defined]
    opts.timed_repeats = args.timed_repeats  # type: ignore[attr-defined]
    opts.step_min_s = args.step_min_s  # type: ignore[attr-defined]
    prompts = load_prompts(args.pair)
    bprompts = bench_file(args.out, prompts)
    results: dict = {"modes": args.modes, "pair_report_sha256": None, "serve": {},
                     "seeded": {}, "profile": {}, "freeze_gc": args.freeze_gc,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    report = args.pair / "report.json"
    if report.exists():
        import hashlib

        results["pair_report_sha256"] = hashlib.sha256(report.read_bytes()).hexdigest()
    seeded_cache: dict = {}
    for m, base, backend in steps:
        t0 = time.monotonic()
        left = opts.clock.left()
        try:
            group = base.partition(":")[0] if base.startswith(("seeded:", "profile:")) \
                else "serve"
            need = opts.step_min_s * (SEEDED_SERVERS if group == "seeded" else 1)
            if left < need:
                results[group][m] = {"skipped": f"time budget: {left:.0f}s left, "
                                                f"{need:.0f}s needed"}
            elif group == "profile":
                results["profile"][m] = profile_mode(opts, args.pair,
                                                     base.removeprefix("profile:"), backend,
                                                     prompts, args.profile_steps)
            elif base.startswith("seeded:"):
                results["seeded"][m] = seeded_mode(opts, args.pair, base.removeprefix("seeded:"),
                                                   backend, prompts, seeded_cache)
            else:
                results["serve"][m] = serve_mode(opts, args.pair, base, backend, prompts,
                                                 args.greedy_prompts, args.requests_per_level,
                                                 bprompts)
        except Exception as exc:  # recorded; the next mode still runs
            results.setdefault("errors", {})[m] = f"{type(exc).__name__}: {exc}"
        print(f"[serve_pair] {m}: {time.monotonic() - t0:.1f}s", flush=True)
        serves = {k: v for k, v in results["serve"].items() if "label" in v}
        results["compare"] = greedy_compare(serves)
        results["served"] = served_rows(serves)
        results["elapsed_s"] = round(time.monotonic() - opts.clock.t0, 1)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({
        "compare": {k: {b: (g.get("identical") if isinstance(g, dict) else g)
                        for b, g in v.items()}
                    for k, v in results.get("compare", {}).items()},
        "served": results.get("served"),
        "ready": {m: r.get("ready_seconds") for m, r in results["serve"].items()},
        "check_rc": {m: (r.get("check_url") or {}).get("rc") for m, r in results["serve"].items()},
        "seeded": {m: r.get("summary", r.get("error", r.get("skipped")))
                   for m, r in results["seeded"].items()},
        "profile": {m: [(lv["concurrency"], {k: (lv.get("summary") or {}).get(k) for k in (
                        "wall_ms_per_step", "gpu_busy_ms_per_step", "kernels_per_step",
                        "sync_calls_per_step", "round_host_ms_per_step",
                        "outside_round_host_ms_per_step")}, lv.get("error"))
                       for lv in r.get("levels", [])]
                    + [("timed", t.get("concurrency"), t.get("ms_per_round"), t.get("tok_s"),
                        [x.get("ms_per_round") for x in runs])
                       for t, runs in zip(r.get("timed", []), r.get("timed_runs", []),
                                          strict=False)]
                    for m, r in results["profile"].items()},
        "errors": results.get("errors", {}),
        "serve_errors": {m: r.get("error") or r.get("serve_exit_before_ready")
                         for m, r in results["serve"].items()
                         if r.get("error") or r.get("serve_exit_before_ready")},
        "elapsed_s": results.get("elapsed_s"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
