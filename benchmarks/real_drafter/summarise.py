"""Turn one GPU session's raw outputs (train report + serve_pair results) into the compact
``docs/perf/real-drafter.json`` of issue 15 and its PNG. Raw files stay out of the tree; the
summary records their sha256.

    PYTHONPATH=src:benchmarks python3 -m real_drafter.summarise --report R.json \\
        --results A.json --results B.json --raw FILE ... --out docs/perf/real-drafter.json \\
        --png docs/perf/real-drafter.png --machine "..." --command "..." ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import textwrap
from pathlib import Path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def served_table(results: list[dict]) -> list[dict]:
    """The served rows of every call, one per (mode, backend, concurrency): a call that cut a
    mode short and the next call that ran it again both carry it, the later call's row wins
    (``--results`` order)."""
    cells: dict[tuple, dict] = {}
    for res in results:
        for r in res.get("served", []):
            cells[(r["mode"], r.get("backend"), r["concurrency"])] = r
    return list(cells.values())


def _cell(r: dict) -> str:
    """A serve record's key in the summary: two backends in one session must not collide."""
    return f"{r['label']}@{r.get('backend')}"


def merged_serves(results: list[dict]) -> dict[str, dict]:
    """The served records with greedy rows, one per ``label@backend``; the later call wins (a
    rerun after a cut-short call; a later record without greedy rows keeps the earlier one)."""
    serves: dict[str, dict] = {}
    for res in results:
        for r in res.get("serve", {}).values():
            if r.get("label") and r.get("greedy"):
                serves[_cell(r)] = r
    return serves


def ratios(rows: list[dict]) -> list[dict]:
    """tok/s of each mode over none and over dflash, per (backend, concurrency)."""
    by = {(r["backend"], r["concurrency"], r["mode"]): r["tok_s"] for r in rows}
    out = []
    for (backend, c, mode), tok in sorted(by.items()):
        none, dflash = by.get((backend, c, "none")), by.get((backend, c, "dflash"))
        out.append({"mode": mode, "backend": backend, "concurrency": c,
                    "over_none": round(tok / none, 3) if none else None,
                    "over_dflash": round(tok / dflash, 3) if dflash else None})
    return out


def round_cost(rows: list[dict]) -> list[dict]:
    """Wall-clock ms per verify round = 1000 * accept_length / (tok/s / concurrency): what a
    round costs end to end, scheduler included (issue 14 item 2's measure)."""
    out = []
    for r in rows:
        if r.get("accept_length") and r.get("tok_s"):
            per_req = r["tok_s"] / r["concurrency"]
            out.append({"mode": r["mode"], "backend": r["backend"],
                        "concurrency": r["concurrency"],
                        "ms_per_round": round(1000 * r["accept_length"] / per_req, 3)})
        elif r.get("tok_s"):
            out.append({"mode": r["mode"], "backend": r["backend"],
                        "concurrency": r["concurrency"],
                        "ms_per_step": round(1000 * r["concurrency"] / r["tok_s"], 3)})
    return out


def greedy_references(results: list[dict]) -> dict[str, str]:
    """Per mode (``label@backend``), the ``none`` record its greedy outputs are compared with:
    the same backend's (bf16 kernels differ between backends, so across them outputs may
    differ without a bug), else any backend's, which the summary then names."""
    serves = merged_serves(results)
    nones = {r.get("backend"): k for k, r in serves.items() if r["label"] == "none"}
    if not nones:
        return {}
    fallback = next(iter(nones.values()))
    return {k: nones.get(r.get("backend"), fallback) for k, r in serves.items()
            if r["label"] != "none"}


def greedy_first_diffs(results: list[dict]) -> dict:
    """Per mode (``label@backend``), the first differing output position of each greedy
    prompt against its reference none (``greedy_references``; null = identical over all 256
    tokens)."""
    serves = merged_serves(results)

    def first(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)

    out = {}
    for k, ref in greedy_references(results).items():
        base = [g["output"] for g in serves[ref]["greedy"]]
        out[k] = [first(g["output"], b) for g, b in zip(serves[k]["greedy"], base, strict=False)]
    return out


def served_vs_offline(report: dict, results: list[dict]) -> dict:
    """Verify rounds per greedy prompt, served (per ``label@backend``) against the offline
    simulation of the same mode."""
    label_to_mode = {"dflash": "dflash"} | {f"ddtree-{n}": f"ddtree-{n}"
                                           for n in report["offline_accept_length_ddtree"]}
    out = {}
    for k, r in merged_serves(results).items():
        mode = label_to_mode.get(r["label"])
        if mode:
            served = [g["spec_verify_ct"] for g in r["greedy"]]
            offline = report["modes"][mode]["rounds_per_request"][: len(served)]
            out[k] = {"served_rounds": served, "offline_rounds": offline,
                      "served_pooled_accept": round(
                          sum(g["completion_tokens"] for g in r["greedy"]) / sum(served), 4),
                      "offline_pooled_accept": round(len(offline) * 256 / sum(offline), 4)}
    return out


def served_accept_histogram(results: list[dict]) -> dict:
    """Per mode (``label@backend``), SGLang's per-request accept histograms of the greedy
    prompts summed, and the pooled accept length (tokens per verify round) over the same
    requests: issue 15's accept length per mode and budget, mean and histogram, as served."""
    out = {}
    for k, r in merged_serves(results).items():
        rows = [g for g in r["greedy"] if g.get("spec_accept_histogram")]
        if not rows:
            continue
        hist = [0] * max(len(g["spec_accept_histogram"]) for g in rows)
        for g in rows:
            for i, n in enumerate(g["spec_accept_histogram"]):
                hist[i] += n
        rounds = sum(g.get("spec_verify_ct") or 0 for g in rows)
        tokens = sum(g.get("completion_tokens") or 0 for g in rows)
        out[k] = {"histogram": hist,
                  "mean_accept_length": round(tokens / rounds, 4) if rounds else None}
    return out


def seeded(results: list[dict]) -> dict:
    out = {}
    for res in results:
        for m, r in res.get("seeded", {}).items():
            summary = dict(r["summary"]) if r.get("summary") else None
            if summary and not summary.get("prompts"):  # no rows: no verdict (older records
                summary["all_identical"] = None          # said False)
            out[m] = {"summary": summary,
                      "first_diff": [x.get("first_diff") for x in r.get("rows", [])]}
            why = r.get("skipped") or r.get("error")
            if why:
                out[m]["not_run"] = why
    return out


def tie_verdict(tie: dict) -> dict:
    """``real_drafter.tie_margin``'s verdict, as the summary carries it: token identity cannot
    judge losslessness on real weights (bf16 near-ties flip), the tie margin can."""
    s = tie["summary"]
    return {k: s.get(k) for k in ("lossless_explained", "divergences", "mismatches",
                                  "seeded_unjudged", "per_mode")} | {
        "rule": tie.get("rule"), "seeded_rule": tie.get("seeded_rule"),
        "reference": tie.get("reference")}


def _mode_order(mode: str) -> tuple:
    """none, dflash, the fixed budgets by size, then adaptive (``ddtree-8`` before ``-16``)."""
    digits = "".join(ch for ch in mode if ch.isdigit())
    return (mode != "none", mode != "dflash", "adaptive" in mode, int(digits or 0), mode)


def plot(rows: list[dict], png: Path, machine: str, caption: str | None = None) -> None:
    """One panel per attention backend (tok/s are only comparable within one), each mode a
    bar per concurrency level; the modes keep one colour across panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("tok_s")]
    order = {"triton": 0, "flashinfer": 1}
    backends = sorted({r["backend"] for r in rows}, key=lambda b: (order.get(b, 2), str(b)))
    modes = sorted({r["mode"] for r in rows}, key=_mode_order)
    colour = {m: f"C{i % 10}" for i, m in enumerate(modes)}
    panels = max(1, len(backends))
    fig, axes = plt.subplots(1, panels, figsize=(1 + 6 * panels, 4.2), sharey=True,
                             squeeze=False)
    for ax, backend in zip(axes[0], backends, strict=False):
        mine = [r for r in rows if r["backend"] == backend]
        here = [m for m in modes if any(r["mode"] == m for r in mine)]
        levels = sorted({r["concurrency"] for r in mine})
        width = 0.8 / max(1, len(here))
        for i, m in enumerate(here):
            xs, ys = [], []
            for j, c in enumerate(levels):
                hit = [r for r in mine if r["mode"] == m and r["concurrency"] == c]
                if hit:
                    xs.append(j + (i - (len(here) - 1) / 2) * width)
                    ys.append(hit[0]["tok_s"])
            ax.bar(xs, ys, width=width, label=m, color=colour[m])
        ax.set_xticks(range(len(levels)), [f"c = {c}" for c in levels])
        ax.set_yscale("log")
        ax.set_title(f"{backend} attention", fontsize=9)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("output tok/s (log)")
    # a machine line longer than the figure is wrapped, not cut at the edges
    title = "\n".join(textwrap.wrap(machine, 70 + 60 * (panels - 1)))
    fig.suptitle(f"Trained pair (29M Qwen3 + 3-layer DFlash)\n{title}", fontsize=9)
    fig.tight_layout()
    if caption:  # what a reader of the figure alone must know (e.g. rows of a faulty build)
        fig.subplots_adjust(bottom=0.2)
        fig.text(0.01, 0.01, caption, fontsize=7, wrap=True, va="bottom")
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("--results", type=Path, action="append", required=True)
    ap.add_argument("--raw", type=Path, action="append", default=[])
    ap.add_argument("--tie", type=Path, help="real_drafter.tie_margin's output over the same "
                    "results: its verdict goes into the summary")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--caption", help="a line printed under the plot")
    args = ap.parse_args(argv)
    tie_paths = [args.tie] if args.tie else []
    for p in [args.report, *args.results, *args.raw, *tie_paths]:
        if not p.is_file():
            print(f"summarise: {p}: no such file", file=sys.stderr)
            return 2
    try:
        report = json.loads(args.report.read_text())
        results = [json.loads(p.read_text()) for p in args.results]
        tie = json.loads(args.tie.read_text()) if args.tie else None
    except json.JSONDecodeError as exc:
        print(f"summarise: unreadable JSON: {exc}", file=sys.stderr)
        return 2
    rows = served_table(results)
    diffs = greedy_first_diffs(results)
    doc = {
        "offline_accept_length_dflash": round(report["offline_accept_length_dflash"], 4),
        "offline_accept_length_ddtree": {k: round(v, 4) for k, v in
                                         report["offline_accept_length_ddtree"].items()},
        "offline_accepted_drafts_histogram": {m: v["accepted_drafts_histogram"]
                                              for m, v in report["modes"].items()},
        "greedy_identical_all_modes": bool(diffs) and all(
            all(d is None for d in v) for v in diffs.values()),
        "greedy_first_diff_vs_none": diffs,
        # per mode, the none record it was compared with: another backend's only where its
        # own backend served no none
        "greedy_first_diff_reference": greedy_references(results),
        "served": [{k: r[k] for k in ("mode", "backend", "concurrency", "accept_length",
                                      "tok_s")} for r in rows],
        "ratios": ratios(rows),
        "round_cost": round_cost(rows),
        "served_vs_offline": served_vs_offline(report, results),
        "served_accept_histogram": served_accept_histogram(results),
        "seeded": seeded(results),
        "tie_margin": tie_verdict(tie) if tie else None,
        "training": {"target_steps": report["target_train"]["steps"],
                     "target_stopped_early": report["target_train"]["stopped_early"],
                     "target_final_loss": round(report["target_train"]["losses"][-1], 4),
                     "draft_steps": report["draft_train"]["steps"],
                     "draft_final_loss": round(report["draft_train"]["losses"][-1], 4),
                     "wall_s": {k: round(v, 1) for k, v in report["wall_s"].items()},
                     "weights_sha256": report["sha256"], "versions": report["versions"]},
        "notes": args.note,
        "commands": args.command,
        "machine": args.machine,
        # keyed by the path as given: two calls' results are both results.json
        "raw_sha256": {str(p): _sha(p) for p in [args.report, *args.results, *args.raw,
                                                 *tie_paths]},
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    if args.png:
        plot(rows, args.png, args.machine, args.caption)
    return 0


if __name__ == "__main__":
    sys.exit(main())
