#!/usr/bin/env python3
"""Turn one GPU run's raw output directory into one compact summary file (stdlib only).

The rule for everything under ``docs/gpu-runs/``: raw run outputs (server logs, bench records,
profiler windows, results.json) are not committed; each run directory becomes
``docs/gpu-runs/<date>/<run>.json`` holding

* ``raw_files``: every raw file's path (relative to the date directory), byte size and sha256;
* ``raw_location``: where the raw files can still be read (a git commit, or a place outside the
  repository), with the command that reads one;
* ``files``: per raw file, the figures the docs cite, reduced by file type:
  - ``*.json``: the same structure with long token lists and strings shortened, per-request
    bench ``records`` reduced to counts, profiler windows (``profile``) reduced per batch size,
    a bench JSON without the parts every one of a run repeats (``machine``, ``configs``,
    ``comparison``, ``best``: the run's machine, the command in ``argv``), a trace summary's
    top-N lists (``top_kernels`` ...) to their first ``TOP_N`` and its ``ranges`` to
    ``TOP_RANGES``;
  - ``profile-*.jsonl``: per batch size, windows, rounds, the median over windows of each
    window's p50 and the first window's mean, per stage (what ``benchmarks/profile_table.py``
    prints);
  - ``*.log``: every line except request/health/progress noise, repeated lines folded with a
    count, SGLang's ``Decode batch`` lines reduced to their accept-length values;
  - other text (``*.txt``, ``*.err``, short ``*.jsonl``): kept whole when short, else as a log.

    python3 scripts/summarise_gpu_run.py RUN_DIR [RUN_DIR ...] \
        [--raw-commit COMMIT | --raw-location TEXT] [--out FILE] [--remove]

writes ``RUN_DIR.json`` beside each directory (``--out`` for one directory). A single raw file
(not a directory) is summarised the same way into ``FILE`` with its suffix replaced by ``.json``.
With ``--raw-commit`` every raw file must be in that commit, byte for byte (checked through
``git``); a mismatch is one line on stderr and exit status 1. ``--remove`` deletes the raw
files once their summary is written.

    python3 scripts/summarise_gpu_run.py --refold SUMMARY.json [SUMMARY.json ...]

folds existing summaries further to make room under ``LIMIT_BYTES`` (an old lease's, whose
figures the docs already carry): in ``files`` every list longer than ``2 x REFOLD_ITEMS`` keeps
its first and last ``REFOLD_ITEMS`` around a ``{"folded": n}`` marker, every string longer than
``REFOLD_CHARS`` its two ends; ``raw_files`` and ``raw_location`` (where the raw files still
are, byte for byte) stay as they were, and ``refolded`` records the parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

SCHEMA = "sglang-dflash-gpu-run-summary/1"
# docs/gpu-runs: each summary, and all of them together. A lease's summaries take 0.2-0.4 MB
# (raw 3-8 MB); the total bounds the tree's growth (at 2 MiB, 2026-12-05, the only summaries of
# earlier leases had to go to make room for the next one), raw files are refused by name.
LIMIT_BYTES = 5 * 1024 * 1024
RUN_LIMIT_BYTES = 320 * 1024
STAGES = ("draft", "tree", "prep", "verify", "commit", "total")

MAX_NUM_LIST = 16  # longer lists of numbers (token ids, per-round counts) are shortened
MAX_STR = 2000  # longer strings keep their last lines only
TAIL_LINES = 12
MAX_LINE = 500
TEXT_WHOLE = 8192  # text files up to this size are kept whole
BENCH_SCHEMA = "sglang-dflash-bench/1"
BENCH_REPEATS = ("machine", "configs", "comparison", "best")  # the same in every bench of a run
TOP_N = 6  # entries kept of a trace summary's top_kernels / top_cpu_ops / top_runtime_calls
TOP_LISTS = ("top_kernels", "top_cpu_ops", "top_runtime_calls")
TOP_RANGES = 14  # and of its ranges (host and GPU ms per profiler range, largest first)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\]\s*")
_NOISE = re.compile(
    r'"(GET|POST) /(health|generate|model_info|server_info|get_server_info)[^"]*"'
    r"|Prefill batch|Capturing batches|^\s*\d+%\|"
)
_DECODE = re.compile(r"Decode batch")
_ACCEPT = re.compile(r"accept len: ([0-9.]+)")
_GEN_TPUT = re.compile(r"gen throughput \(token/s\): ([0-9.]+)")


class SummaryError(Exception):
    """A run directory that cannot be summarised; the message is one line."""


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _num(x: float) -> float:
    """Six significant digits: every figure the docs quote survives, float noise does not."""
    return float(f"{x:.6g}")


def _short_str(s: str) -> object:
    if len(s) <= MAX_STR:
        return s
    lines = [
        ln[:MAX_LINE] for ln in _ANSI.sub("", s).replace("\r", "\n").splitlines() if ln.strip()
    ]
    return {"chars": len(s), "tail": lines[-TAIL_LINES:]}


def profile_by_bs(records: list[dict]) -> list[dict]:
    """Profiler windows grouped by batch size: rounds, median of window p50s, first-window mean."""
    by_bs: dict[int, list[dict]] = {}
    for rec in records:
        if isinstance(rec, dict) and isinstance(rec.get("ms"), dict) and "bs" in rec:
            by_bs.setdefault(int(rec["bs"]), []).append(rec)
    out = []
    for bs in sorted(by_bs):
        group = by_bs[bs]
        stages = [s for s in STAGES if all(s in r["ms"] for r in group)]
        head = {k: group[0][k] for k in ("budget", "draft_width", "plant") if k in group[0]}
        out.append(
            {
                **head,
                "bs": bs,
                "windows": len(group),
                "rounds": sum(int(r.get("rounds", 0)) for r in group),
                "p50_median_ms": {
                    s: _num(statistics.median(r["ms"][s]["p50"] for r in group)) for s in stages
                },
                "first_window_mean_ms": {s: _num(group[0]["ms"][s]["mean"]) for s in stages},
            }
        )
    return out


def _bench_records(records: list) -> dict:
    ok = [r for r in records if isinstance(r, dict) and r.get("ok")]
    errors = sorted(
        {str(r.get("error"))[:MAX_LINE] for r in records if isinstance(r, dict) and r.get("error")}
    )
    return {
        "n": len(records),
        "ok": len(ok),
        "errors": errors,
        "output_tokens": sum(int(r.get("output_tokens") or 0) for r in ok),
    }


def reduce_json(value: object, key: str = "") -> object:
    """The same structure with what only bulks it up shortened (see the module docstring)."""
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, str):
        if key == "log_tail":
            lines = [ln[:MAX_LINE] for ln in _ANSI.sub("", value).splitlines() if ln.strip()]
            return (
                {"chars": len(value), "tail": lines[-TAIL_LINES:]}
                if len(lines) > TAIL_LINES
                else lines
            )
        return _short_str(value)
    if isinstance(value, dict):
        bench = value.get("schema") == BENCH_SCHEMA
        return {k: reduce_json(v, k) for k, v in value.items()
                if not (bench and k in BENCH_REPEATS)}
    if isinstance(value, list):
        if key in TOP_LISTS or key == "ranges":
            value = value[: TOP_N if key in TOP_LISTS else TOP_RANGES]
        if key == "records":
            return _bench_records(value)
        if key == "profile" and value and all(isinstance(v, dict) and "ms" in v for v in value):
            return {"by_bs": profile_by_bs(value)}
        if key == "log_tail":
            lines = [str(ln)[:MAX_LINE] for ln in value]
            return lines[-TAIL_LINES:]
        scalars = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if scalars and len(value) > MAX_NUM_LIST:
            return {
                "n": len(value),
                "head": [reduce_json(v) for v in value[:4]],
                "sha256": hashlib.sha256(json.dumps(value).encode()).hexdigest(),
            }
        return [reduce_json(v, key) for v in value]
    return repr(value)[:MAX_LINE]


def reduce_log(text: str) -> dict:
    """Log lines minus noise, repeats folded; SGLang's decode lines as their accept lengths."""
    lines = _ANSI.sub("", text).replace("\r", "\n").splitlines()
    kept: list[dict] = []
    index: dict[str, int] = {}
    decode = 0
    accept: set[float] = set()
    gen_max = 0.0
    for raw in lines:
        if not raw.strip() or _NOISE.search(raw):
            continue
        if _DECODE.search(raw):
            decode += 1
            if m := _ACCEPT.search(raw):
                accept.add(round(float(m.group(1)), 2))
            if m := _GEN_TPUT.search(raw):
                gen_max = max(gen_max, float(m.group(1)))
            continue
        norm = _STAMP.sub("", raw)[:MAX_LINE]
        if norm in index:
            kept[index[norm]]["count"] += 1
            stamp = _STAMP.match(raw)
            if stamp:
                kept[index[norm]]["last"] = stamp.group(0).strip()
            continue
        index[norm] = len(kept)
        kept.append({"line": raw[:MAX_LINE], "count": 1})
    out: dict = {"lines": len(lines), "kept": [e if e["count"] > 1 else e["line"] for e in kept]}
    if decode:
        out["decode_batch"] = {
            "lines": decode,
            "accept_len_values": sorted(accept),
            "gen_throughput_max": _num(gen_max),
        }
    return out


def reduce_file(path: Path, seen: dict | None = None, label: str | None = None) -> object:
    return reduce_bytes(path.name, path.read_bytes(), seen, label or path.name)


def reduce_bytes(name: str, data: bytes, seen: dict | None = None,
                 label: str | None = None) -> object:
    """One raw file's reduction by its name; a gzip file is read through (``x.log.gz`` as the
    log it holds), a gzipped tar member by member (``{"members": {name: reduction}}``).
    ``seen`` (content sha256 -> where it was reduced first) turns a repeat, e.g. a server log
    both on its own and inside the run's archive, into ``{"same_as": where}``."""
    if name.endswith((".tgz", ".tar.gz")):
        import io
        import tarfile

        members = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                f = tar.extractfile(m) if m.isfile() else None
                if f is not None:
                    members[m.name] = reduce_bytes(Path(m.name).name, f.read(), seen,
                                                   f"{label}:{m.name}")
        return {"members": members}
    if name.endswith(".gz"):
        import gzip

        return reduce_bytes(name[: -len(".gz")], gzip.decompress(data), seen, label)
    if seen is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            return {"same_as": seen[digest]}
        seen[digest] = label or name
    text = data.decode("utf-8", errors="replace")
    if name.endswith(".json"):
        try:
            return reduce_json(json.loads(text))
        except ValueError:
            return {"not_json": reduce_log(text)}
    if name.endswith(".jsonl"):
        records = []
        for ln in text.splitlines():
            if ln.strip():
                try:
                    records.append(json.loads(ln))
                except ValueError:
                    return reduce_log(text)
        if name.startswith("profile-"):
            return {"by_bs": profile_by_bs(records)}
        if len(data) <= TEXT_WHOLE:
            return records
        return [reduce_json(r) for r in records[:TAIL_LINES]] + [
            {"omitted_records": len(records) - TAIL_LINES}
        ]
    if name.endswith(".log") or len(data) > TEXT_WHOLE:
        return reduce_log(text)
    return text.splitlines()


def raw_files_of(target: Path) -> list[Path]:
    if target.is_file():
        return [target]
    files = sorted(p for p in target.rglob("*") if p.is_file())
    if not files:
        raise SummaryError(f"{target}: no files to summarise")
    return files


def _git(args: list[str], cwd: Path, stdin: bytes | None = None) -> bytes:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, input=stdin, capture_output=True, check=False
        )
    except OSError as exc:
        raise SummaryError(f"git: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        raise SummaryError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def git_blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def verify_in_commit(files: list[Path], commit: str) -> str:
    """The full commit hash; SummaryError unless each file is in it with the same bytes."""
    top = Path(_git(["rev-parse", "--show-toplevel"], files[0].parent).decode().strip())
    full = _git(["rev-parse", "--verify", f"{commit}^{{commit}}"], top).decode().strip()
    for f in files:
        rel = f.resolve().relative_to(top.resolve()).as_posix()
        try:
            blob = _git(["rev-parse", "--verify", f"{full}:{rel}"], top).decode().strip()
        except SummaryError:
            raise SummaryError(f"{rel}: not in commit {full[:12]}") from None
        if blob != git_blob_id(f):
            raise SummaryError(f"{rel}: differs from its copy in commit {full[:12]}")
    return full


def summarise(target: Path, raw_commit: str | None = None, raw_location: str | None = None,
              seen: dict[str, str] | None = None) -> dict:
    """One run's summary. ``seen`` (content sha256 -> where it was reduced first) may be shared
    by the runs of one invocation, the calls of one lease: a file a later run repeats byte for
    byte (a resumed grid's export carries the earlier call's files) is then reduced once, and
    the later summary names the earlier path (``{"same_as": "<run>/<file>"}``; its raw_files
    entry keeps its own sha256)."""
    target = target.resolve()
    files = raw_files_of(target)
    base = target.parent
    rels = [f.relative_to(base).as_posix() for f in files]
    seen = {} if seen is None else seen
    if raw_commit:
        full = verify_in_commit(files, raw_commit)
        top = Path(_git(["rev-parse", "--show-toplevel"], base).decode().strip()).resolve()
        prefix = base.relative_to(top).as_posix()
        location = {
            "git_commit": full,
            "read_with": f"git show {full[:12]}:{prefix}/{rels[0]}",
            "note": "raw files are not in the tree; they stay in git history at this commit",
        }
    else:
        location = {"note": raw_location or "raw files are not in the repository"}
    return {
        "schema": SCHEMA,
        "run": target.name if target.is_dir() else target.stem,
        "generated_by": "scripts/summarise_gpu_run.py",
        "raw_location": location,
        "raw_files": [
            {"path": r, "bytes": f.stat().st_size, "sha256": sha256_of(f)}
            for r, f in zip(rels, files, strict=True)
        ],
        "files": {r: reduce_file(f, seen, r) for r, f in zip(rels, files, strict=True)},
    }


def dumps(summary: dict) -> str:
    """JSON with one line per raw file and per reduced file: compact, and diffs stay readable."""

    def c(v: object) -> str:
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    head = ",\n".join(
        f"{c(k)}: {c(v)}" for k, v in summary.items() if k not in ("raw_files", "files")
    )
    raw = ",\n  ".join(c(f) for f in summary["raw_files"])
    files = ",\n  ".join(f"{c(k)}: {c(v)}" for k, v in summary["files"].items())
    return f'{{{head},\n"raw_files": [\n  {raw}],\n"files": {{\n  {files}}}}}\n'


def output_path(target: Path) -> Path:
    return (
        target.with_name(target.name + ".json") if target.is_dir() else target.with_suffix(".json")
    )


REFOLD_ITEMS = 3
REFOLD_CHARS = 240


def refold(value: object) -> object:
    """``value`` with long lists and strings folded (see the module docstring)."""
    if isinstance(value, dict):
        return {k: refold(v) for k, v in value.items()}
    if isinstance(value, list):
        n = REFOLD_ITEMS
        if len(value) > 2 * n + 1:
            return [*map(refold, value[:n]), {"folded": len(value) - 2 * n},
                    *map(refold, value[-n:])]
        return [refold(v) for v in value]
    if isinstance(value, str) and len(value) > REFOLD_CHARS:
        half = REFOLD_CHARS // 2
        return f"{value[:half]} …[{len(value) - 2 * half} chars folded]… {value[-half:]}"
    return value


def refold_summary(path: Path) -> tuple[int, int]:
    """Fold one summary file in place; (bytes before, bytes after). SummaryError when it is
    not a summary this script wrote."""
    try:
        before = path.stat().st_size
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SummaryError(f"{path}: not a readable JSON summary ({exc})") from None
    if not isinstance(summary, dict) or summary.get("schema") != SCHEMA:
        raise SummaryError(f"{path}: not a {SCHEMA} summary")
    summary["files"] = {k: refold(v) for k, v in summary.get("files", {}).items()}
    summary["refolded"] = {"items": REFOLD_ITEMS, "chars": REFOLD_CHARS,
                           "why": "room under LIMIT_BYTES; the raw files are at raw_location"}
    path.write_text(dumps(summary))
    return before, path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="+", type=Path, help="run directories (or single raw files)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--raw-commit", help="git commit that holds the raw files (checked)")
    where.add_argument("--raw-location", help="where the raw files are kept, in words")
    ap.add_argument("--out", type=Path, help="output file (one target only)")
    ap.add_argument("--remove", action="store_true", help="delete the raw files after summarising")
    ap.add_argument("--refold", action="store_true",
                    help="the targets are summaries: fold them further in place")
    args = ap.parse_args(argv)
    if args.refold:
        if args.out or args.remove or args.raw_commit or args.raw_location:
            ap.error("--refold takes summary files only (no --out, --remove, --raw-*)")
        try:
            for target in args.targets:
                before, after = refold_summary(target)
                print(f"{target}: {before} -> {after} bytes")
        except SummaryError as exc:
            print(f"summarise_gpu_run: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.out and len(args.targets) != 1:
        ap.error("--out takes one target")
    seen: dict[str, str] = {}  # shared by the targets: a repeat across runs is reduced once
    try:
        for target in args.targets:
            if not target.exists():
                raise SummaryError(f"{target}: no such file or directory")
            out = args.out or output_path(target)
            if out.resolve() in {p.resolve() for p in raw_files_of(target)}:
                raise SummaryError(f"{target}: its summary would overwrite it; pass --out")
            summary = summarise(target, args.raw_commit, args.raw_location, seen)
            out.write_text(dumps(summary))
            print(
                f"{out}: {len(summary['raw_files'])} raw files, "
                f"{sum(f['bytes'] for f in summary['raw_files'])} bytes"
                f" -> {out.stat().st_size} bytes"
            )
            if args.remove:
                for f in raw_files_of(target):
                    f.unlink()
                if target.is_dir():
                    for d in sorted((p for p in target.rglob("*") if p.is_dir()), reverse=True):
                        d.rmdir()
                    target.rmdir()
    except SummaryError as exc:
        print(f"summarise_gpu_run: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
