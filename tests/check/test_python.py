"""abi.python: the running interpreter against the GPU stack's pinned Python, and the facts
about that Python in uv.lock, pyproject and the README agreeing with the pins."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from sglang_dflash.check.abi import check_python
from sglang_dflash.pins import load_pins
from tests.check.fakes import on_pinned_python, pinned_stack, run_check

REPO = Path(__file__).resolve().parents[2]
PINS = load_pins()
WANT = tuple(int(x) for x in PINS.python_package.split("."))


def test_the_pinned_python_passes():
    r = check_python((*WANT, 3), PINS, stack_installed=True)
    assert (r.status, r.name, r.layer) == ("PASS", "python", "abi")
    assert r.found == f"Python {PINS.python_package}.3 is the GPU stack's pinned Python 3.12"


def test_another_python_without_the_stack_says_the_extra_installed_nothing():
    r = check_python((3, 11, 7), PINS, stack_installed=False)
    assert r.status == "FAIL"
    assert r.found == ("Python 3.11.7 runs this, but the gpu extra installs only on Python 3.12 "
                       "(its marker: python_version == '3.12'): on 3.11 `uv sync --extra gpu` "
                       "installs no torch and no sglang")
    assert "`uv sync --extra gpu --frozen --python 3.12`" in r.fix


def test_another_python_with_a_stack_installed_otherwise_fails_too():
    r = check_python((3, 13, 1), PINS, stack_installed=True)
    assert r.status == "FAIL"
    assert r.found.startswith("Python 3.13.1 runs this, but the GPU stack is locked and tested "
                              "for Python 3.12 only")


def test_the_line_on_this_interpreter(tmp_path):
    site = tmp_path / "site"
    pinned_stack(site)
    _rc, res, _err, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    line = res["abi.python"]
    here = ".".join(map(str, sys.version_info[:3]))
    assert line["status"] == ("PASS" if on_pinned_python() else "FAIL")
    assert line["found"].startswith(f"Python {here} ")


def _lock() -> dict:
    return tomllib.loads((REPO / "uv.lock").read_text())


def _package(lock: dict, name: str) -> dict:
    (pkg,) = [p for p in lock["package"] if p["name"] == name]
    return pkg


def test_uv_lock_admits_the_gpu_extra_on_the_pinned_python_only():
    own = _package(_lock(), "sglang-dflash")
    gpu = own["optional-dependencies"]["gpu"]
    assert {d["name"] for d in gpu} == set(PINS.distributions)
    assert {d["marker"] for d in gpu} == {f"python_full_version == '{PINS.python_package}.*'"}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert all(r.endswith(f"; python_version == '{PINS.python_package}'")
               for r in pyproject["project"]["optional-dependencies"]["gpu"])


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
    assert f"python_version == '{PINS.python_package}'" in row
    assert "abi.python" in row
