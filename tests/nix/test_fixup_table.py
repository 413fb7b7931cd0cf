"""The GPU wheel fixup table (pkgs/sglang-dflash/gpu-wheels.nix) against uv.lock.

A fixup for a package the lock does not have is dead weight that hides drift; a fixup
without a reason cannot be reviewed. Evaluated with Nix 2.8 (the table is pure data)."""

from __future__ import annotations

import tomllib

import pytest

from tests.nix.nixtools import REPO, nix_eval, nix_literal

TABLE = REPO / "pkgs" / "sglang-dflash" / "gpu-wheels.nix"


@pytest.fixture(scope="module")
def table() -> dict:
    return nix_eval(f"import {nix_literal(TABLE)}")


@pytest.fixture(scope="module")
def lock() -> dict[str, list[dict]]:
    path = REPO / "uv.lock"
    if not path.exists():
        pytest.skip("uv.lock is not generated yet")
    by_name: dict[str, list[dict]] = {}
    for pkg in tomllib.loads(path.read_text())["package"]:
        by_name.setdefault(pkg["name"], []).append(pkg)
    return by_name


def test_every_fixed_package_is_locked(table, lock):
    named = set(table["gpu"]) | set(table["native"]) | set(table["collisions"])
    extra = {d for spec in table["gpu"].values() for d in spec.get("extraDeps", [])}
    assert sorted((named | extra) - set(lock)) == []


def test_every_fixup_says_why(table):
    for section in ("gpu", "native", "collisions"):
        for name, spec in table[section].items():
            assert len(spec.get("reason", "").strip()) > 20, f"{section}.{name} has no reason"


def test_gpu_fixups_are_for_wheels_with_native_code(table, lock):
    """A driver/search-path fixup only makes sense for a wheel that ships ELF files
    (a platform wheel) or whose run-time loading reaches the driver."""
    pure = []
    for name in table["gpu"]:
        wheels = [w["url"].rsplit("/", 1)[1] for p in lock[name] for w in p.get("wheels", [])]
        if wheels and all(w.endswith("-any.whl") for w in wheels):
            pure.append(name)
    # flash-attn-4 is the one pure-Python entry: its CuTe kernels load the driver at run
    # time through cuda-bindings, and the entry documents that.
    assert pure == ["flash-attn-4"]


def test_driver_libraries_are_driver_sonames(table):
    assert "libcuda.so.1" in table["driverLibs"]
    assert all(lib.startswith(("libcuda", "libnvidia-")) for lib in table["driverLibs"])
    # Nothing a wheel or the toolkit ships may be ignored globally.
    assert not any(lib.startswith(("libcudart", "libcublas", "libnvrtc")) for lib in
                   table["driverLibs"])


def test_collision_fixups_remove_what_two_wheels_share(table):
    removed = [f for spec in table["collisions"].values() for f in spec.get("remove", [])]
    # build_backend.py is removed from both wheels that ship it, so neither shadows the other.
    assert removed.count("build_backend.py") == 2
