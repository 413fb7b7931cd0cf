"""The package layer against the REAL sglang 0.5.17 wheel, installed with pip.

Downloads the wheel once into ~/.cache/sglang-dflash/wheels (22 MB) when absent.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dflash.manifest import load_manifest
from sglang_dflash.pins import load_pins
from tests.check.fakes import run_check

pytestmark = pytest.mark.slow

CACHE = Path.home() / ".cache" / "sglang-dflash" / "wheels"
SGLANG_CHECKS = ("sglang", "shadowing", "nested", "version", "modules", "record")


def sglang_wheel() -> Path:
    pin = load_pins().version("sglang")
    found = sorted(CACHE.glob(f"sglang-{pin}-cp312-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                        "cp", "--platform", "manylinux_2_34_x86_64", f"sglang=={pin}",
                        "-d", str(CACHE)], capture_output=True, text=True, timeout=600)
    found = sorted(CACHE.glob(f"sglang-{pin}-cp312-*.whl"))
    if p.returncode != 0 or not found:
        pytest.skip(f"cannot download sglang=={pin}: {p.stderr.strip()[-300:]}")
    return found[0]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install --no-deps --target` of the real wheel (pip ignores the cp312 tag here)."""
    site = tmp_path_factory.mktemp("real") / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                    "--ignore-requires-python", "--quiet", "--target", str(site),
                    "--platform", "manylinux_2_34_x86_64", "--python-version", "3.12",
                    "--only-binary=:all:", str(sglang_wheel())],
                   check=True, capture_output=True, timeout=600)
    return site


def package_results(site: Path) -> dict:
    _rc, res, err, _ = run_check("--layer", "package", sites=(site,))
    assert res, err
    return res


def test_real_wheel_passes(installed: Path) -> None:
    res = package_results(installed)
    assert {n: res[f"package.{n}"]["status"] for n in SGLANG_CHECKS} == dict.fromkeys(
        SGLANG_CHECKS, "PASS"), res
    assert res["package.version"]["found"].startswith("sglang 0.5.17 == pin")
    n = len(load_manifest().required_modules)
    assert res["package.modules"]["found"] == (
        f"{n} required modules found in {installed / 'sglang'}")


def test_our_entry_point_resolves_with_the_real_wheel(installed: Path) -> None:
    """The plugin entry point comes from the editable install of this project."""
    if not (Path(__file__).parents[2] / "src" / "sglang_dflash" / "plugin.py").exists():
        pytest.skip("src/sglang_dflash/plugin.py is not written yet (the entry point's target)")
    res = package_results(installed)
    assert res["package.entry_point"]["status"] == "PASS", res["package.entry_point"]


def test_cp_r_onto_itself_nests(installed: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(installed, site)
    # the seeds' mistake: copy the package onto a target where it already exists
    other = tmp_path / "from-other-host"
    shutil.copytree(site / "sglang", other / "sglang")
    subprocess.run(["cp", "-r", str(other / "sglang"), str(site / "sglang")], check=True)
    res = package_results(site)
    assert res["package.nested"]["status"] == "FAIL"
    assert str(site / "sglang" / "sglang") in res["package.nested"]["found"]
    assert f"rm -rf {site / 'sglang' / 'sglang'}" in res["package.nested"]["fix"]


def test_deleted_module_is_named(installed: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(installed, site)
    (site / "sglang" / "srt" / "speculative" / "dflash_utils.py").unlink()
    res = package_results(site)
    assert res["package.modules"]["status"] == "FAIL"
    assert "sglang.srt.speculative.dflash_utils" in res["package.modules"]["found"]
    assert "partial copy: 1 of" in res["package.record"]["found"]
    assert "sglang/srt/speculative/dflash_utils.py" in res["package.record"]["found"]


def test_one_byte_edit_is_named(installed: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(installed, site)
    victim = site / "sglang" / "srt" / "speculative" / "spec_info.py"
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x01
    victim.write_bytes(bytes(data))
    res = package_results(site)
    assert res["package.record"]["status"] == "FAIL"
    assert "1 file(s) differ from RECORD: sglang/srt/speculative/spec_info.py" \
        in res["package.record"]["found"]


@pytest.mark.parametrize("whole_dirs", [True, False], ids=["dir-link", "file-links"])
def test_real_wheel_in_a_nix_env(installed: Path, tmp_path: Path, whole_dirs: bool) -> None:
    """The real wheel linked into an env the way buildEnv/mkVirtualEnv does it."""
    from tests.check.test_nix_layout import link_tree

    env = tmp_path / "env"
    link_tree([installed], env, whole=whole_dirs)
    assert (env / "sglang").is_symlink() == whole_dirs
    res = package_results(env)
    assert {n: res[f"package.{n}"]["status"] for n in SGLANG_CHECKS} == dict.fromkeys(
        SGLANG_CHECKS, "PASS"), res
    assert "reached through symlinks (their targets hashed)" in res["package.record"]["found"]
    victim = installed / "sglang" / "srt" / "speculative" / "spec_info.py"
    victim.chmod(0o644)
    original = victim.read_bytes()
    try:
        victim.write_bytes(original + b"\n")
        res = package_results(env)
        assert res["package.record"]["found"].startswith(
            "1 file(s) differ from RECORD: sglang/srt/speculative/spec_info.py (-> "
            f"{victim})")
    finally:
        victim.write_bytes(original)


def test_real_wheel_without_its_dependencies_fails_requires(installed: Path) -> None:
    """`pip install --no-deps` of the real wheel: a complete sglang whose declared
    dependencies (71 apply on Linux x86_64; av/decord2 are ARM-only) are mostly absent."""
    import platform

    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("the count 71 is for Linux x86_64 markers")
    res = package_results(installed)["package.requires"]
    assert res["status"] == "FAIL", res
    assert res["found"].startswith("sglang 0.5.17 (71 declared requirements, "), res
    assert " missing: " in res["found"]
