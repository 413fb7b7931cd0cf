"""Importing a DDTree Triton module for its tests: compiled on CUDA, interpreted on the CPU.

triton.jit picks the mode at import time (of triton.language too), so TRITON_INTERPRET is set
only around the import; ``interpret_on_cpu`` sets it again while a kernel runs (the
interpreter reads it then too). Shared by the tree builder's and the verify kernels' tests.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
# whether triton was first loaded here, with the interpreter on (then later kernel modules
# imported through import_triton_module are interpreted too)
_LOADED_INTERPRETED = {"yes": False}


def skip_if_triton_imported_compiled() -> None:
    """Without CUDA the kernels need the interpreter, which must be on before triton loads:
    SKIP when something else loaded triton first without it."""
    if (not CUDA and sys.modules.get("triton") is not None
            and not os.environ.get("TRITON_INTERPRET") and not _LOADED_INTERPRETED["yes"]):
        pytest.skip("triton was imported before interpreter mode could be set (no CUDA here)",
                    allow_module_level=True)


def import_triton_module(name: str):
    """Import ``name`` compiled (CUDA) or interpreted (CPU); SKIP the calling test module
    without triton, or when triton was loaded compiled before (no CUDA here)."""
    skip_if_triton_imported_compiled()
    old = os.environ.get("TRITON_INTERPRET")
    first = sys.modules.get("triton") is None
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        pytest.importorskip("triton", reason="triton is not installed (pip install triton==3.6.0)")
        if first and not CUDA:
            _LOADED_INTERPRETED["yes"] = True
        return importlib.import_module(name)
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def interpret_on_cpu(monkeypatch) -> None:
    """Without CUDA the interpreter also reads TRITON_INTERPRET while a kernel runs (call it
    from an autouse fixture)."""
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def lower_for_sm90(code: str) -> list[str]:
    """Run ``code`` (it lowers kernels with triton's own compile API and prints ``ok`` last)
    in a fresh interpreter without TRITON_INTERPRET, with this checkout's ``src`` first on the
    path: a lowering error the interpreter cannot see fails the calling test, not the first
    served round. Returns the lines it printed before ``ok``."""
    import subprocess
    import textwrap
    from pathlib import Path

    pytest.importorskip("triton")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=300, env=env)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines and lines[-1] == "ok", r.stderr[-3000:]
    return lines[:-1]
