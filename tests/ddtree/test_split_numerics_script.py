"""scripts/gpu_split_numerics.py (the split verify against the masked one, kernel by kernel):
on the CPU the prefix part is the torch reference and the tree block runs under the Triton
interpreter, so the whole script runs here; the verdict rules are pure; bad flags exit 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.script_module import load_script

pytest.importorskip("torch", reason="the split verify's numerics need torch")
if importlib.util.find_spec("triton") is None:  # not imported here: the kernel tests of this
    # directory must import it first, under the interpreter (tests/ddtree/triton_env.py)
    pytest.skip("the tree block is a Triton kernel", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_split_numerics.py"


def _module():
    return load_script(SCRIPT, "gpu_split_numerics")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_the_script_runs_the_split_against_the_fp32_reference(tmp_path):
    out = tmp_path / "numerics.json"
    proc = _run("--prefix", "torch", "--cases", "3", "--max-prefix", "24", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc == json.loads(proc.stdout)
    assert doc["verdict"] == "correct"
    assert [(c["bs"], c["width"]) for c in doc["cases"]] == [(1, 17), (1, 17), (8, 4)]
    assert all(c["split_err"] < 1e-4 and c["masked_err"] is None for c in doc["cases"])


def test_verdicts():
    m = _module()

    def case(split, masked, share):
        return m.CaseResult(bs=1, width=4, max_prefix=5, split_err=split, masked_err=masked,
                            split_vs_masked_max=None, bit_identical_share=share)

    assert m.verdict([case(1e-5, None, None)]) == "correct"
    assert m.verdict([case(2e-3, None, None)]) == "bug"
    assert m.verdict([case(0.01, 0.01, 1.0), case(0.008, 0.01, 1.0)]) == "identical"
    assert m.verdict([case(0.01, 0.01, 0.97)]) == "rounding"
    assert m.verdict([case(0.5, 0.01, 0.2), case(0.01, 0.01, 1.0)]) == "bug"


@pytest.mark.parametrize("args, why", [
    (("--cases", "0"), "--cases must be 1..6"),
    (("--max-prefix", "-1"), "--max-prefix must be >= 0"),
    (("--prefix", "flash"), "invalid choice"),
])
def test_bad_flags_exit_2_with_one_line(args, why):
    proc = _run("--prefix", "torch", *args) if args[0] != "--prefix" else _run(*args)
    assert proc.returncode == 2
    assert why in proc.stderr
    assert "Traceback" not in proc.stderr
