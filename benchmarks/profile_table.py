"""Markdown table of DDTree per-round stage times from the worker's profile files.

Reads the JSON lines that ``SGLANG_DFLASH_DDTREE_PROFILE`` makes the DDTree worker write (one
line per batch size per window of 64 rounds, each with mean and p50 ms per stage; see
``sglang_dflash.sglang_overlay.diagnostics.profile``) and prints, per file and batch size, the
median over windows of each window's p50, and the first window's mean, which is where one-off
compiles (a Triton kernel built inside a decode round) show up while the p50s hide them.

    python benchmarks/profile_table.py --bs 1,8,32 <gpu_e2e --out dir>/profile-*.jsonl

The tables it made for the recorded runs are in docs/gpu-results.md (§8, §17).

A file that is missing, empty or not JSON lines is one line on stderr and exit status 1; the
other files are still tabulated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_dflash.sglang_overlay.diagnostics.profile import STAGES as ROUND_STAGES

STAGES = (*ROUND_STAGES, "total")


@dataclass(frozen=True)
class Row:
    """One (file, batch size): rounds seen, median-of-window-p50 and first-window mean per stage."""

    label: str
    bs: int
    rounds: int
    p50: dict[str, float]
    first_mean: dict[str, float]


def rows_of(label: str, records: list[dict]) -> list[Row]:
    """Group one file's window records by batch size (records in file order = window order)."""
    by_bs: dict[int, list[dict]] = {}
    for rec in records:
        by_bs.setdefault(int(rec["bs"]), []).append(rec)
    out = []
    for bs in sorted(by_bs):
        group = by_bs[bs]
        out.append(
            Row(
                label=label,
                bs=bs,
                rounds=sum(int(r["rounds"]) for r in group),
                p50={s: statistics.median(r["ms"][s]["p50"] for r in group) for s in STAGES},
                first_mean={s: group[0]["ms"][s]["mean"] for s in STAGES},
            )
        )
    return out


def is_record(rec: object) -> bool:
    """A window line as the profiler writes it: bs, rounds, and mean/p50 numbers per stage."""
    if not isinstance(rec, dict) or not isinstance(rec.get("ms"), dict):
        return False
    if not isinstance(rec.get("bs"), int) or not isinstance(rec.get("rounds"), int):
        return False
    return all(
        isinstance(rec["ms"].get(s), dict)
        and all(isinstance(rec["ms"][s].get(k), int | float) for k in ("mean", "p50"))
        for s in STAGES
    )


def read_records(path: Path) -> list[dict]:
    """The file's records; ValueError with a one-line reason when it cannot be used."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if not is_record(rec):
            raise ValueError(f"{path}:{n}: not a DDTree profile record")
        records.append(rec)
    if not records:
        raise ValueError(f"{path}: no profile records")
    return records


def render(rows: list[Row]) -> str:
    """The markdown table: p50 columns, tree share of verify, then first-window means."""
    head = (
        "| profile | bs | rounds | draft | tree | prep | verify | commit | total | "
        "tree / verify | first window mean: tree | first window mean: total |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        p = r.p50
        share = 100.0 * p["tree"] / p["verify"] if p["verify"] else float("nan")
        lines.append(
            f"| {r.label} | {r.bs} | {r.rounds} | "
            + " | ".join(f"{p[s]:.2f}" for s in STAGES)
            + f" | {share:.1f}% | {r.first_mean['tree']:.2f} | {r.first_mean['total']:.2f} |"
        )
    return "\n".join(lines)


def bs_list(raw: str) -> frozenset[int]:
    """``--bs 1,8,32``: positive integers, or argparse's one-line error."""
    try:
        values = frozenset(int(v) for v in raw.split(","))
    except ValueError:
        msg = f"{raw!r}: expected positive integers like 1,8,32"
        raise argparse.ArgumentTypeError(msg) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: batch sizes must be >= 1")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="profile-*.jsonl files")
    ap.add_argument(
        "--bs",
        type=bs_list,
        default=None,
        metavar="N[,N...]",
        help="only these batch sizes (default: every batch size seen)",
    )
    ap.add_argument(
        "--label",
        choices=("name", "path"),
        default="name",
        help="label rows with the file name (default) or the path as given",
    )
    args = ap.parse_args(argv)
    rows: list[Row] = []
    failed = False
    for path in args.profiles:
        try:
            records = read_records(path)
        except ValueError as exc:
            print(f"profile_table: {exc}", file=sys.stderr)
            failed = True
            continue
        label = path.name if args.label == "name" else str(path)
        rows += [r for r in rows_of(label, records) if args.bs is None or r.bs in args.bs]
    if rows:
        print(render(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
