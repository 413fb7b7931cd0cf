"""Fixtures for unit-file tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def visible_tmp():
    """A scratch dir a unit may reference: pytest's tmp_path lives in /tmp, which the unit's
    PrivateTmp=true hides, so `sglang-dflash unit` refuses paths there. /dev/shm is not hidden."""
    base = Path("/dev/shm")
    if not base.is_dir():
        pytest.skip("no /dev/shm")
    path = Path(tempfile.mkdtemp(prefix="sglang-dflash-unit-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)
