"""gpu_stage.py's I/O steps and the whole script on a synthetic lock with file:// wheels."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .helpers import REPO, STAGE_PY, UNSTAGE_SH, load_stage

gs = load_stage()


def make_wheel(
    where: Path,
    name: str,
    version: str,
    tags: str,
    files: dict[str, bytes],
    modes: dict[str, int] | None = None,
    requires: tuple[str, ...] = (),
) -> Path:
    """A minimal but real wheel: files, dist-info METADATA (+ Requires-Dist)/WHEEL/RECORD."""
    dist = name.replace("-", "_")
    whl = where / f"{dist}-{version}-{tags}.whl"
    info = f"{dist}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + (
        "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    entries[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
    entries[f"{info}/RECORD"] = ""
    with zipfile.ZipFile(whl, "w") as z:
        for path, data in entries.items():
            zi = zipfile.ZipInfo(path)
            zi.external_attr = ((modes or {}).get(path, 0o644)) << 16
            z.writestr(zi, data)
    return whl


def test_unpack_merges_purelib_platlib_keeps_modes_and_skips_scripts(tmp_path):
    whl = make_wheel(
        tmp_path,
        "demo",
        "1.0",
        "py3-none-any",
        {
            "demo/__init__.py": b"A = 1\n",
            "demo-1.0.data/purelib/demo_extra.py": b"B = 2\n",
            "demo-1.0.data/platlib/demo_native/lib.so": b"\x7fELF",
            "demo-1.0.data/scripts/demo-cli": b"#!python\n",
            "demo/bin/tool": b"#!/bin/sh\n",
        },
        modes={"demo/bin/tool": 0o755},
    )
    site = tmp_path / "site"
    site.mkdir()
    skipped = gs.unpack_wheel(whl, site)
    assert skipped == ["demo-1.0.data/scripts"]
    assert (site / "demo_extra.py").read_text() == "B = 2\n"
    assert (site / "demo_native" / "lib.so").exists()
    assert (site / "demo" / "bin" / "tool").stat().st_mode & 0o111
    assert not (site / "demo-1.0.data").exists()
    assert (site / "demo-1.0.dist-info" / "METADATA").exists()


PATCH = """\
--- a/sglang/srt/x.py
+++ b/sglang/srt/x.py
@@ -1 +1 @@
-VALUE = 1
+VALUE = 2
"""


def test_patches_apply_in_order_and_missing_or_empty_dir_is_fine(tmp_path):
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "srt" / "x.py").write_text("VALUE = 1\n")
    assert gs.apply_patches(tmp_path / "absent", site) == []
    (tmp_path / "empty").mkdir()
    assert gs.apply_patches(tmp_path / "empty", site) == []
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "0001-value.patch").write_text(PATCH)
    assert gs.apply_patches(pdir, site) == ["0001-value.patch"]
    assert (site / "sglang" / "srt" / "x.py").read_text() == "VALUE = 2\n"
    with pytest.raises(gs.StageError, match="does not apply"):
        gs.apply_patches(pdir, site)  # already applied: --forward refuses


def test_drop_files_reports_what_went(tmp_path):
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "flash_ops.abi3.so").write_bytes(b"x" * 10)
    (tmp_path / "sgl_kernel" / "common_ops.abi3.so").write_bytes(b"y")
    assert gs.drop_files(tmp_path, gs.FLASH_OPS_GLOB) == [("sgl_kernel/flash_ops.abi3.so", 10)]
    assert (tmp_path / "sgl_kernel" / "common_ops.abi3.so").exists()


# ------------------------------------------------------------------ the whole script


def _lock_entry(
    name: str, version: str, wheels: list[Path], deps: str = "", optional: str = ""
) -> str:
    ws = ",\n".join(
        f'    {{ url = "{w.as_uri()}", hash = "sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}"'
        f", size = {w.stat().st_size} }}"
        for w in wheels
    )
    out = (
        f'[[package]]\nname = "{name}"\nversion = "{version}"\n'
        f'source = {{ registry = "https://pypi.org/simple" }}\n'
    )
    if deps:
        out += f"dependencies = [\n{deps}\n]\n"
    out += f"wheels = [\n{ws},\n]\n"
    if optional:
        out += f"\n[package.optional-dependencies]\n{optional}\n"
    return out + "\n"


@pytest.fixture
def synthetic_repo(tmp_path):
    """A project named sglang-dflash with a `gpu` extra over a tiny fake SGLang stack."""
    repo, wh = tmp_path / "repo", tmp_path / "wheels"
    (repo / "src" / "sglang_dflash").mkdir(parents=True)
    wh.mkdir()
    (repo / "src" / "sglang_dflash" / "__init__.py").write_text("")
    (repo / "src" / "sglang_dflash" / "plugin.py").write_text("def register():\n    pass\n")
    (repo / "src" / "sglang_dflash" / "pins.toml").write_text(
        '[distributions]\nsglang = "0.5.17"\ntorch = "2.11.0"\n'
    )
    (repo / "host-packages.txt").write_text("# the synthetic host\ntorch==2.11.0\nnot-in-lock\n")
    (repo / "pyproject.toml").write_text(
        '[project]\nname = "sglang-dflash"\nversion = "0.0.1"\n'
        '[project.entry-points."sglang.srt.plugins"]\nddtree = "sglang_dflash.plugin:register"\n'
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["src/sglang_dflash"]\n'
    )
    pdir = repo / "overlays" / "patches" / "sglang-0.5.17"
    pdir.mkdir(parents=True)
    (pdir / "0001-value.patch").write_text(PATCH)
    sg = "sglang/srt/x.py"
    lock = 'version = 1\nrevision = 3\nrequires-python = ">=3.11"\n\n'
    lock += _lock_entry(
        "sglang",
        "0.5.17",
        [
            make_wheel(
                wh, "sglang", "0.5.17", "cp311-cp311-manylinux_2_34_x86_64", {sg: b"VALUE = 0\n"}
            ),
            make_wheel(
                wh,
                "sglang",
                "0.5.17",
                "cp312-cp312-manylinux_2_34_x86_64",
                {sg: b"VALUE = 1\n", "sglang/__init__.py": b""},
                requires=("torch==2.11.0", "tilelang==0.1.11", "sglang-kernel==0.4.5", "helper",
                          'av; platform_machine == "aarch64"'),
            ),
        ],
        deps='    { name = "torch" },\n    { name = "tilelang" },\n'
        '    { name = "sglang-kernel" },\n    { name = "helper" },',
    )
    lock += _lock_entry(
        "sglang-kernel",
        "0.4.5",
        [
            make_wheel(
                wh,
                "sglang-kernel",
                "0.4.5",
                "cp310-abi3-manylinux2014_x86_64",
                {"sgl_kernel/__init__.py": b"", "sgl_kernel/flash_ops.abi3.so": b"F" * 5000},
            )
        ],
    )
    lock += _lock_entry(
        "torch",
        "2.11.0",
        [
            make_wheel(
                wh,
                "torch",
                "2.11.0",
                "cp312-cp312-manylinux_2_28_x86_64",
                {"torch/__init__.py": b""},
            )
        ],
        deps='    { name = "cuda-toolkit", extra = ["cublas"] },\n    { name = "sympy" },',
    )
    lock += _lock_entry(
        "cuda-toolkit",
        "13.0.2",
        [make_wheel(wh, "cuda-toolkit", "13.0.2", "py2.py3-none-any", {"cuda_toolkit.py": b""})],
        optional='cublas = [\n    { name = "nvidia-cublas" },\n]',
    )
    lock += _lock_entry(
        "nvidia-cublas",
        "13.1.0.3",
        [
            make_wheel(
                wh,
                "nvidia-cublas",
                "13.1.0.3",
                "py3-none-manylinux_2_27_x86_64",
                {"nvidia/cublas.py": b""},
            )
        ],
    )
    lock += _lock_entry(
        "sympy",
        "1.14.0",
        [make_wheel(wh, "sympy", "1.14.0", "py3-none-any", {"sympy/__init__.py": b""})],
    )
    lock += _lock_entry(
        "tilelang",
        "0.2.1",
        [
            make_wheel(
                wh,
                "tilelang",
                "0.2.1",
                "cp312-cp312-manylinux_2_28_x86_64",
                {"tilelang/__init__.py": b""},
            )
        ],
        deps='    { name = "only-xg" },',
    )
    lock += _lock_entry(
        "only-xg", "1.0", [make_wheel(wh, "only-xg", "1.0", "py3-none-any", {"only_xg.py": b""})]
    )
    lock += _lock_entry(
        "helper",
        "2.0",
        [
            make_wheel(
                wh,
                "helper",
                "2.0",
                "py3-none-any",
                {"helper.py": b"H = 1\n", "helper-2.0.data/scripts/helper": b"#!python\n"},
            )
        ],
    )
    lock += (
        '[[package]]\nname = "sglang-dflash"\nversion = "0.0.1"\nsource = { editable = "." }\n'
        "\n[package.optional-dependencies]\ngpu = [\n"
        '    { name = "sglang", marker = "python_full_version == \'3.12.*\'" },\n'
        '    { name = "torch", marker = "python_full_version == \'3.12.*\'" },\n]\n'
    )
    (repo / "uv.lock").write_text(lock)
    return repo


def _run_stage(repo: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(STAGE_PY),
            "--repo",
            str(repo),
            "--cache",
            str(cache),
            "--host-packages",
            str(repo / "host-packages.txt"),
            "--part-mib",
            "1",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_stage_then_unstage_end_to_end(synthetic_repo, tmp_path):
    cache = tmp_path / "cache"
    r = _run_stage(synthetic_repo, cache)
    if r.returncode != 0 and "building sglang-dflash's wheel failed" in r.stderr:
        pytest.skip(f"pip could not build the project wheel here (hatchling from PyPI): {r.stderr}")
    assert r.returncode == 0, r.stderr
    out = synthetic_repo / ".stage"
    m = json.loads((out / "manifest.json").read_text())
    shipped = {w["name"] for w in m["wheels"]}
    assert shipped == {"sglang", "sglang-kernel", "helper"}
    reasons = {e["name"]: e["reason"] for e in m["excluded"]}
    assert set(reasons) == {
        "torch",
        "cuda-toolkit",
        "nvidia-cublas",
        "sympy",
        "tilelang",
        "only-xg",
    }
    assert reasons["nvidia-cublas"].startswith("brought by the host's torch")
    assert reasons["tilelang"].startswith("optional")
    assert reasons["only-xg"] == "needed only by packages left out (tilelang)"
    assert reasons["sympy"] == "needed only by packages left out (torch)"
    assert m["patches_applied"] == ["0001-value.patch"]
    assert [d["path"] for d in m["dropped_files"]] == ["sgl_kernel/flash_ops.abi3.so"]
    assert m["sizes"]["downloaded_now_bytes"] == m["sizes"]["download_bytes"] > 0
    assert m["skipped_wheel_data"] == {"helper-2.0-py3-none-any.whl": ["helper-2.0.data/scripts"]}
    assert "excluded 6:" in r.stdout and "in 1 parts" in r.stdout
    # sglang's own requirement left out on purpose is named (torch is the host's, not missing)
    assert m["declared_left_out"] == ["tilelang==0.1.11"]
    assert "note: sglang declares 1 requirement(s) left out here (tilelang==0.1.11)" in r.stdout

    dest = tmp_path / "site"
    u = subprocess.run(
        ["bash", str(UNSTAGE_SH), str(out), str(dest)], capture_output=True, text=True, timeout=60
    )
    assert u.returncode == 0, u.stderr
    assert (dest / "sglang" / "srt" / "x.py").read_text() == "VALUE = 2\n"  # cp312, patched
    assert not (dest / "sgl_kernel" / "flash_ops.abi3.so").exists()
    assert not (dest / "torch").exists() and not (dest / "tilelang").exists()
    eps = list(dest.glob("sglang_dflash-*.dist-info/entry_points.txt"))
    assert eps and "ddtree = sglang_dflash.plugin:register" in eps[0].read_text()

    again = _run_stage(synthetic_repo, cache)  # the cache is reused
    assert again.returncode == 0, again.stderr
    m2 = json.loads((out / "manifest.json").read_text())
    assert m2["sizes"]["downloaded_now_bytes"] == 0


def test_stage_rejects_a_wheel_whose_hash_differs_from_the_lock(synthetic_repo, tmp_path):
    lock = synthetic_repo / "uv.lock"
    text = lock.read_text()
    i = text.index("sha256:", text.index('[[package]]\nname = "helper"'))
    lock.write_text(text[: i + 7] + "0" * 64 + text[i + 71 :])
    r = _run_stage(synthetic_repo, tmp_path / "cache", "--plan-only")
    assert r.returncode == 0  # planning does not download
    r = _run_stage(synthetic_repo, tmp_path / "cache")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "helper-2.0" in r.stderr


def test_stage_usage_errors_are_one_line(tmp_path):
    r = _run_stage(tmp_path, tmp_path / "cache")
    assert r.returncode == 1 and r.stderr.startswith("gpu_stage: ") and "uv.lock" in r.stderr
    r = _run_stage(REPO, tmp_path / "cache", "--keep", "numpy", "--plan-only")
    assert r.returncode == 1 and "not an optional exclusion" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_fetch_reuses_a_good_cache_entry_and_replaces_a_bad_one(tmp_path):
    src = make_wheel(tmp_path, "demo", "1.0", "py3-none-any", {"demo.py": b"x = 1\n"})
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    wheel = gs.Wheel(src.name, src.as_uri(), digest, src.stat().st_size)
    cache = tmp_path / "cache"
    cache.mkdir()
    path, new = gs.fetch(wheel, cache)
    assert new and path.read_bytes() == src.read_bytes()
    assert gs.fetch(wheel, cache) == (path, False)
    path.write_bytes(b"damaged")
    path2, new = gs.fetch(wheel, cache)
    assert new and path2.read_bytes() == src.read_bytes()
    bad = gs.Wheel(src.name, src.as_uri(), "0" * 64, 1)
    path.unlink()
    with pytest.raises(gs.StageError, match="sha256"):
        gs.fetch(bad, cache)
    assert not any(cache.iterdir())  # nothing half-downloaded is left to be trusted later


def test_part_size_fits_beside_the_working_tree(tmp_path):
    stage = load_stage()
    assert stage.auto_part_mib(1 * stage.MIB) == 60  # small tree: capped at 60
    assert stage.auto_part_mib(6 * stage.MIB) == 56  # 64 - 6 - 2
    with pytest.raises(stage.StageError, match="no room"):
        stage.auto_part_mib(63 * stage.MIB)
    # the tree is measured as a device call sends it: tracked + untracked, not ignored
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("big/\n")
    (tmp_path / "a.txt").write_bytes(b"x" * 1000)
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob").write_bytes(b"x" * 100_000)
    assert stage.working_tree_bytes(tmp_path) == 1000 + len("big/\n")
