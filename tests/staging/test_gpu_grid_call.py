"""scripts/gpu_grid_call.sh: one device call of the adaptive grid, run here against the SGLang
stand-in (tests/standin) — the wrapper §39-§41's grid calls were written out by hand for
(docs/gpu-results.md). What it must guarantee: one tarball per call holding the grid's export
and the call's log, at most 8 files in $OUT, the same NAME resuming the same grid, "complete"
(exit 0) only when no server was left for later, and a bad argument refused in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.staging.helpers import REPO, run_call_script, tar_members

SCRIPT = REPO / "scripts" / "gpu_grid_call.sh"
TINY = ["--levels", "1", "--requests-per-level", "4", "--prompts-per-regime", "2",
        "--regimes", "absent", "--modes", "none,ddtree-adaptive"]


def _call(tmp_path: Path, *args: str, pythonpath: tuple[Path, ...] = ()
          ) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "OUT"
    for p in out.glob("*"):  # every device call starts with an empty $OUT
        p.unlink()
    return run_call_script(SCRIPT, tmp_path, args, pythonpath)


def test_one_tarball_per_call_and_the_same_name_resumes(tmp_path):
    args = ["G", "300", *TINY, "--port", str(free_port())]
    r, out = _call(tmp_path, *args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "gpu_grid_call: G complete" in r.stdout
    assert "[adaptive_grid] ddtree-adaptive-absent c=1:" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["G.tgz"]
    names = tar_members(out / "G.tgz")
    assert {"G/adaptive-grid.json", "G/results.json", "G/G.log",
            "G/adaptive-grid-files.tgz"} <= names  # the files tarball: server logs, benches
    first = json.loads((tmp_path / "root" / "G" / "results.json").read_text())
    # the next call with the same NAME resumes: nothing left, no server started, same cells
    r2, out = _call(tmp_path, *args)
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-2000:]
    assert "gpu_grid_call: G complete" in r2.stdout
    summary = json.loads((tmp_path / "root" / "G.log").read_text().strip().splitlines()[-1])
    assert summary["servers_started"] == 0 and summary["skipped"] == {}
    again = json.loads((tmp_path / "root" / "G" / "results.json").read_text())
    assert again["cells"] == first["cells"]
    assert sorted(p.name for p in out.iterdir()) == ["G.tgz"]


def test_a_server_left_for_the_next_call_is_incomplete_exit_3(tmp_path):
    """adaptive_grid exits 0 with a server skipped for time; the wrapper says run it again."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "adaptive_grid.py").write_text(
        "import json, sys\n"
        "print('[adaptive_grid] none c=1: 1.0 tok/s, accept - (1s)')\n"
        "print(json.dumps({'cells': 1, 'servers_started': 1,"
        " 'skipped': {'ddtree-adaptive': 'time budget: needs ~90s, 40s left'}}))\n")
    r, out = _call(tmp_path, "G", "200", *TINY, pythonpath=(fake,))
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    assert "gpu_grid_call: G incomplete: the same command resumes" in r.stdout
    assert "G/G.log" in tar_members(out / "G.tgz")


def test_a_failed_grid_keeps_its_status_and_still_returns_its_log(tmp_path):
    r, out = _call(tmp_path, "G", "200", "--levels", "0")  # adaptive_grid: usage, exit 2
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "gpu_grid_call: G failed (adaptive_grid rc=2)" in r.stderr
    assert "G/G.log" in tar_members(out / "G.tgz")


@pytest.mark.parametrize("args, words", [
    (["G"], "usage: gpu_grid_call.sh NAME LIMIT_S"),
    (["G/1", "300"], "NAME G/1: letters, digits"),
    (["G", "60"], "LIMIT_S 60: whole seconds, at least 120"),
    (["G", "300", "--out", "/x"], "--out is set by gpu_grid_call.sh"),
    (["G", "300", "--time-budget-s=5"], "--time-budget-s=5 is set by gpu_grid_call.sh"),
])
def test_bad_arguments_one_line_exit_2(tmp_path, args, words):
    r, out = _call(tmp_path, *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_grid_call: ") and words in lines[0]
    assert list(out.iterdir()) == []
