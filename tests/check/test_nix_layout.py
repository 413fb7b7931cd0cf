"""The package layer in a Nix-built environment: site-packages made of symlinks.

uv2nix/pyproject.nix `mkVirtualEnv` (like nixpkgs' buildEnv) links every package's files
from its own store path. The trees below are built on disk with os.symlink the way
buildEnv merges them, in three shapes:
  dir-link    the package directory itself is a link into the store;
  file-links  real directories all the way down, every file a link;
  merged      buildEnv's own rule: a directory that one package provides is linked
              whole, one that two provide (the overlay adds a module inside sglang) is
              a real directory of links into both store paths.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sglang_dflash.check.package import find_candidates
from sglang_dflash.check.paths import is_inside
from sglang_dflash.manifest import load_manifest
from tests.check.fakes import make_sglang, run_check

SGLANG_CHECKS = ("sglang", "shadowing", "nested", "version", "modules", "record")
LAYOUTS = ("dir-link", "file-links", "merged")
OVERLAY_MODULE = "sglang.srt.speculative.ddtree_overlay_mod"
PY = "lib/python3.12/site-packages"


def store_site(root: Path, name: str) -> Path:
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    site = root / "nix" / "store" / f"{digest}-{name}" / PY
    site.mkdir(parents=True)
    return site


def link_tree(sources: list[Path], dst: Path, whole: bool) -> None:
    """buildEnv's merge: one provider -> link (whole dirs only when `whole`); else recurse."""
    dst.mkdir(parents=True, exist_ok=True)
    names = sorted({c.name for s in sources for c in s.iterdir()})
    for name in names:
        providers = [s / name for s in sources if (s / name).exists()]
        if len(providers) == 1 and (whole or not providers[0].is_dir()):
            os.symlink(providers[0], dst / name)
        elif all(p.is_dir() for p in providers):
            link_tree(providers, dst / name, whole)
        else:
            raise AssertionError(f"buildEnv collision on {dst / name}")


def nix_env(root: Path, layout: str) -> tuple[Path, Path, Path]:
    """(env site, sglang's store site, overlay's store site) for `layout`."""
    sglang = store_site(root, "python3.12-sglang-0.5.17")
    make_sglang(sglang)
    overlay = store_site(root, "python3.12-sglang-dflash-overlay")
    if layout == "merged":
        mod = overlay / (OVERLAY_MODULE.replace(".", "/") + ".py")
        mod.parent.mkdir(parents=True)
        mod.write_text("# added by the overlay, from its own store path\n")
    env = root / "nix" / "store" / "00000000-sglang-dflash-env" / PY
    link_tree([sglang, overlay], env, whole=layout != "file-links")
    return env, sglang, overlay


def manifest_requiring(tmp_path: Path, *extra: str) -> Path:
    data = json.loads((Path(__file__).parents[2] / "src" / "sglang_dflash"
                       / "manifest.json").read_text())
    data["required_modules"] = [*data["required_modules"], *extra]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return path


def package_check(tmp_path: Path, *sites: Path, layout: str = "") -> dict:
    args = ["--layer", "package"]
    if layout == "merged":
        args += ["--manifest", str(manifest_requiring(tmp_path, OVERLAY_MODULE))]
    _rc, res, err, _ = run_check(*args, sites=sites, cwd=tmp_path)
    assert res, err
    return res


def statuses(res: dict) -> dict[str, str]:
    return {n: res[f"package.{n}"]["status"] for n in SGLANG_CHECKS}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_trees_have_the_claimed_shape(tmp_path: Path, layout: str) -> None:
    env, sglang, _ = nix_env(tmp_path, layout)
    pkg = env / "sglang"
    init = pkg / "__init__.py"
    assert os.path.realpath(init) == str(sglang / "sglang" / "__init__.py")
    if layout == "dir-link":
        assert pkg.is_symlink()
    else:
        assert not pkg.is_symlink() and init.is_symlink()
    if layout == "merged":
        assert (pkg / "srt" / "models").is_symlink()  # one provider: linked whole
        assert not (pkg / "srt" / "speculative").is_symlink()  # two: merged
    assert (env / "sglang-0.5.17.dist-info").is_symlink() != (layout == "file-links")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nix_env_passes(tmp_path: Path, layout: str) -> None:
    env, _, _ = nix_env(tmp_path, layout)
    res = package_check(tmp_path, env, layout=layout)
    assert statuses(res) == dict.fromkeys(SGLANG_CHECKS, "PASS"), res
    assert res["package.sglang"]["found"].startswith(f"sglang imports from {env / 'sglang'}")
    assert f"in {env / 'sglang'}" in res["package.modules"]["found"]
    # RECORD's 20 files (19 + RECORD itself is not hashed) were hashed at their targets
    assert "reached through symlinks (their targets hashed)" in res["package.record"]["found"]
    if layout == "merged":  # a module linked in from the overlay's store path belongs
        n = len(load_manifest().required_modules) + 1
        assert res["package.modules"]["found"] == (
            f"{n} required modules found in {env / 'sglang'}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_env_and_store_on_sys_path_are_one_package(tmp_path: Path, layout: str) -> None:
    """nixpkgs' wrappers put store sites on sys.path too; a `result` link is another way in."""
    env, sglang, _ = nix_env(tmp_path, layout)
    result = tmp_path / "result"
    result.symlink_to(env)
    res = package_check(tmp_path, result, env, sglang, layout=layout)
    assert statuses(res) == dict.fromkeys(SGLANG_CHECKS, "PASS"), res
    found = res["package.shadowing"]["found"]
    assert found.startswith("exactly one sglang on sys.path, also reached as ")
    assert str(env / "sglang") in found and str(sglang / "sglang") in found
    assert len(find_candidates([str(result), str(env), str(sglang)])) == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_real_second_copy_is_still_shadowing(tmp_path: Path, layout: str) -> None:
    env, _, _ = nix_env(tmp_path, layout)
    local = tmp_path / "home" / ".local" / "site"
    make_sglang(local)  # same content, different files: a pip install beside the env
    res = package_check(tmp_path, local, env, layout=layout)
    sh = res["package.shadowing"]
    assert sh["status"] == "FAIL"
    assert sh["found"].startswith(f"2 sglang packages on sys.path: {local / 'sglang'} (wins); "
                                  f"{env / 'sglang'} (shadowed)")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nested_copy_in_the_store_is_reported_once(tmp_path: Path, layout: str) -> None:
    env, sglang, _ = nix_env(tmp_path, layout)
    inner = tmp_path / "inner"
    make_sglang(inner)
    os.rename(inner / "sglang", sglang / "sglang" / "sglang")
    if layout != "dir-link":  # a real directory in the env: buildEnv links the new entry
        os.symlink(sglang / "sglang" / "sglang", env / "sglang" / "sglang")
    res = package_check(tmp_path, env, sglang, layout=layout)
    nested = res["package.nested"]
    assert nested["status"] == "FAIL"
    assert nested["found"].startswith(f"nested copy {env / 'sglang' / 'sglang'} (-> "
                                      f"{sglang / 'sglang' / 'sglang'}) inside")
    assert res["package.shadowing"]["status"] == "PASS"  # not a second package
    fails = [k for k, r in res.items() if k != "_summary" and r["status"] == "FAIL"
             and k != "package.overlay"]
    assert fails == ["package.nested"], fails


def test_a_link_back_to_the_package_is_not_called_a_copy(tmp_path: Path) -> None:
    env, sglang, _ = nix_env(tmp_path, "dir-link")
    os.symlink(".", sglang / "sglang" / "sglang")
    res = package_check(tmp_path, env)
    assert res["package.nested"]["found"] == (
        f"{env / 'sglang' / 'sglang'} is a symlink back to the package itself "
        f"({sglang / 'sglang'}): every module is importable twice")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_missing_module_is_named(tmp_path: Path, layout: str) -> None:
    """The store file is gone: a dangling link in a real env directory, a hole otherwise."""
    env, sglang, _ = nix_env(tmp_path, layout)
    rel = "sglang/srt/speculative/dflash_utils.py"
    (sglang / rel).unlink()
    res = package_check(tmp_path, env, layout=layout)
    assert res["package.modules"]["status"] == "FAIL"
    assert "lacks 1 required module(s): sglang.srt.speculative.dflash_utils" \
        in res["package.modules"]["found"]
    rec = res["package.record"]
    assert rec["status"] == "FAIL"
    if layout == "dir-link":  # the directory link is intact; the file is just not there
        assert f"are missing: {rel}; " in rec["found"] + "; "
    else:
        assert (f"are missing: {rel} (dangling symlink {env / rel} -> {sglang / rel})"
                in rec["found"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_altered_store_file_is_named_with_its_target(tmp_path: Path, layout: str) -> None:
    env, sglang, _ = nix_env(tmp_path, layout)
    rel = "sglang/srt/speculative/dflash_worker_v2.py"
    (sglang / rel).write_bytes((sglang / rel).read_bytes() + b"#")
    res = package_check(tmp_path, env, layout=layout)
    rec = res["package.record"]
    assert rec["status"] == "FAIL"
    assert f"1 file(s) differ from RECORD: {rel} (-> {sglang / rel})" in rec["found"]
    assert "nix-store --verify --check-contents --repair" in rec["fix"]


def test_a_link_retargeted_at_other_bytes_is_altered(tmp_path: Path) -> None:
    """The link is intact but points at a different file: content, not names, is checked."""
    env, _, _ = nix_env(tmp_path, "file-links")
    rel = "sglang/srt/server_args.py"
    other = tmp_path / "elsewhere.py"
    other.write_text("# not what RECORD says\n")
    (env / rel).unlink()
    (env / rel).symlink_to(other)
    rec = package_check(tmp_path, env)["package.record"]
    assert rec["status"] == "FAIL"
    assert f"1 file(s) differ from RECORD: {rel} (-> {other})" in rec["found"]


def test_is_inside_compares_unresolved_and_resolved(tmp_path: Path) -> None:
    env, sglang, overlay = nix_env(tmp_path, "merged")
    linked_in = env / (OVERLAY_MODULE.replace(".", "/") + ".py")
    assert os.path.realpath(linked_in).startswith(str(overlay))  # bytes elsewhere...
    assert is_inside(linked_in, env / "sglang")  # ...but Python finds it in the package
    store_file = sglang / "sglang" / "launch_server.py"
    # a real directory of links is not its store path's twin (it merges the overlay)...
    assert not is_inside(store_file, env / "sglang")
    # ...unless sys.path reaches the package both ways (an alias)
    assert is_inside(store_file, env / "sglang", (sglang / "sglang",))
    linked_env, linked_store, _ = nix_env(tmp_path / "a", "dir-link")
    # a linked package directory: the store file is inside, resolved
    assert is_inside(linked_store / "sglang" / "launch_server.py", linked_env / "sglang")
    assert is_inside(env / "sglang" / "srt" / ".." / "launch_server.py", env / "sglang")
    other = tmp_path / "other" / "sglang"
    other.mkdir(parents=True)
    assert not is_inside(other / "x.py", env / "sglang")
    assert not is_inside(env / "sglang-0.5.17.dist-info" / "RECORD", env / "sglang")
    assert not is_inside(env / "sglang" / ".." / "x.py", env / "sglang")


def test_hard_linked_venvs_are_still_two_packages(tmp_path: Path) -> None:
    """uv hard-links identical files from its cache: same inode, yet two directories."""
    a, b = tmp_path / "venv-a", tmp_path / "venv-b"
    make_sglang(a)
    for src in a.rglob("*"):
        dst = b / src.relative_to(a)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        else:
            os.link(src, dst)
    assert os.path.samefile(a / "sglang" / "__init__.py", b / "sglang" / "__init__.py")
    assert len(find_candidates([str(a), str(b)])) == 2
    res = package_check(tmp_path, a, b)
    assert res["package.shadowing"]["status"] == "FAIL"
