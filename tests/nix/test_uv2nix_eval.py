"""uv2nix on our uv.lock, evaluated at lib level (Nix 2.8, no nixpkgs package set).

tests/nix/eval-wheels.nix loads the workspace, applies the overlay stack of
overlays/python.nix (uv2nix packages, GPU wheel fixups, DDTree overlay) to a stub
package set and reports each package's source. Compared here with uv.lock read
independently (tests/nix/lockfile.py): the same packages, the same wheels, the same
hashes, wheels only, fixups in place. Needs checkouts named by SGLANG_DFLASH_NIXPKGS_LIB,
SGLANG_DFLASH_UV2NIX and SGLANG_DFLASH_PYPROJECT_NIX (docs/nix.md)."""

from __future__ import annotations

import re

import pytest
from packaging.utils import parse_wheel_filename

from sglang_dflash.pins import load_pins
from tests.nix.lockfile import Lock
from tests.nix.nixtools import REPO, nix_eval, nix_literal, require_dep

GLIBC_MINOR = 40  # the stub's glibc (2.40); every locked wheel needs <= 2.34
PINS = load_pins()
FULL_VERSION = f"{PINS.python_package}.0"
EVAL_FILE = REPO / "tests" / "nix" / "eval-wheels.nix"


@pytest.fixture(scope="module")
def evaluated() -> dict:
    lib, uv2nix, pyproject = (require_dep(n) for n in ("nixpkgs-lib", "uv2nix", "pyproject-nix"))
    if not (REPO / "uv.lock").exists():
        pytest.skip("uv.lock is not generated yet")
    result = nix_eval(
        f"import {nix_literal(EVAL_FILE)} {{ nixpkgsLib = {nix_literal(lib)};"
        f" uv2nixSrc = {nix_literal(uv2nix)}; pyprojectNixSrc = {nix_literal(pyproject)};"
        f" workspaceRoot = {nix_literal(REPO)}; pythonVersion = {nix_literal(FULL_VERSION)};"
        f" glibcVersion = \"2.{GLIBC_MINOR}\"; }}", timeout=300)
    result["by_name"] = {p["name"]: p for p in result["packages"]}
    return result


@pytest.fixture(scope="module")
def lock() -> Lock:
    return Lock(REPO / "uv.lock", PINS.python_package, FULL_VERSION)


@pytest.fixture(scope="module")
def gpu_closure(lock: Lock) -> dict[str, dict]:
    return lock.closure("sglang-dflash", ["gpu"])


def test_every_fetch_is_locked_with_its_hash(evaluated, lock):
    bad = [p["name"] for p in evaluated["packages"] if not p["local"]
           and (p["url"], p["hash"]) not in lock.artifacts(p["name"], p["version"])]
    assert bad == []


def test_wheels_only(evaluated):
    """sourcePreference = "wheel": nothing but our own project builds from source."""
    from_source = sorted(p["name"] for p in evaluated["packages"] if p["format"] != "wheel")
    assert from_source == ["sglang-dflash"]
    assert evaluated["by_name"]["sglang-dflash"]["local"]


def test_the_gpu_closure_is_built_at_the_locked_versions(evaluated, gpu_closure):
    by_name = evaluated["by_name"]
    missing = sorted(set(gpu_closure) - set(by_name))
    assert missing == []
    assert {n: by_name[n]["version"] for n in gpu_closure} == {
        n: p["version"] for n, p in gpu_closure.items()}


def test_the_pinned_distributions_are_what_nix_builds(evaluated):
    by_name = evaluated["by_name"]
    assert {d: by_name[d]["version"] for d in PINS.distributions} == PINS.distributions


def test_nix_fetches_a_wheel_pip_would_accept(evaluated, lock, gpu_closure):
    """The wheel list of the gpu closure against tags computed independently with
    packaging.tags: each wheel Nix fetches is installable on CPython <pin> x86_64 Linux and
    has the interpreter/ABI pip would choose. (Between manylinux levels of one build the
    two differ: uv2nix prefers the oldest manylinux tag, pip the newest; both are locked.)"""
    ranks = lock.supported_tags(GLIBC_MINOR)
    by_name = evaluated["by_name"]
    mismatched = {}
    for name, pkg in gpu_closure.items():
        if name == "sglang-dflash":
            continue
        best = lock.best_wheel(pkg, ranks)
        assert best is not None, f"{name}: no locked wheel fits CPython {PINS.python_package}"
        nix_file = by_name[name]["url"].rsplit("/", 1)[1]
        if abi_class(nix_file, ranks) != abi_class(best.url.rsplit("/", 1)[1], ranks):
            mismatched[name] = (nix_file, best.url.rsplit("/", 1)[1])
    assert mismatched == {}
    torch_file = by_name["torch"]["url"].rsplit("/", 1)[1]
    assert torch_file.startswith(f"torch-{PINS.version('torch')}-cp312-cp312-manylinux")


def abi_class(filename: str, ranks: dict) -> tuple[str, str] | None:
    """(interpreter, abi) of the best supported tag of a wheel; None if not installable."""
    _n, _v, _b, tags = parse_wheel_filename(filename)
    supported = sorted((ranks[t], t) for t in tags if t in ranks)
    return (supported[0][1].interpreter, supported[0][1].abi) if supported else None


def test_gpu_fixups_are_applied(evaluated, gpu_closure):
    table = nix_eval(f"import {nix_literal(REPO / 'pkgs/sglang-dflash/gpu-wheels.nix')}")
    by_name = evaluated["by_name"]
    for name in set(table["gpu"]) & set(gpu_closure):
        assert by_name[name]["fixup"] == table["gpu"][name]["reason"], name
        assert "libcuda.so.1" in by_name[name]["ignoreMissing"], name


def search_path_deps(pkg: dict) -> set[str]:
    return set(re.findall(r"/stub/([\w.-]+)", pkg["preFixup"]))


def test_cuda13_libraries_reach_autopatchelf(evaluated):
    """torch finds the CUDA 13 wheels through uv.lock's graph (cuda-toolkit extras);
    sglang-kernel, which declares no dependencies, through its extraDeps (torch)."""
    by_name = evaluated["by_name"]
    cuda_wheels = {"nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc",
                   "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-nvjitlink"}
    assert cuda_wheels <= search_path_deps(by_name["torch"])
    assert {"torch"} | cuda_wheels <= search_path_deps(by_name["sglang-kernel"])
    assert search_path_deps(by_name["nvidia-cusolver"]) == {
        "nvidia-cublas", "nvidia-cusparse", "nvidia-nvjitlink"}
    assert "torch" not in search_path_deps(by_name["torch"])


def test_collision_and_ddtree_overlays_are_applied(evaluated):
    by_name = evaluated["by_name"]
    assert "site-packages/build_backend.py" in by_name["flashinfer-python"]["postInstall"]
    assert "manifest.json" in by_name["sglang-dflash"]["postInstall"]
    series = REPO / "overlays" / "patches" / f"sglang-{PINS.version('sglang')}"
    expected = sorted(p.name for p in series.glob("*.patch")) if series.is_dir() else []
    assert evaluated["ddtreePatches"] == expected
