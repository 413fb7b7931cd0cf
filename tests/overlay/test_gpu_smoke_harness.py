"""The GPU smoke harness's own flow, run against the SGLang stand-in (tests/standin).

The stand-in reports the DDTree verify width N+1 but ignores plants, so the run must FAIL on the
verify count;
what this proves is the harness: configs, two real server processes, requests, plant file,
oracle, comparison and report, exit codes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "overlay" / "gpu_smoke.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "tests" / "standin"), str(REPO / "src"), env.get("PYTHONPATH", "")]
    )
    env["STANDIN_TOKEN_DELAY"] = "0"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--workdir", str(tmp_path), "--timeout", "60"],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip


def test_harness_against_standin(tmp_path):
    proc = _run(["--budget", "8", "--port", str(_port()), "--max-new", "20"], tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["planted_identical"] and report["other_identical"]
    assert report["expected_verify_width"] == 9 == report["verify_width"]
    assert report["expected_verify_ct"] == len(report["rounds"]) > 0
    assert report["failures"] and all("spec_verify_ct" in f for f in report["failures"])
    doc = json.loads((tmp_path / "plant.json").read_text())
    assert doc["test_only"] is True
    assert len(doc["requests"][0]["continuation"]) == 20 + 16 + 1
    assert doc["requests"][0]["ranks"][:5] == [0, 0, 1, -1, 0]
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert cfg["dflash_config"]["mask_token_id"] == 1023 and cfg["block_size"] == 16
    assert (tmp_path / "baseline.log").exists() and (tmp_path / "ddtree.log").exists()


def test_harness_usage_error(tmp_path):
    proc = _run(["--ranks", "a,b"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--ranks" in proc.stderr
