"""Linkage, the question autoPatchelfHook asks at build time, on the real locked wheel set:
every DT_NEEDED of every ELF file in the sglang-dflash[gpu] closure's wheels is satisfied by
the set itself (a DT_SONAME or file name in some wheel), by a library the fixup table
declares (pkgs/sglang-dflash/gpu-wheels.nix: `native.<pkg>.sonames`, `ignoreMissing`), by
the NVIDIA driver (`driverLibs`, /run/opengl-driver/lib) or by
the manylinux libraries uv2nix gives every manylinux wheel (glibc, gcc's runtime).
Each unsatisfied soname is named with its file.

The wheels are cached in ~/.cache/sglang-dflash/wheels (or SGLANG_DFLASH_WHEELS; the cache
scripts/gpu_stage.py fills); `python3 -m tests.nix.wheelcache` downloads the missing ones,
sha256-checked against uv.lock (.ci/run does). The test SKIPs, counting what is missing,
until the set is complete."""

from __future__ import annotations

import fnmatch
import struct
import zipfile
from pathlib import Path

import pytest

from sglang_dflash.pins import load_pins
from tests.nix import wheelcache
from tests.nix.nixtools import REPO, nix_eval, nix_literal

PINS = load_pins()
# What reaches autoPatchelf without a fixup. uv2nix (lib/build.nix) puts
# `pythonManylinuxPackages.manylinux2014` into every manylinux wheel's buildInputs (nixpkgs
# pkgs/development/interpreters/python/manylinux/default.nix: glibc, the lib output of
# stdenv.cc.cc, …), and autoPatchelf searches the whole lib/ of each buildInput; so a
# soname is satisfied when it is a file of one of those lib/ directories. soname -> provider:
MANYLINUX = {
    **dict.fromkeys(["libc.so.6", "libm.so.6", "libmvec.so.1", "libdl.so.2", "libpthread.so.0",
                     "librt.so.1", "libutil.so.1", "ld-linux-x86-64.so.2", "libanl.so.1",
                     "libresolv.so.2"], "glibc (lib/)"),
    **dict.fromkeys(["libstdc++.so.6", "libgcc_s.so.1", "libatomic.so.1", "libgomp.so.1",
                     "libgomp.so.1.0.0"], "stdenv.cc.cc lib output (gcc's lib/)"),
}
# (zlib is declared per wheel in the table: nixpkgs' list could not be read at the locked rev.)
# (libgomp.so.1.0.0: numba's omppool names the real file, not the libgomp.so.1 link; both are
# in gcc's lib/.)


def elf_dynamic(data: bytes) -> tuple[list[str], str | None] | None:
    """(DT_NEEDED list, DT_SONAME) of a 64-bit little-endian ELF, or None if not one."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _f, p_off, p_vaddr, _pa, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_off, p_filesz))
        elif p_type == 2:
            dynamic = (p_off, p_filesz)
    if dynamic is None:
        return [], None
    entries, strtab = [], None
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == 5:
            strtab = val
        entries.append((tag, val))
    base = next(o + strtab - v for v, o, s in loads if v <= strtab < v + s)

    def string(at: int) -> str:
        return data[base + at: data.index(b"\0", base + at)].decode()

    needed = [string(v) for t, v in entries if t == 1]
    soname = next((string(v) for t, v in entries if t == 14), None)
    return needed, soname


def wheel_set() -> list[Path]:
    cache = wheelcache.cache_dir()
    names = [wheelcache.filename(a) for a in wheelcache.locked_wheels()]
    missing = [n for n in names if not (cache / n).is_file()]
    if missing:
        pytest.skip(f"{len(missing)} of {len(names)} locked wheels are not cached in {cache} "
                    f"(e.g. {missing[0]}); `python3 -m tests.nix.wheelcache` downloads them")
    return [cache / n for n in names]


def test_elf_reader_on_a_system_library():
    got = elf_dynamic(Path("/bin/sh").resolve().read_bytes())
    assert got is not None and "libc.so.6" in got[0]


def test_every_needed_library_is_satisfied():
    table = nix_eval(f"import {nix_literal(REPO / 'pkgs/sglang-dflash/gpu-wheels.nix')}")
    declared = set(table["driverLibs"])
    for entry in table["native"].values():
        declared |= set(entry.get("sonames", []))
        if entry.get("python"):  # the interpreter's shared library (fixups.nix: final.python)
            declared.add(f"libpython{PINS.python_package}.so.1.0")
    globs = [g for e in table["gpu"].values() for g in e.get("ignoreMissing", [])]
    provided: set[str] = set()
    needs: list[tuple[str, str, str]] = []
    for whl in wheel_set():
        with zipfile.ZipFile(whl) as z:
            for info in z.infolist():
                base = info.filename.rsplit("/", 1)[-1]
                if ".so" not in base:
                    continue
                dyn = elf_dynamic(z.read(info))
                if dyn is None:
                    continue
                provided.add(base)
                if dyn[1]:
                    provided.add(dyn[1])
                needs += [(whl.name, info.filename, n) for n in dyn[0]]
    unsatisfied = sorted(
        f"{soname} (needed by {member} in {wheel})" for wheel, member, soname in needs
        if soname not in provided and soname not in declared and soname not in MANYLINUX
        and not any(fnmatch.fnmatch(soname, g) for g in globs))
    assert not unsatisfied, f"{len(unsatisfied)} unsatisfied:\n" + "\n".join(unsatisfied)
