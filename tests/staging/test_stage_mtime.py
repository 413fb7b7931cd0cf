"""The staged tarball keeps a restored JIT cache valid: fixed mtimes, and ninja agrees.

FlashInfer builds its kernels with ninja (`deps = gcc`): a header newer than a module's objects
rebuilds the module. These tests build a small module the same way with the real ninja and gcc
against headers unpacked from a tarball `gpu_stage.pack` wrote, then unpack a second staging run
over it, as a fresh GPU lease does, and ask ninja what it would rebuild.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from .helpers import load_stage

gs = load_stage()

NINJA = shutil.which("ninja")
GCC = shutil.which("gcc")
needs_tools = pytest.mark.skipif(
    not (NINJA and GCC), reason="ninja and gcc are needed to build the JIT-like module"
)


def make_site(root: Path) -> Path:
    site = root / "site"
    inc = site / "pkg" / "data" / "include"
    inc.mkdir(parents=True)
    (inc / "kernel.h").write_text("static inline int twice(int x) { return 2 * x; }\n")
    (site / "pkg" / "__init__.py").write_text("")
    return site


def unpack(tarball: Path, dest: Path) -> None:
    """As scripts/gpu_unstage.sh does: GNU tar, mtimes from the archive."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(dest)], check=True)


def write_module(build: Path, include: Path) -> None:
    """A build.ninja shaped like FlashInfer's (jit/cpp_ext.py): depfile + deps = gcc."""
    build.mkdir(parents=True, exist_ok=True)
    (build / "op.c").write_text('#include "kernel.h"\nint op(int x) { return twice(x); }\n')
    (build / "build.ninja").write_text(
        "rule cc\n"
        f"  command = {GCC} -MD -MF $out.d -I{include} -c $in -o $out\n"
        "  depfile = $out.d\n"
        "  deps = gcc\n"
        "build op.o: cc op.c\n"
    )


def ninja_plan(build: Path) -> str:
    """What ninja would do now (dry run), as one string."""
    r = subprocess.run([NINJA, "-C", str(build), "-n"], capture_output=True, text=True, check=True)
    return r.stdout


def test_every_member_has_the_fixed_mtime_and_root_owner(tmp_path):
    site = make_site(tmp_path)
    tarball = tmp_path / "stage.tar.gz"
    gs.pack(site, tarball, 6)
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
    assert {m.name for m in members} >= {"pkg/data/include/kernel.h", "pkg/__init__.py"}
    assert {m.mtime for m in members} == {gs.STAGE_MTIME}
    assert {(m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, "root", "root")}
    assert time.time() - 86400 > gs.STAGE_MTIME  # before any cache this project could build


def test_the_same_files_pack_to_the_same_bytes(tmp_path):
    site = make_site(tmp_path)
    a, b = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    gs.pack(site, a, 6)
    time.sleep(1.1)  # a gzip header or member stamped with the clock would now differ
    for p in site.rglob("*"):
        os.utime(p)  # a second staging run writes the files again
    gs.pack(site, b, 6)
    assert a.read_bytes() == b.read_bytes()


@needs_tools
def test_a_module_built_against_one_staging_run_is_not_rebuilt_after_the_next(tmp_path):
    first = make_site(tmp_path / "run1")
    t1 = tmp_path / "t1.tar.gz"
    gs.pack(first, t1, 6)
    dest = tmp_path / "root" / "site"  # the same path on every lease, as /root/site
    unpack(t1, dest)
    build = tmp_path / "cache" / "op"
    write_module(build, dest / "pkg" / "data" / "include")
    subprocess.run([NINJA, "-C", str(build)], check=True, capture_output=True)
    assert "no work to do" in ninja_plan(build)

    # the next lease: a new staging run (files written later) unpacked over a fresh root
    time.sleep(1.1)
    second = make_site(tmp_path / "run2")
    t2 = tmp_path / "t2.tar.gz"
    gs.pack(second, t2, 6)
    unpack(t2, dest)
    assert "no work to do" in ninja_plan(build)

    # the control: headers stamped with the time they were staged (the tarball before the fix)
    for p in dest.rglob("*.h"):
        os.utime(p, (time.time() + 5, time.time() + 5))
    assert "op.o" in ninja_plan(build)
