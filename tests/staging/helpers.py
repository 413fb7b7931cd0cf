"""Load scripts/gpu_stage.py (a script, not a package) as a module for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
STAGE_PY = REPO / "scripts" / "gpu_stage.py"
UNSTAGE_SH = REPO / "scripts" / "gpu_unstage.sh"


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
