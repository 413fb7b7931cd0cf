"""Package layer against real fake-site trees, through `python -m sglang_dflash check`."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from sglang_dflash.manifest import load_manifest
from tests.check.fakes import make_sglang, run_check, write_dist_info

SGLANG_CHECKS = ("sglang", "shadowing", "nested", "version", "modules", "record")


def statuses(res: dict, names=SGLANG_CHECKS) -> dict[str, str]:
    return {n: res[f"package.{n}"]["status"] for n in names}


def test_complete_pinned_sglang_passes(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_sglang(site)
    _rc, res, _err, _ = run_check("--layer", "package", sites=(site,))
    assert statuses(res) == dict.fromkeys(SGLANG_CHECKS, "PASS"), res
    assert str(site / "sglang") in res["package.sglang"]["found"]
    assert "0.5.17" in res["package.version"]["found"]
    assert "1 shared objects present" in res["package.record"]["found"]


def test_pypi_sglang_without_dflash_modules_fails(tmp_path: Path) -> None:
    """Seed 000: PyPI sglang 0.5.9 has sglang.srt.speculative but no dflash modules."""
    site = tmp_path / "site"
    required = load_manifest().required_modules
    make_sglang(site, version="0.5.9", skip=tuple(m for m in required if "dflash" in m))
    rc, res, _, _ = run_check("--layer", "package", sites=(site,))
    assert rc == 1
    assert res["package.version"]["status"] == "FAIL"
    assert "sglang 0.5.9" in res["package.version"]["found"]
    mods = res["package.modules"]
    assert mods["status"] == "FAIL"
    assert "sglang.srt.speculative.dflash_worker_v2" in mods["found"]
    assert "sglang.srt.models.dflash" in mods["found"]
    assert "0.5.9" in mods["found"] and "sglang==0.5.17" in mods["fix"]


def test_scp_r_onto_existing_package_nests_and_fails(tmp_path: Path) -> None:
    """Seed 001/004: `scp -r src/sglang host:site/sglang` onto an existing one nests it."""
    target, source = tmp_path / "site", tmp_path / "ct129"
    make_sglang(target, version="0.5.9", skip=("sglang.srt.speculative.dflash_utils",))
    make_sglang(source)
    subprocess.run(["cp", "-r", str(source / "sglang"), str(target / "sglang")], check=True)
    assert (target / "sglang" / "sglang" / "__init__.py").is_file()
    rc, res, _, _ = run_check("--layer", "package", sites=(target,))
    assert rc == 1
    nested = res["package.nested"]
    assert nested["status"] == "FAIL"
    assert str(target / "sglang" / "sglang") in nested["found"]
    assert f"rm -rf {target / 'sglang' / 'sglang'}" in nested["fix"]
    assert "cp -rT" in nested["fix"] and "rsync" in nested["fix"]
    # the stale outer package still lacks the module, and says so
    assert "dflash_utils" in res["package.modules"]["found"]


def test_shadowing_copy_names_both_and_the_winner(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    make_sglang(first)
    make_sglang(second)
    rc, res, _, _ = run_check("--layer", "package", sites=(first, second))
    assert rc == 1
    sh = res["package.shadowing"]
    assert sh["status"] == "FAIL"
    assert f"{first / 'sglang'} (wins)" in sh["found"]
    assert f"{second / 'sglang'} (shadowed)" in sh["found"]


def test_namespace_portion_loses_to_the_regular_package(tmp_path: Path) -> None:
    """A stray `sglang/` directory without __init__.py earlier on the path is reported."""
    stray, site = tmp_path / "stray", tmp_path / "site"
    (stray / "sglang").mkdir(parents=True)
    make_sglang(site)
    _rc, res, _, _ = run_check("--layer", "package", sites=(stray, site))
    assert str(site / "sglang") in res["package.sglang"]["found"]
    assert res["package.shadowing"]["status"] == "FAIL"
    assert "namespace" in res["package.shadowing"]["found"]


def test_partial_copy_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pkg = make_sglang(site)
    (pkg / "srt" / "server_args.py").unlink()
    (pkg / "srt" / "speculative" / "dflash_utils.py").unlink()
    _rc, res, _, _ = run_check("--layer", "package", sites=(site,))
    rec = res["package.record"]
    assert rec["status"] == "FAIL"
    assert "partial copy: 2 of" in rec["found"]
    assert "sglang/srt/server_args.py" in rec["found"]
    assert "sglang.srt.speculative.dflash_utils" in res["package.modules"]["found"]


def test_altered_file_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pkg = make_sglang(site)
    target = pkg / "srt" / "speculative" / "dflash_worker_v2.py"
    target.write_bytes(target.read_bytes() + b"#")
    rc, res, _, _ = run_check("--layer", "package", sites=(site,))
    rec = res["package.record"]
    assert rc == 1 and rec["status"] == "FAIL"
    assert "1 file(s) differ from RECORD: sglang/srt/speculative/dflash_worker_v2.py" \
        in rec["found"]


def test_patched_file_is_checked_against_the_manifest(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pkg = make_sglang(site)
    rel = "sglang/srt/server_args.py"
    (pkg / "srt" / "server_args.py").write_text("# patched by the overlay\n")
    good = hashlib.sha256(b"# patched by the overlay\n").hexdigest()
    manifest = _manifest_with(tmp_path, patched_files={rel: good})
    _rc, res, _, _ = run_check("--layer", "package", "--manifest", str(manifest), sites=(site,))
    assert res["package.record"]["status"] == "PASS", res["package.record"]
    manifest = _manifest_with(tmp_path, patched_files={rel: "0" * 64})
    _rc, res, _, _ = run_check("--layer", "package", "--manifest", str(manifest), sites=(site,))
    assert res["package.record"]["status"] == "FAIL"
    assert f"{rel} (patched file differs from the manifest)" in res["package.record"]["found"]


def test_copy_without_dist_info_and_two_dist_infos(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_sglang(site, dist_info=False)
    _rc, res, _, _ = run_check("--layer", "package", sites=(site,))
    assert res["package.version"]["status"] == "FAIL"
    assert "no sglang dist-info beside" in res["package.version"]["found"]
    assert res["package.record"]["status"] == "SKIP"
    write_dist_info(site, "sglang", "0.5.9")
    write_dist_info(site, "sglang", "0.5.17")
    _rc, res, _, _ = run_check("--layer", "package", sites=(site,))
    found = res["package.version"]["found"]
    assert "2 sglang dist-infos" in found
    assert "sglang-0.5.9.dist-info" in found and "sglang-0.5.17.dist-info" in found


def test_no_sglang_at_all(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    rc, res, _, _ = run_check("--layer", "package", sites=(site,))
    assert rc == 1
    assert res["package.sglang"]["status"] == "FAIL"
    assert "no sglang package on sys.path" in res["package.sglang"]["found"]
    assert "sglang==0.5.17" in res["package.sglang"]["fix"]
    assert res["package.modules"]["status"] == "SKIP"


def _manifest_with(tmp_path: Path, **changes) -> Path:
    data = json.loads((Path(__file__).parents[2] / "src" / "sglang_dflash"
                       / "manifest.json").read_text())
    data.update(changes)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return path


def test_entry_point_discovered_and_resolved(tmp_path: Path) -> None:
    """A distribution on the path registers the plugin; its module must resolve."""
    site = tmp_path / "site"
    make_sglang(site)
    ep = {"group": "sglang.srt.plugins", "name": "ddtree-checktest",
          "value": "checktest_plugin.hooks:register"}
    manifest = _manifest_with(tmp_path, entry_point=ep)
    write_dist_info(site, "checktest-plugin", "1.0", entry_points=(
        "[sglang.srt.plugins]\nddtree-checktest = checktest_plugin.hooks:register\n"))
    _rc, res, _, _ = run_check("--layer", "package", "--manifest", str(manifest), sites=(site,))
    e = res["package.entry_point"]
    assert e["status"] == "FAIL" and "checktest_plugin.hooks is not found" in e["found"]
    (site / "checktest_plugin").mkdir()
    (site / "checktest_plugin" / "__init__.py").write_text("")
    (site / "checktest_plugin" / "hooks.py").write_text("def register():\n    pass\n")
    _rc, res, _, _ = run_check("--layer", "package", "--manifest", str(manifest), sites=(site,))
    assert res["package.entry_point"]["status"] == "PASS", res["package.entry_point"]
    assert str(site / "checktest_plugin" / "hooks.py") in res["package.entry_point"]["found"]


def test_entry_point_missing_or_pointing_elsewhere(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_sglang(site)
    ep = {"group": "sglang.srt.plugins", "name": "ddtree-absent", "value": "x.y:z"}
    _rc, res, _, _ = run_check("--layer", "package", "--manifest",
                              str(_manifest_with(tmp_path, entry_point=ep)), sites=(site,))
    assert "no entry point 'ddtree-absent'" in res["package.entry_point"]["found"]
    ep = {"group": "sglang.srt.plugins", "name": "ddtree-other", "value": "ours:register"}
    write_dist_info(site, "impostor", "1.0",
                    entry_points="[sglang.srt.plugins]\nddtree-other = theirs:register\n")
    _rc, res, _, _ = run_check("--layer", "package", "--manifest",
                              str(_manifest_with(tmp_path, entry_point=ep)), sites=(site,))
    found = res["package.entry_point"]["found"]
    assert res["package.entry_point"]["status"] == "FAIL"
    assert "theirs:register" in found and "expected ours:register" in found


def test_overlay_file_differs_from_manifest(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_sglang(site)
    real = load_manifest()
    if not real.overlay_files:
        raise AssertionError("the manifest lists no overlay files")
    victim = sorted(real.overlay_files)[0]
    files = dict(real.overlay_files, **{victim: "0" * 64, "ddtree/gone.py": "1" * 64})
    _rc, res, _, _ = run_check("--layer", "package", "--manifest",
                              str(_manifest_with(tmp_path, overlay_files=files)), sites=(site,))
    ov = res["package.overlay"]
    assert ov["status"] == "FAIL"
    assert f"differ from the manifest: {victim}" in ov["found"]
    assert "missing: ddtree/gone.py" in ov["found"]
    assert "manifest --write" in ov["fix"]


def test_unreadable_manifest_fails_and_skips_dependents(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_sglang(site)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    rc, res, _, _ = run_check("--layer", "package", "--manifest", str(bad), sites=(site,))
    assert rc == 1
    assert res["package.manifest"]["status"] == "FAIL"
    assert "not JSON" in res["package.manifest"]["found"]
    assert res["package.modules"]["status"] == "SKIP"


def test_package_layer_never_imports_sglang(tmp_path: Path) -> None:
    """sglang/__init__.py that raises: the package layer must still pass."""
    site = tmp_path / "site"
    pkg = make_sglang(site)
    (pkg / "__init__.py").write_text("raise SystemExit('sglang was imported')\n")
    write_dist_info(site, "sglang", "0.5.17", sorted(
        str(p.relative_to(site)) for p in pkg.rglob("*") if p.is_file()))
    _rc, res, err, _ = run_check("--layer", "package", sites=(site,))
    assert "sglang was imported" not in err
    assert statuses(res, ("sglang", "modules", "record")) == dict.fromkeys(
        ("sglang", "modules", "record"), "PASS"), res


def test_symlinked_environment_like_nix_buildenv(tmp_path: Path) -> None:
    """python3.withPackages links files into the store; the env path is what counts."""
    store, env = tmp_path / "store", tmp_path / "env"
    make_sglang(store)
    for src in store.rglob("*"):
        dst = env / src.relative_to(store)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src)
    _rc, res, _, _ = run_check("--layer", "package", sites=(env,))
    assert statuses(res) == dict.fromkeys(SGLANG_CHECKS, "PASS"), res
    assert str(env / "sglang") in res["package.modules"]["found"]
