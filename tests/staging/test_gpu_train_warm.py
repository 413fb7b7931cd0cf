"""scripts/gpu_train_warm.sh: the pair's training in its own session beside the kernel
warm-ups (gpu-results.md §34), run here with a stand-in training (real_drafter.train needs a
GPU-sized run) and the SGLang stand-in behind the warm-ups. What it must guarantee: the training
outlives the script's own session, the script returns once the training has ended (not before),
the report reaches $OUT, a missing report is exit 1, and a bad argument one line with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
SCRIPT = REPO / "scripts" / "gpu_train_warm.sh"

FAKE_TRAIN = """
import argparse, json, os, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--out"); ap.add_argument("--json"); ap.add_argument("--seed")
ap.add_argument("--device"); ap.add_argument("--budget-s")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
open(os.path.join(a.out, "sid"), "w").write(str(os.getsid(0)))
time.sleep(float(os.environ.get("FAKE_TRAIN_S", "1")))
if os.environ.get("FAKE_TRAIN_FAIL") != "1":
    json.dump({"sha256": {"draft/model.safetensors": "5f9495c4faf1" + "0" * 52},
               "reproducible": True, "wall_s": {"total": 1.5}, "budget_s": a.budget_s},
              open(a.json, "w"))
print("[real_drafter] done", flush=True)
"""


def _call(tmp_path: Path, *args: str, **env_extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "OUT"
    out.mkdir(exist_ok=True)
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    # the GPU host's python3: this interpreter, with the training replaced by the stand-in
    (shim / "python3").write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1 $2" = "-m real_drafter.train" ]; then shift 2; '
        f'exec {sys.executable} {tmp_path / "fake_train.py"} "$@"; fi\n'
        f'exec {sys.executable} "$@"\n')
    (shim / "python3").chmod(0o755)
    env = dict(os.environ, OUT=str(out), PAIR=str(tmp_path / "pair2"),
               ROOT=str(tmp_path / "root"), SITE=f"{STANDIN}{os.pathsep}{REPO / 'src'}",
               STANDIN_TOKEN_DELAY="0.0002", SERVE_PAIR_ARGS=f"--port {free_port()}",
               PATH=f"{shim}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(REPO / "src"),
                                           str(REPO / "benchmarks")]), **env_extra)
    env.pop("NOTIFY_SOCKET", None)
    r = subprocess.run(["bash", str(SCRIPT), *args], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    return r, out


def test_trains_in_its_own_session_beside_the_warm_ups(tmp_path):
    r, out = _call(tmp_path, "300", FAKE_TRAIN_S="25")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    pair = tmp_path / "pair2"
    assert int((pair / "sid").read_text()) != os.getsid(0)  # setsid: outlives the call
    assert (pair / "DONE").exists() and "train rc=0" in (pair / "train.log").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "train.log"]
    assert json.loads((out / "report.json").read_text())["budget_s"] == "850"
    assert "gpu_train_warm: sha256 {'draft/model.safetensors': '5f9495c4faf1'}" in r.stdout
    # the 4B warm-up ran its one padded profile against the stand-in while it trained
    warm = json.loads((tmp_path / "root" / "warm" / "w4b" / "results.json").read_text())
    assert list(warm["profile"]) == ["profile:ddtree:15+pad@flashinfer"]
    assert "4B warm-up ended" in r.stdout


def test_a_training_without_a_report_is_exit_1(tmp_path):
    r, out = _call(tmp_path, "300", FAKE_TRAIN_S="0", FAKE_TRAIN_FAIL="1")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "pair2" / "DONE").exists()
    assert not (out / "report.json").exists()


@pytest.mark.parametrize("args, words", [
    ([], "usage: gpu_train_warm.sh LIMIT_S"),
    (["120"], "LIMIT_S 120: whole seconds, at least 300"),
    (["3x0"], "LIMIT_S 3x0: whole seconds, at least 300"),
])
def test_bad_arguments_one_line_exit_2(tmp_path, args, words):
    r, _ = _call(tmp_path, *args)
    assert r.returncode == 2 and r.stderr.strip() == f"gpu_train_warm: {words}", r.stderr
