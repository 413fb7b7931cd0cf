"""Shared by the staging tests: scripts/gpu_stage.py loaded as a module (a script, not a
package), and a device call's script (scripts/gpu_*_call.sh) run here as the GPU host runs it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
STAGE_PY = REPO / "scripts" / "gpu_stage.py"
UNSTAGE_SH = REPO / "scripts" / "gpu_unstage.sh"
STANDIN = REPO / "tests" / "standin"


def load_stage() -> ModuleType:
    name = "gpu_stage_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, STAGE_PY)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def run_call_script(script: Path, tmp_path: Path, args: tuple[str, ...] | list[str],
                    pythonpath: tuple[Path, ...] = (), **env_extra: str,
                    ) -> tuple[subprocess.CompletedProcess, Path]:
    """``bash script args`` from the repository root with what a device call gives it: $OUT
    (tmp_path/OUT, kept between calls of one test) and $ROOT under tmp_path, the GPU host's
    ``python3`` = this interpreter (a shim on PATH), SITE and PYTHONPATH on the SGLang stand-in
    and the project (``pythonpath`` first), no SGLANG_DFLASH_* from the caller's environment.
    The script's result and $OUT."""
    out = tmp_path / "OUT"
    out.mkdir(exist_ok=True)
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "python3").unlink(missing_ok=True)
    (shim / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_")}
    env.update(OUT=str(out), ROOT=str(tmp_path / "root"),
               SITE=f"{STANDIN}{os.pathsep}{REPO / 'src'}", STANDIN_TOKEN_DELAY="0.0002",
               PATH=f"{shim}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(STANDIN),
                                           str(REPO / "src"), str(REPO / "benchmarks")]),
               **env_extra)
    env.pop("NOTIFY_SOCKET", None)
    r = subprocess.run(["bash", str(script), *args], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=600)
    return r, out


def tar_members(tgz: Path) -> set[str]:
    with tarfile.open(tgz) as tar:
        return set(tar.getnames())
