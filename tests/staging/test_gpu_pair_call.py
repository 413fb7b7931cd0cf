"""scripts/gpu_pair_call.sh: one device call of serving the trained pair, run here against the
SGLang stand-in (tests/standin) with a pair of configs only — the same script §31's calls were
written out by hand for (docs/gpu-results.md). What it must guarantee: one tarball per call
holding the run's folder (results, server logs, its own log, the tie margin's log), at most 8
files in $OUT, --skip-done passed on, and a bad argument refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.real_drafter.test_serve_pair import pair  # noqa: F401  (configs-only pair)
from tests.staging.helpers import REPO, run_call_script, tar_members

SCRIPT = REPO / "scripts" / "gpu_pair_call.sh"


def _call(pair_dir: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    return run_call_script(SCRIPT, tmp_path, args, PAIR=str(pair_dir),
                           SERVE_PAIR_ARGS=f"--port {free_port()} --requests-per-level 1 "
                                           "--greedy-prompts 2 --seeded-prompts 2")


def test_one_tarball_with_the_run_its_log_and_the_tie_margin(pair, tmp_path):  # noqa: F811
    r, out = _call(pair, tmp_path, "sA", "300", "none", "dflash")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["sA.tgz"]
    names = tar_members(out / "sA.tgz")
    assert {"sA/results.json", "sA/sA.log", "sA/tie.log"} <= names
    assert any(n.startswith("sA/serve-none") and n.endswith(".log") for n in names)
    res = json.loads((tmp_path / "root" / "sA" / "results.json").read_text())
    assert list(res["serve"]) == ["none", "dflash"]
    assert "serve_pair rc=0" in r.stdout and "tie_margin rc=" in r.stdout
    # the next call leaves out what this one finished and feeds both to the tie margin
    r2, out = _call(pair, tmp_path, "sB", "300", "--skip-done",
                    str(tmp_path / "root" / "sA" / "results.json"), "none", "dflash",
                    "ddtree:16")
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-2000:]
    res2 = json.loads((tmp_path / "root" / "sB" / "results.json").read_text())
    assert list(res2["serve"]) == ["ddtree:16"]
    assert sorted(p.name for p in out.iterdir()) == ["sA.tgz", "sB.tgz"]


@pytest.mark.parametrize("args, words", [
    (["sA"], "usage: gpu_pair_call.sh NAME LIMIT_S"),
    (["s/A", "300", "none"], "NAME s/A: letters, digits"),
    (["sA", "60", "none"], "LIMIT_S 60: whole seconds, at least 120"),
    (["sA", "300", "--skip-done"], "--skip-done needs a results.json"),
    (["sA", "300", "--skip-done", "r.json"], "no MODE given"),
])
def test_bad_arguments_one_line_exit_2(pair, tmp_path, args, words):  # noqa: F811
    r, out = _call(pair, tmp_path, *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert not list(out.iterdir())
