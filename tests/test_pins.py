"""The pins live in one place; pyproject's gpu extra and uv.lock must agree with it."""

from __future__ import annotations

import tomllib

import pytest

from sglang_dflash.pins import load_pins, parse_pins, render_gpu_block, sync_pyproject

from .conftest import REPO


@pytest.fixture(scope="module")
def lock() -> dict:
    with open(REPO / "uv.lock", "rb") as f:
        return tomllib.load(f)


def _lock_packages(lock: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for pkg in lock["package"]:
        out.setdefault(pkg["name"], []).append(pkg)
    return out


def test_pyproject_gpu_extra_is_generated_from_pins():
    text = (REPO / "pyproject.toml").read_text()
    assert render_gpu_block(load_pins()) in text, "run `sglang-dflash pins sync`"


def test_pyproject_gpu_extra_parses_to_the_pins():
    pins = load_pins()
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = {req.split("==")[0]: req.split("==")[1].split(";")[0] for req in gpu["gpu"]}
    assert pinned == pins.distributions


def test_uv_lock_resolves_every_pin_to_exactly_the_pinned_version(lock):
    pkgs = _lock_packages(lock)
    for dist, version in load_pins().distributions.items():
        assert dist in pkgs, f"{dist} missing from uv.lock: run `uv lock`"
        versions = {p["version"] for p in pkgs[dist]}
        assert versions == {version}, f"uv.lock has {dist} {versions}, pins say {version}"


def test_uv_lock_metadata_matches_pyproject(lock):
    """A stale lock (pins changed, `uv lock` not rerun) fails here, not on a GPU host."""
    me = next(p for p in lock["package"] if p["name"] == "sglang-dflash")
    locked = {r["name"]: r.get("specifier") for r in me["metadata"]["requires-dist"]
              if "extra == 'gpu'" in r.get("marker", "")}
    assert locked == {d: f"=={v}" for d, v in load_pins().distributions.items()}


def test_locked_torch_brings_the_pinned_cuda_toolkit(lock):
    pins = load_pins()
    pkgs = _lock_packages(lock)
    torch = pkgs["torch"][0]
    assert any(d["name"] == "cuda-toolkit" for d in torch["dependencies"])
    (toolkit,) = pkgs["cuda-toolkit"]
    assert toolkit["version"].startswith(pins.cuda_version + "."), toolkit["version"]


def test_locked_gpu_wheels_exist_for_linux_x86_64_cp312(lock):
    pkgs = _lock_packages(lock)
    for dist in load_pins().distributions:
        names = [w["url"].rsplit("/", 1)[1] for p in pkgs[dist] for w in p.get("wheels", [])]
        ok = [n for n in names if ("cp312" in n or "py3-none" in n or "abi3" in n)
              and ("x86_64" in n or n.endswith("-any.whl"))]
        assert ok, f"no linux x86_64 wheel for {dist} in uv.lock: {names}"


def test_sync_rewrites_only_the_generated_block():
    pins = load_pins()
    text = (REPO / "pyproject.toml").read_text()
    bumped = parse_pins((REPO / "src/sglang_dflash/pins.toml").read_text()
                        .replace('sglang = "0.5.17"', 'sglang = "9.9.9"'))
    new = sync_pyproject(text, bumped)
    assert "sglang==9.9.9" in new and "sglang==0.5.17" not in new
    assert new.replace("9.9.9", "0.5.17") == text
    assert sync_pyproject(text, pins) == text


def test_missing_pin_table_is_named():
    with pytest.raises(KeyError, match="cuda"):
        parse_pins('[python]\npackage = "3.12"\ncli_min = "3.11"\nmax = "3.12"\n[distributions]\n')


def test_pyproject_router_extra_is_generated_from_pins():
    from sglang_dflash.pins import render_router_block

    pins = load_pins()
    assert pins.router, "pins.toml has no [router] table"
    text = (REPO / "pyproject.toml").read_text()
    assert render_router_block(pins) in text, "run `sglang-dflash pins sync`"
    extra = tomllib.loads(text)["project"]["optional-dependencies"]["router"]
    assert extra == [f"{d}=={v}" for d, v in pins.router.items()]


def test_uv_lock_has_the_pinned_router_with_a_linux_wheel(lock):
    pkgs = _lock_packages(lock)
    me = next(p for p in lock["package"] if p["name"] == "sglang-dflash")
    locked = {r["name"]: r.get("specifier") for r in me["metadata"]["requires-dist"]
              if "extra == 'router'" in r.get("marker", "")}
    assert locked == {d: f"=={v}" for d, v in load_pins().router.items()}, "run `uv lock`"
    for dist, version in load_pins().router.items():
        assert {p["version"] for p in pkgs.get(dist, [])} == {version}, f"{dist} in uv.lock"
        names = [w["url"].rsplit("/", 1)[1] for p in pkgs[dist] for w in p.get("wheels", [])]
        assert any("abi3" in n and "manylinux" in n and "x86_64" in n for n in names), names


def test_sync_rewrites_the_router_block_too():
    text = (REPO / "pyproject.toml").read_text()
    bumped = parse_pins((REPO / "src/sglang_dflash/pins.toml").read_text()
                        .replace('smg = "1.13.0"', 'smg = "9.9.9"'))
    new = sync_pyproject(text, bumped)
    assert '"smg==9.9.9"' in new and "smg==1.13.0" not in new
    assert new.replace("smg==9.9.9", "smg==1.13.0") == text
    with pytest.raises(ValueError, match="router"):
        sync_pyproject(text.replace("# BEGIN GENERATED router", "# gone"), bumped)
