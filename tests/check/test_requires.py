"""package.requires: sglang's declared dependencies, read from its METADATA, against what is
installed — the H200's `No module named 'xgrammar'`, caught before start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_dflash.check import requires
from sglang_dflash.requirements import marker_env
from tests.check.fakes import make_dist, make_sglang, run_check, write_dist_info

LINUX = {"python_version": "3.12", "python_full_version": "3.12.3",
         "implementation_name": "cpython", "platform_python_implementation": "CPython",
         "sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux",
         "os_name": "posix", "extra": ""}


def have(**versions: str) -> dict[str, requires.Installed]:
    return {n.replace("_", "-"): requires.Installed(v, Path(f"/site/{n}-{v}.dist-info"))
            for n, v in versions.items()}


def walk(lines, installed, env=LINUX, meta=None):
    """requires.walk from a root named sglang; ``meta`` maps name -> its Requires-Dist."""
    meta = meta or {}
    return requires.walk("sglang", lines, env, installed,
                         lambda d: meta.get(d.dist_info.name.split("-")[0].replace("_", "-"), []))


def test_walk_names_missing_and_rejected_versions_and_follows_markers():
    lines = [
        "xgrammar==0.2.1",
        "numpy>=2",
        "torch==2.11.0",
        "flashinfer_python[cu13]==0.6.15.post1",  # extras on the requirement: the dist counts
        'av==16.1.0; sys_platform == "linux" and platform_machine == "aarch64"',  # not here
        'pytest; extra == "test"',  # an extra of sglang: not a base dependency
        "requests",  # no specifier: presence only
    ]
    v = walk(lines, have(numpy="1.26.4", torch="2.11.0+cu130",
                         flashinfer_python="0.6.15.post1", requests="2.32.0"))
    assert (v.declared, v.closure) == (5, 4)
    assert v.missing == ["xgrammar==0.2.1 (sglang)"]
    assert v.mismatched == ["numpy 1.26.4 (sglang needs >=2)"]  # torch's +cu130 is accepted
    assert v.unreadable == []
    arm = walk(lines, have(), env=dict(LINUX, platform_machine="aarch64"))
    assert "av==16.1.0 (sglang)" in arm.missing and arm.declared == 6


def test_walk_follows_the_closure_with_the_extras_asked_for():
    meta = {
        "flashinfer-python": ["apache-tvm-ffi>=0.1", 'nvidia-cudnn-frontend; extra == "cu13"',
                              'nvidia-cu12-only; extra == "cu12"', "numpy"],
        "apache-tvm-ffi": ["typing-extensions>=4.16", "sglang"],  # a cycle back to the root
        "numpy": [],
        "typing-extensions": [],
    }
    inst = have(flashinfer_python="0.6.15.post1", apache_tvm_ffi="0.1.11", numpy="2.3.5",
                typing_extensions="4.12.0", sglang="0.5.17")
    v = walk(["flashinfer_python[cu13]==0.6.15.post1", "numpy>=2"], inst, meta=meta)
    assert v.declared == 2
    assert v.missing == ["nvidia-cudnn-frontend (flashinfer-python)"]  # cu13 followed, cu12 not
    assert v.mismatched == ["typing-extensions 4.12.0 (apache-tvm-ffi needs >=4.16)"]
    assert v.closure == 4  # flashinfer, tvm-ffi, numpy, typing-extensions; the root not re-walked
    plain = walk(["flashinfer_python==0.6.15.post1"], inst, meta=meta)
    assert plain.missing == []  # without the extra, its extra-only requirement is not needed


def test_walk_reports_an_unreadable_version_and_metadata_instead_of_raising():
    v = walk(["numpy>=2"], have(numpy="not-a-version"))
    assert v.missing == [] and v.mismatched == []
    assert v.unreadable == ["numpy: cannot read version 'not-a-version'"]
    gone = requires.walk("sglang", ["numpy"], LINUX, have(numpy="2.3.5"), lambda d: None)
    assert gone.unreadable == ["numpy: no readable metadata in /site/numpy-2.3.5.dist-info"]


def test_installed_distributions_first_entry_wins_and_skips_junk(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_dist(a, "numpy", "2.3.5")
    make_dist(b, "numpy", "2.5.2")
    make_dist(b, "Typing_Extensions", "4.16.0")
    (b / "broken-1.0.dist-info").mkdir()  # no METADATA: ignored
    found = requires.installed_distributions([str(a), str(tmp_path / "absent"), str(b)])
    assert found["numpy"].version == "2.3.5" and found["numpy"].dist_info.parent == a
    assert found["typing-extensions"].version == "4.16.0"
    assert "broken" not in found


def test_marker_env_describes_this_interpreter():
    env = marker_env()
    assert env["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert env["sys_platform"] == sys.platform and env["extra"] == ""


def site_with_sglang(tmp_path: Path, *reqs: str) -> Path:
    site = tmp_path / "site"
    make_sglang(site, requires=list(reqs))
    return site


def test_check_fails_naming_the_missing_dependency_then_passes_once_installed(tmp_path):
    site = site_with_sglang(tmp_path, "xgrammar==0.2.1", "numpy>=2",
                            'av==16.1.0; platform_machine == "no-such-machine"')
    make_dist(site, "numpy", "1.26.4")
    rc, res, err, _ = run_check("--layer", "package", sites=(site,))
    line = res["package.requires"]
    assert rc == 1 and line["status"] == "FAIL", err
    assert line["found"] == ("sglang 0.5.17 (2 declared requirements, 1 installed "
                             "distributions reached): 1 missing: xgrammar==0.2.1 (sglang); "
                             "1 at a version not accepted: numpy 1.26.4 (sglang needs >=2)")
    assert "uv sync --frozen" in line["fix"] and "sglang==0.5.17" in line["fix"]
    # the other package lines are unaffected: the tree itself is complete
    assert res["package.record"]["status"] == "PASS"

    (site / "numpy-1.26.4.dist-info").rename(tmp_path / "old-numpy")
    make_dist(site, "numpy", "2.3.5")
    make_dist(site, "xgrammar", "0.2.1")
    _rc, res, err, _ = run_check("--layer", "package", sites=(site,))
    assert res["package.requires"]["status"] == "PASS", err
    assert res["package.requires"]["found"] == (
        "sglang 0.5.17 (2 declared requirements, 2 installed distributions reached): "
        "all installed at accepted versions")


def test_a_copy_earlier_on_the_path_is_the_one_judged(tmp_path):
    """The first entry's numpy is what imports; a good one later on the path does not count."""
    site = site_with_sglang(tmp_path, "numpy>=2")
    early = tmp_path / "early"
    make_dist(early, "numpy", "1.26.4")
    make_dist(site, "numpy", "2.3.5")
    _rc, res, _err, _ = run_check("--layer", "package", sites=(early, site))
    assert res["package.requires"]["status"] == "FAIL"
    assert "numpy 1.26.4 (sglang needs >=2)" in res["package.requires"]["found"]


def test_no_single_sglang_dist_info_skips_with_the_reason(tmp_path):
    site = tmp_path / "site"
    make_sglang(site, dist_info=False)
    _rc, res, _err, _ = run_check("--layer", "package", sites=(site,))
    assert res["package.requires"]["status"] == "SKIP"
    assert "Requires-Dist" in res["package.requires"]["found"]


@pytest.mark.parametrize("n", [12, 13])
def test_a_long_list_stays_one_line(tmp_path, n):
    names = [f"dep{i:02d}" for i in range(n)]
    site = site_with_sglang(tmp_path, *names)
    _rc, res, _err, _ = run_check("--layer", "package", sites=(site,))
    found = res["package.requires"]["found"]
    assert "\n" not in found and f"{n} missing: " in found
    assert found.endswith("dep11 (sglang)" if n == 12 else "and 1 more")


def test_unreadable_metadata_is_a_fail_with_a_fix(tmp_path):
    di = write_dist_info(tmp_path, "sglang", "0.5.17")
    (di / "METADATA").unlink()
    r = requires.check("sglang", "0.5.17", di, [str(tmp_path)], LINUX)
    assert r.status == "FAIL" and "cannot read" in r.found and "reinstall" in r.fix


def test_a_transitive_dependency_missing_on_disk_is_named_with_who_needs_it(tmp_path):
    """A staged flashinfer-python whose own requirement was left behind: found through its
    dist-info, attributed to it."""
    site = site_with_sglang(tmp_path, "flashinfer_python==0.6.15.post1")
    write_dist_info(site, "flashinfer-python", "0.6.15.post1",
                    requires=["apache-tvm-ffi>=0.1,<0.2", 'torch; extra == "never"'])
    _rc, res, _err, _ = run_check("--layer", "package", sites=(site,))
    line = res["package.requires"]
    assert line["status"] == "FAIL"
    assert "1 missing: apache-tvm-ffi>=0.1,<0.2 (flashinfer-python)" in line["found"], line


def test_a_consistent_pip_install_passes_on_real_metadata():
    """No false alarm on real metadata: matplotlib as pip installed it in this environment
    (CI installs it), walked through its real closure (numpy, pillow, contourpy, ...)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("matplotlib")
    except metadata.PackageNotFoundError:
        pytest.skip("matplotlib is not installed here (CI installs it)")
    meta = next(f for f in dist.files or () if f.name == "METADATA" and
                f.parent.name.endswith(".dist-info"))
    info = Path(meta.locate()).parent  # the dist-info directory
    r = requires.check("matplotlib", dist.version, info, sys.path, marker_env())
    assert r.status == "PASS", r.found
    reached = int(r.found.split(" installed distributions reached")[0].rsplit(" ", 1)[1])
    assert reached >= 5, r.found


def test_debian_style_egg_info_counts_and_its_requires_txt_is_followed(tmp_path):
    """dist-packages' `*.egg-info` directories (PKG-INFO + requires.txt, sections for markers
    and extras) are distributions too: no false "missing", and their requirements are walked."""
    site = site_with_sglang(tmp_path, "numpy>=2", "scipy")
    egg = site / "numpy-2.3.5.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.2\nName: numpy\nVersion: 2.3.5\n\n")
    scipy = site / "scipy-1.16.0.egg-info"
    scipy.mkdir()
    (scipy / "PKG-INFO").write_text("Metadata-Version: 1.2\nName: scipy\nVersion: 1.16.0\n")
    (scipy / "requires.txt").write_text(
        "numpy>=3\n\n[test]\npytest\n\n[:sys_platform == \"no-such-os\"]\nwinstuff\n")
    _rc, res, err, _ = run_check("--layer", "package", sites=(site,))
    line = res["package.requires"]
    assert line["status"] == "FAIL", err
    assert line["found"] == ("sglang 0.5.17 (2 declared requirements, 2 installed "
                             "distributions reached): 1 at a version not accepted: "
                             "numpy 2.3.5 (scipy needs >=3)")
