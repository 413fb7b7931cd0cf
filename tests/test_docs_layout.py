"""docs/gpu-runs holds per-run summaries only (within the script's size limits), each with a
sha256 per raw file, and every doc reference into it resolves; scripts/summarise_gpu_run.py
writes those summaries."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "gpu-runs"
_spec = importlib.util.spec_from_file_location(
    "summarise_gpu_run", ROOT / "scripts" / "summarise_gpu_run.py"
)
summarise_gpu_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summarise_gpu_run)
LIMIT = summarise_gpu_run.LIMIT_BYTES
RUN_LIMIT = summarise_gpu_run.RUN_LIMIT_BYTES

_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_MENTION = re.compile(r"docs/gpu-runs/[A-Za-z0-9_.*/<>-]*[A-Za-z0-9_*>/]")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def summary_problems(runs: Path) -> list[str]:
    """Why the directory breaks the rule: too big, a raw file in it, a summary short of sha256s."""
    problems = []
    files = sorted(p for p in runs.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    if total > LIMIT:
        problems.append(f"{runs}: {total} bytes > {LIMIT}")
    for p in files:
        rel = p.relative_to(runs).as_posix()
        if rel == "README.md":
            continue
        if p.suffix != ".json" or len(p.relative_to(runs).parts) != 2:
            problems.append(
                f"{rel}: not a <date>/<run>.json summary (raw files stay out of the tree)"
            )
            continue
        try:
            s = json.loads(p.read_text())
        except ValueError as exc:
            problems.append(f"{rel}: not JSON ({exc})")
            continue
        if p.stat().st_size > RUN_LIMIT:
            problems.append(f"{rel}: {p.stat().st_size} bytes > {RUN_LIMIT} for one summary")
        if not isinstance(s, dict) or s.get("schema") != summarise_gpu_run.SCHEMA:
            problems.append(f"{rel}: schema is not {summarise_gpu_run.SCHEMA}")
            continue
        raw = s.get("raw_files")
        if not isinstance(raw, list) or not raw:
            problems.append(f"{rel}: no raw_files")
            continue
        for entry in raw:
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("path"), str)
                and isinstance(entry.get("bytes"), int)
                and _SHA.match(str(entry.get("sha256", "")))
            ):
                problems.append(f"{rel}: raw file entry without path/bytes/sha256: {entry!r}"[:300])
        if not isinstance(s.get("raw_location"), dict):
            problems.append(f"{rel}: no raw_location")
        paths = {e.get("path") for e in raw if isinstance(e, dict)}
        if set(s.get("files", {})) != paths:
            problems.append(f"{rel}: files and raw_files name different paths")
    return problems


def recorded_raw_paths(runs: Path) -> set[str]:
    """docs/gpu-runs/<date>/<run>/<file> of every raw file some summary records."""
    out = set()
    for p in runs.glob("*/*.json"):
        try:
            s = json.loads(p.read_text())
        except ValueError:
            continue
        for e in s.get("raw_files", []) if isinstance(s, dict) else []:
            if isinstance(e, dict) and isinstance(e.get("path"), str):
                out.add(f"docs/gpu-runs/{p.parent.name}/{e['path']}")
    return out


def reference_problems(root: Path) -> list[str]:
    """Links into docs/gpu-runs that do not resolve; named paths that are neither there nor a
    raw file a summary records (a raw file is traced through its summary)."""
    runs = root / "docs" / "gpu-runs"
    recorded = recorded_raw_paths(runs)
    docs = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    problems = []
    for doc in docs:
        if not doc.is_file():
            continue
        text = doc.read_text()
        for m in _LINK.finditer(text):
            target = (doc.parent / m.group(1)).resolve()
            try:
                rel = target.relative_to(runs.resolve())
            except ValueError:
                continue
            if not target.exists():
                problems.append(
                    f"{doc.relative_to(root)}: link to docs/gpu-runs/{rel.as_posix()},"
                    " which does not exist"
                )
        for m in _MENTION.finditer(text):
            named = m.group(0).rstrip("/.")
            if "<" in named:  # a pattern in prose: docs/gpu-runs/<date>/<run>.json
                continue
            present = [p.relative_to(root).as_posix() for p in runs.rglob("*")]
            if any(fnmatch.fnmatch(p, named) for p in present) or (root / named).exists():
                continue
            if any(fnmatch.fnmatch(p, named) for p in recorded):
                continue
            problems.append(
                f"{doc.relative_to(root)}: names {named}:"
                " neither in the tree nor recorded in a summary"
            )
    return problems


# ---- the repository itself ----------------------------------------------------------------


def test_gpu_runs_holds_summaries_only_within_the_limits():
    assert summary_problems(RUNS) == []


def test_every_doc_reference_into_gpu_runs_resolves():
    assert reference_problems(ROOT) == []


def test_summaries_were_made_by_the_script_and_name_where_the_raw_files_are():
    summaries = sorted(RUNS.glob("*/*.json"))
    assert summaries, "no run summaries under docs/gpu-runs"
    for p in summaries:
        s = json.loads(p.read_text())
        assert s["generated_by"] == "scripts/summarise_gpu_run.py", p
        assert s["raw_location"].get("git_commit") or s["raw_location"].get("note"), p


def test_raw_files_are_in_git_history_with_the_recorded_size_and_sha256():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the raw files' history cannot be read here")
    wanted = []
    for p in sorted(RUNS.glob("*/*.json")):
        s = json.loads(p.read_text())
        commit = s["raw_location"].get("git_commit")
        if not commit:
            continue
        for e in s["raw_files"]:
            wanted.append((f"{commit}:docs/gpu-runs/{p.parent.name}/{e['path']}", e))
    if not wanted:
        pytest.skip("no summary names a git commit for its raw files")
    commits = {w.split(":", 1)[0] for w, _ in wanted}
    for c in commits:
        r = subprocess.run(
            ["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=ROOT, capture_output=True
        )
        if r.returncode != 0:
            pytest.skip(
                f"commit {c[:12]} is not in this clone (shallow?): raw files not checkable here"
            )
    batch = "".join(f"{w}\n" for w, _ in wanted).encode()
    out = subprocess.run(
        ["git", "cat-file", "--batch"], cwd=ROOT, input=batch, capture_output=True, check=True
    ).stdout
    pos = 0
    for obj, entry in wanted:
        nl = out.index(b"\n", pos)
        header = out[pos:nl].decode()
        assert not header.endswith("missing"), f"{obj}: not in git history"
        size = int(header.split()[2])
        data = out[nl + 1 : nl + 1 + size]
        pos = nl + 1 + size + 1
        assert size == entry["bytes"], obj
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], obj


# ---- the checks can fail ------------------------------------------------------------------


def _fake_repo(tmp_path: Path) -> Path:
    runs = tmp_path / "docs" / "gpu-runs" / "2030-01-01"
    runs.mkdir(parents=True)
    raw = tmp_path / "raw" / "run1"
    raw.mkdir(parents=True)
    (raw / "check.txt").write_text("PASS abi.torch: 2.11.0\n")
    assert (
        summarise_gpu_run.main(
            [str(raw), "--out", str(runs / "run1.json"), "--raw-location", "kept elsewhere"]
        )
        == 0
    )
    (tmp_path / "README.md").write_text(
        "see [run 1](docs/gpu-runs/2030-01-01/run1.json), `run1/check.txt`\n"
    )
    return tmp_path


def test_a_clean_fake_layout_passes(tmp_path):
    root = _fake_repo(tmp_path)
    assert summary_problems(root / "docs" / "gpu-runs") == []
    assert reference_problems(root) == []


def test_a_raw_file_or_an_oversize_directory_is_refused(tmp_path):
    root = _fake_repo(tmp_path)
    runs = root / "docs" / "gpu-runs"
    (runs / "2030-01-01" / "run1").mkdir()
    (runs / "2030-01-01" / "run1" / "serve.log").write_bytes(b"x" * (LIMIT + 1))
    problems = summary_problems(runs)
    assert any("bytes >" in p for p in problems)
    assert any("run1/serve.log: not a <date>/<run>.json summary" in p for p in problems)


def test_an_oversize_summary_is_refused(tmp_path):
    root = _fake_repo(tmp_path)
    p = next((root / "docs" / "gpu-runs").rglob("*.json"))
    p.write_text(p.read_text() + " " * RUN_LIMIT)  # still valid JSON, one byte-count over
    problems = summary_problems(root / "docs" / "gpu-runs")
    assert problems == [f"{p.relative_to(root / 'docs' / 'gpu-runs').as_posix()}: "
                        f"{p.stat().st_size} bytes > {RUN_LIMIT} for one summary"]


def test_a_summary_without_sha256_is_refused(tmp_path):
    root = _fake_repo(tmp_path)
    p = root / "docs" / "gpu-runs" / "2030-01-01" / "run1.json"
    s = json.loads(p.read_text())
    del s["raw_files"][0]["sha256"]
    p.write_text(json.dumps(s))
    assert any(
        "without path/bytes/sha256" in x for x in summary_problems(root / "docs" / "gpu-runs")
    )


def test_a_link_to_a_missing_file_and_an_unrecorded_raw_path_are_refused(tmp_path):
    root = _fake_repo(tmp_path)
    (root / "docs" / "x.md").write_text(
        "[gone](gpu-runs/2030-01-01/run2.json)\n"
        "recorded: docs/gpu-runs/2030-01-01/run1/check.txt\n"
        "unrecorded: docs/gpu-runs/2030-01-01/run1/serve.log\n"
    )
    problems = reference_problems(root)
    assert problems == [
        "docs/x.md: link to docs/gpu-runs/2030-01-01/run2.json, which does not exist",
        "docs/x.md: names docs/gpu-runs/2030-01-01/run1/serve.log:"
        " neither in the tree nor recorded in a summary",
    ]


# ---- the script ---------------------------------------------------------------------------


def _raw_run(d: Path) -> Path:
    d.mkdir(parents=True)
    tokens = list(range(1000, 1064))
    (d / "results.json").write_text(
        json.dumps(
            {
                "serve": {
                    "serve:none": {
                        "ready_seconds": 61.61234567,
                        "log_tail": "\n".join(f"l{i}" for i in range(50)),
                        "greedy": {"outputs": [tokens]},
                    }
                },
                "plant": {
                    "plant:16": {
                        "summary": {
                            "all_identical": True,
                            "accept_length_by_schedule": {"chain": 16.0},
                        }
                    }
                },
            }
        )
    )
    (d / "serve-plant-16.log").write_text(
        "[2026-12-02 10:44:02] Capture target verify CUDA graph end. elapsed=25.52 s\n"
        '[2026-12-02 10:44:04] INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 503\n'
        "[2026-12-02 10:44:05] Decode batch, #running-req: 1, accept len: 3.15,"
        " gen throughput (token/s): 210.5\n"
        "[2026-12-02 10:44:06] Decode batch, #running-req: 1, accept len: 1.43,"
        " gen throughput (token/s): 99.0\n"
        "[2026-12-02 10:44:36] Health check failed. last_heartbeat time: 10:44:16\n"
        "[2026-12-02 10:44:37] Health check failed. last_heartbeat time: 10:44:16\n"
    )
    win = {
        "budget": 16,
        "bs": 1,
        "rounds": 64,
        "ms": {s: {"mean": 2.0, "p50": 1.0} for s in summarise_gpu_run.STAGES},
    }
    win2 = {**win, "ms": {s: {"mean": 1.0, "p50": 3.0} for s in summarise_gpu_run.STAGES}}
    (d / "profile-plant-16.jsonl").write_text(json.dumps(win) + "\n" + json.dumps(win2) + "\n")
    (d / "check.txt").write_text("PASS abi.torch: 2.11.0+cu130\nFAIL package.overlay: differs\n")
    return d


def test_script_records_every_raw_file_and_the_cited_figures(tmp_path):
    run = _raw_run(tmp_path / "2030-01-01" / "runA")
    assert summarise_gpu_run.main([str(run), "--raw-location", "on the lead's disk"]) == 0
    s = json.loads((tmp_path / "2030-01-01" / "runA.json").read_text())
    assert s["raw_location"] == {"note": "on the lead's disk"}
    assert {e["path"]: (e["bytes"], e["sha256"]) for e in s["raw_files"]} == {
        f"runA/{f.name}": (f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest())
        for f in run.iterdir()
    }
    f = s["files"]
    res = f["runA/results.json"]
    assert res["serve"]["serve:none"]["ready_seconds"] == 61.6123
    assert res["plant"]["plant:16"]["summary"]["all_identical"] is True
    outputs = res["serve"]["serve:none"]["greedy"]["outputs"][0]
    assert (
        outputs["n"] == 64
        and outputs["sha256"]
        == hashlib.sha256(json.dumps(list(range(1000, 1064))).encode()).hexdigest()
    )
    assert res["serve"]["serve:none"]["log_tail"]["tail"][-1] == "l49"
    log = f["runA/serve-plant-16.log"]
    assert log["decode_batch"] == {
        "lines": 2,
        "accept_len_values": [1.43, 3.15],
        "gen_throughput_max": 210.5,
    }
    assert not any("GET /health" in str(k) for k in log["kept"])
    assert log["kept"][0].endswith("elapsed=25.52 s")
    assert log["kept"][1]["count"] == 2
    prof = f["runA/profile-plant-16.jsonl"]["by_bs"][0]
    assert prof["rounds"] == 128 and prof["windows"] == 2
    assert prof["p50_median_ms"]["verify"] == 2.0 and prof["first_window_mean_ms"]["verify"] == 2.0
    assert f["runA/check.txt"] == ["PASS abi.torch: 2.11.0+cu130", "FAIL package.overlay: differs"]


def test_script_with_raw_commit_checks_each_file_and_remove_deletes_them(tmp_path, capsys):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = tmp_path / "repo"
    run = _raw_run(repo / "docs" / "gpu-runs" / "2030-01-01" / "runA")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "raw"], cwd=repo, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    (run / "check.txt").write_text("edited after the commit\n")
    assert summarise_gpu_run.main([str(run), "--raw-commit", "HEAD"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "summarise_gpu_run: docs/gpu-runs/2030-01-01/runA/check.txt:"
        f" differs from its copy in commit {head[:12]}"
    ]
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=repo, check=True)
    assert summarise_gpu_run.main([str(run), "--raw-commit", "HEAD", "--remove"]) == 0
    assert not run.exists()
    s = json.loads((run.parent / "runA.json").read_text())
    assert s["raw_location"]["git_commit"] == head
    assert s["raw_location"]["read_with"].startswith(
        f"git show {head[:12]}:docs/gpu-runs/2030-01-01/runA/"
    )
    assert summary_problems(repo / "docs" / "gpu-runs") == []


def test_script_refuses_a_missing_directory_in_one_line(tmp_path, capsys):
    assert summarise_gpu_run.main([str(tmp_path / "nope")]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"summarise_gpu_run: {tmp_path / 'nope'}: no such file or directory"
    )


def test_compressed_files_are_read_through_and_repeats_named_once(tmp_path):
    """A ``.log.gz`` is reduced as the log it holds, a ``.tgz`` member by member, and content
    already reduced (a server log on its own and again inside the run's archive) becomes
    ``{"same_as": ...}`` instead of a second copy."""
    import gzip
    import io
    import tarfile

    run = tmp_path / "2030-01-02" / "runZ"
    run.mkdir(parents=True)
    log = (b"[2026-12-04 17:46:12] DDTree verify at width 17: sync-free FlashInfer plan on 20"
           b" graph wrapper(s).\n")
    (run / "serve-a.log.gz").write_bytes(gzip.compress(log))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("inner/serve-a.log", log), ("inner/r.json", b'{"tok_s": 12.5}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (run / "all.tgz").write_bytes(buf.getvalue())
    assert summarise_gpu_run.main([str(run), "--raw-location", "here"]) == 0
    f = json.loads((run.parent / "runZ.json").read_text())["files"]
    members = f["runZ/all.tgz"]["members"]
    assert members["inner/r.json"] == {"tok_s": 12.5}
    assert "sync-free FlashInfer plan" in json.dumps(members["inner/serve-a.log"])
    assert f["runZ/serve-a.log.gz"] == {"same_as": "runZ/all.tgz:inner/serve-a.log"}


def test_a_file_a_later_run_repeats_is_reduced_once(tmp_path):
    """The runs of one invocation share the repeat table: a resumed grid's export carries the
    earlier call's files byte for byte (§40: 44 of 47), and the later summary names the
    earlier path while its raw_files keep every file's own sha256."""
    day = tmp_path / "2030-01-03"
    shared = b'{"summaries": [{"concurrency": 1, "output_tokens_per_s": 227.4}]}'
    for run, own in (("call7", b'{"cells": 36}'), ("call8", b'{"cells": 72}')):
        (day / run / "x").mkdir(parents=True)
        (day / run / "x" / "bench-none-c1.json").write_bytes(shared)
        (day / run / "x" / "results.json").write_bytes(own)
    assert summarise_gpu_run.main([str(day / "call7"), str(day / "call8"),
                                   "--raw-location", "here"]) == 0
    first, later = (json.loads((day / f"{r}.json").read_text()) for r in ("call7", "call8"))
    assert first["files"]["call7/x/bench-none-c1.json"]["summaries"][0]["concurrency"] == 1
    assert later["files"]["call8/x/bench-none-c1.json"] == {
        "same_as": "call7/x/bench-none-c1.json"}
    assert later["files"]["call8/x/results.json"] == {"cells": 72}
    assert {e["path"]: e["sha256"] for e in later["raw_files"]}[
        "call8/x/bench-none-c1.json"] == hashlib.sha256(shared).hexdigest()
    # one run at a time: nothing to point at, each summary whole
    assert summarise_gpu_run.main([str(day / "call8"), "--raw-location", "here"]) == 0
    alone = json.loads((day / "call8.json").read_text())
    assert "same_as" not in json.dumps(alone["files"])


def test_bench_repeats_and_trace_top_lists_are_reduced():
    """What every bench JSON of a run repeats is dropped; a trace summary keeps its first
    TOP_N entries of each top list and TOP_RANGES ranges; other JSON is left as it is."""
    reduce = summarise_gpu_run.reduce_json
    bench = {"schema": summarise_gpu_run.BENCH_SCHEMA, "argv": ["bench", "--url", "u"],
             "machine": {"hostname": "vm"}, "configs": [{"label": "u"}], "comparison": [],
             "best": [], "summaries": [{"concurrency": 1, "output_tokens_per_s": 278.0}]}
    assert reduce(bench) == {"schema": summarise_gpu_run.BENCH_SCHEMA,
                             "argv": ["bench", "--url", "u"],
                             "summaries": [{"concurrency": 1, "output_tokens_per_s": 278.0}]}
    other = {"schema": "something-else/1", "machine": {"hostname": "vm"}}
    assert reduce(other) == other
    rows = [{"name": f"k{i}", "ms_per_step": float(i)} for i in range(20)]
    trace = {"top_kernels": rows, "top_cpu_ops": rows, "top_runtime_calls": rows,
             "ranges": rows, "other": rows}
    out = reduce(trace)
    for key in summarise_gpu_run.TOP_LISTS:
        assert out[key] == rows[: summarise_gpu_run.TOP_N]
    assert out["ranges"] == rows[: summarise_gpu_run.TOP_RANGES]
    assert out["other"] == rows


def test_refold_shrinks_a_summary_and_keeps_what_the_rules_need(tmp_path, capsys):
    """--refold (room under the directory's cap): a summary the script wrote, folded in place,
    keeps its raw_files, raw_location and per-file keys, still passes the layout rules, and
    keeps the short figures whole; a file that is not a summary is refused in one line."""
    run = _raw_run(tmp_path / "2030-01-01" / "runA")
    assert summarise_gpu_run.main([str(run), "--raw-location", "elsewhere", "--remove"]) == 0
    path = tmp_path / "2030-01-01" / "runA.json"
    before = json.loads(path.read_text())
    assert summarise_gpu_run.main(["--refold", str(path)]) == 0
    after = json.loads(path.read_text())
    assert after["raw_files"] == before["raw_files"]
    assert after["raw_location"] == before["raw_location"]
    assert set(after["files"]) == set(before["files"])
    assert after["refolded"]["items"] == summarise_gpu_run.REFOLD_ITEMS
    assert summary_problems(tmp_path) == []
    res = after["files"]["runA/results.json"]
    assert res["serve"]["serve:none"]["ready_seconds"] == 61.6123  # figures stay
    tail = res["serve"]["serve:none"]["log_tail"]["tail"]
    assert tail[-1] == "l49" and {"folded": len(before["files"]["runA/results.json"]["serve"][
        "serve:none"]["log_tail"]["tail"]) - 2 * summarise_gpu_run.REFOLD_ITEMS} in tail
    assert summarise_gpu_run.refold("x" * 1000).count("chars folded") == 1
    # every summary here went through --refold (docs/gpu-staging.md's flow keeps the tree
    # small), and folding the largest once more keeps its size: nothing is left to fold
    summaries = list(RUNS.glob("*/*.json"))
    assert summaries and [p.name for p in summaries if '"refolded"' not in p.read_text()] == []
    real = max(summaries, key=lambda p: p.stat().st_size)
    copy = tmp_path / "2030-01-02" / real.name
    copy.parent.mkdir()
    shutil.copy(real, copy)
    assert summarise_gpu_run.main(["--refold", str(copy)]) == 0
    assert abs(copy.stat().st_size - real.stat().st_size) < 0.01 * real.stat().st_size
    assert summary_problems(tmp_path) == []
    assert summarise_gpu_run.refold([1, 2, 3, 4, 5, 6, 7]) == [1, 2, 3, 4, 5, 6, 7]
    not_summary = tmp_path / "other.json"
    not_summary.write_text('{"schema": "something else"}')
    capsys.readouterr()
    assert summarise_gpu_run.main(["--refold", str(not_summary)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a sglang-dflash-gpu-run-summary/1 summary" in err[0]
    # a path that is not there: one line, not a traceback (it crashed in stat() before the
    # reading's own error handling, 2026-12-07)
    assert summarise_gpu_run.main(["--refold", str(tmp_path / "missing.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.json: not a readable JSON summary" in err[0]
