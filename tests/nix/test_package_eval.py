"""The flake's package wiring at lib level (tests/nix/eval-package.nix): overlays/default.nix
on a stub nixpkgs with the real uv2nix workspace. What the wrapper sets, what the venv
contains, what the apps/checks run, and that the dev shell prints the pins.

Needs SGLANG_DFLASH_NIXPKGS_LIB, SGLANG_DFLASH_UV2NIX, SGLANG_DFLASH_PYPROJECT_NIX."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from sglang_dflash.pins import load_pins
from tests.nix.nixtools import REPO, EvalError, nix_eval, nix_literal, require_dep

PINS = load_pins()


def evaluate(workspace_root: Path) -> dict:
    lib, uv2nix, pyproject = (require_dep(n) for n in ("nixpkgs-lib", "uv2nix", "pyproject-nix"))
    if not (workspace_root / "uv.lock").exists():
        pytest.skip("uv.lock is not generated yet")
    return nix_eval(
        f"import {nix_literal(REPO / 'tests/nix/eval-package.nix')} {{"
        f" nixpkgsLib = {nix_literal(lib)}; uv2nixSrc = {nix_literal(uv2nix)};"
        f" pyprojectNixSrc = {nix_literal(pyproject)};"
        f" workspaceRoot = {nix_literal(workspace_root)};"
        f" pythonVersion = \"{PINS.python_package}.0\"; }}", timeout=300)


@pytest.fixture(scope="module")
def flake() -> dict:
    return evaluate(REPO)


def test_package_is_the_project_with_its_gpu_extra(flake):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pkg = flake["package"]
    assert pkg["name"] == f"sglang-dflash-{project['version']}"
    # the GPU stack and SGLang's router (smg, pins.toml [router]; docs/router.md)
    assert pkg["venvSpec"] == {"sglang-dflash": ["gpu", "router"]}
    assert pkg["mainProgram"] == "sglang-dflash"
    assert pkg["pins"] == PINS.distributions
    assert pkg["sglangVersion"] == PINS.version("sglang")


def test_wrapper_sets_the_jit_environment(flake):
    words = shlex.split(flake["package"]["postBuild"].splitlines()[1])
    assert words[0] == "makeWrapper" and words[2] == "$out/bin/sglang-dflash"
    opts = {}
    i = 3
    while i < len(words):
        if words[i] == "--set-default":
            opts[words[i + 1]] = words[i + 2]
            i += 3
        elif words[i] == "--prefix":
            opts[f"prefix {words[i + 1]}"] = words[i + 3]
            i += 4
        else:
            raise AssertionError(f"unexpected wrapper argument {words[i]}")
    assert opts["TRITON_LIBCUDA_PATH"] == "/run/opengl-driver/lib"
    assert opts["prefix LD_LIBRARY_PATH"] == "/run/opengl-driver/lib"
    assert opts["CUDA_HOME"] == "/stub/cuda-merged"
    assert opts["prefix PATH"].split(":")[0] == "/stub/cuda-merged/bin"


def test_apps_and_checks_run_the_cli(flake):
    assert flake["apps"]["check"].endswith("/bin/sglang-dflash-check")
    assert flake["apps"]["serve"].endswith("/bin/sglang-dflash-serve")
    assert 'exec sglang-dflash check "$@"' in flake["checkApp"]
    assert "sglang-dflash check --offline" in flake["checks"]["preflight"]
    assert "pipefail" in flake["checks"]["preflight"]
    assert "python -m pytest" in flake["checks"]["pytest"]
    assert "nixfmt --check" in flake["checks"]["format"]


def test_dev_shell_prints_the_pins(flake, tmp_path: Path):
    shell = flake["devShell"]
    assert shell["env"]["UV_NO_SYNC"] == "1"
    assert shell["env"]["CUDA_HOME"] == "/stub/cuda-merged"
    proc = subprocess.run(["bash", "-c", shell["shellHook"]], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    for dist, version in PINS.distributions.items():
        assert f"{dist} {version}" in proc.stdout
    assert f"CUDA {PINS.cuda_version}" in proc.stdout


def test_pins_that_disagree_with_uv_lock_are_refused(tmp_path: Path):
    for rel in ("pyproject.toml", "uv.lock", "src/sglang_dflash/pins.toml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    pins = tmp_path / "src/sglang_dflash/pins.toml"
    pins.write_text(pins.read_text().replace(
        f'sglang = "{PINS.version("sglang")}"', 'sglang = "0.5.99"'))
    with pytest.raises(EvalError, match=r"pins\.toml says 0\.5\.99"):
        evaluate(tmp_path)
