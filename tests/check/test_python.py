"""abi.python: the running interpreter against the GPU stack's pinned Python, and the facts
about that Python in uv.lock, pyproject and the README agreeing with the pins."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from sglang_dflash.check.abi import check_python
from sglang_dflash.pins import load_pins
from tests.check.fakes import on_pinned_python, pinned_stack, run_check

REPO = Path(__file__).resolve().parents[2]
PINS = load_pins()
WANT = tuple(int(x) for x in PINS.python_package.split("."))


def test_the_pinned_python_passes():
    r = check_python((*WANT, 3), PINS, stack_installed=True)
    assert (r.status, r.name, r.layer) == ("PASS", "python", "abi")
    assert r.found == (f"Python {PINS.python_package}.3 is the GPU stack's pinned Python 3.12 "
                       "(the Nix package's and the GPU hosts')")


@pytest.mark.parametrize("version", [(3, 11, 7)])
def test_every_python_the_lock_resolves_passes_and_names_the_tested_one(version):
    r = check_python(version, PINS, stack_installed=True)
    assert r.status == "PASS"
    assert r.found == (f"Python {'.'.join(map(str, version))}: uv.lock resolves the gpu extra "
                       "for Python 3.11-3.12 and it installs here; the Nix package and the GPU "
                       "hosts run 3.12")


@pytest.mark.parametrize(("version", "stack", "tail"), [
    ((3, 13, 0), False, "pip and uv refuse to install the package here"),
    ((3, 10, 13), True, "this stack was not installed from uv.lock"),
])
def test_a_python_outside_requires_python_fails(version, stack, tail):
    r = check_python(version, PINS, stack_installed=stack)
    assert r.status == "FAIL"
    assert r.found == (f"Python {'.'.join(map(str, version))} runs this, but the package and "
                       "its gpu extra are for Python 3.11-3.12 only (requires-python >=3.11, "
                       f"<3.13): {tail}")
    assert "`uv sync --extra gpu --frozen --python 3.12`" in r.fix


def test_the_line_on_this_interpreter(tmp_path):
    site = tmp_path / "site"
    pinned_stack(site)
    _rc, res, _err, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    line = res["abi.python"]
    here = ".".join(map(str, sys.version_info[:3]))
    assert line["status"] == ("PASS" if on_pinned_python() else "FAIL")
    assert line["found"].startswith((f"Python {here} ", f"Python {here}:"))


def _lock() -> dict:
    return tomllib.loads((REPO / "uv.lock").read_text())


def _package(lock: dict, name: str) -> dict:
    (pkg,) = [p for p in lock["package"] if p["name"] == name]
    return pkg


def test_uv_lock_resolves_the_gpu_extra_for_every_python_requires_python_admits():
    """requires-python comes from the pins, uv.lock records it, and the gpu extra carries no
    marker: it installs wherever the package installs (3.11 was installed with
    `uv sync --extra gpu --frozen` and passed `check --offline`: docs/nix.md)."""
    from sglang_dflash.pins import python_versions, requires_python

    lock = _lock()
    assert lock["requires-python"] == requires_python(PINS) == ">=3.11, <3.13"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"].replace(" ", "") == ">=3.11,<3.13"
    own = _package(lock, "sglang-dflash")
    gpu = own["optional-dependencies"]["gpu"]
    assert {d["name"] for d in gpu} == set(PINS.distributions)
    assert all("marker" not in d for d in gpu)
    assert all(";" not in r for r in pyproject["project"]["optional-dependencies"]["gpu"])
    # sglang has a wheel for each of those Pythons in the lock
    assert _cp_tags(_package(lock, "sglang")) == [
        "cp" + v.replace(".", "") for v in python_versions(PINS)]


def _cp_tags(pkg: dict) -> list[str]:
    tags = {re.search(r"-(cp3\d+)-", w["url"]).group(1) for w in pkg.get("wheels", [])
            if re.search(r"-(cp3\d+)-", w["url"])}
    return sorted(tags, key=lambda t: int(t[3:]))


def test_readme_names_exactly_the_sglang_wheels_uv_lock_holds():
    sglang = _package(_lock(), "sglang")
    assert sglang["version"] == PINS.version("sglang")
    tags = _cp_tags(sglang)
    assert f"cp{WANT[0]}{WANT[1]}" in tags
    readme = (REPO / "README.md").read_text()
    (row,) = [ln for ln in readme.splitlines() if ln.startswith("| Python |")]
    m = re.search(r"sglang (\S+) wheels for ([^,]+(?:, [^,]+)*?) and (cp\d+)", row)
    assert m, row
    assert m.group(1) == PINS.version("sglang")
    listed = [t.strip() for t in m.group(2).split(",")] + [m.group(3)]
    assert listed == tags, (listed, tags)
    assert "requires-python `>=3.11,<3.13`" in row
    assert "abi.python" in row
