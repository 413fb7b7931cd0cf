"""scripts/gpu_out_fit.py: $OUT made to fit what the device tool brings back (8 files, 16 MiB
each, 64 MiB together, two folders deep; gpu-results.md §30 lost 7 files to the count).

The script runs as it would on the device: a real directory, real archives, unpacked again."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from .helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_out_fit.py"
MIB = 1024 * 1024


def _module():
    spec = importlib.util.spec_from_file_location("gpu_out_fit", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_out_fit"] = mod
    spec.loader.exec_module(mod)
    return mod


fit = _module()


def _write(root: Path, files: dict[str, int]) -> dict[str, bytes]:
    out = {}
    for rel, size in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        (root / rel).write_bytes(data)
        out[rel] = data
    return out


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *args],
                          capture_output=True, text=True, check=False)


def _unpacked(out: Path, tmp: Path) -> dict[str, bytes]:
    """What the receiving side holds after `tar -xzf` of every archive."""
    got = tmp / "got"
    got.mkdir()
    for f in sorted(out.iterdir()):
        if f.name.startswith(fit.ARCHIVE_PREFIX):
            with tarfile.open(f) as tar:
                tar.extractall(got, filter="data")
    files = {p.relative_to(got).as_posix(): p.read_bytes() for p in got.rglob("*") if p.is_file()}
    for p in out.rglob("*"):
        if p.is_file() and not p.name.startswith(fit.ARCHIVE_PREFIX):
            files[p.relative_to(out).as_posix()] = p.read_bytes()
    return files


def test_fifteen_files_become_eight_and_nothing_is_lost(tmp_path: Path) -> None:
    """§30's call 8: tarballs, logs and JSON side by side, 15 files."""
    out = tmp_path / "out"
    files = {"sB.tgz": 2 * MIB, "tie.json": 40_000, "tie.log": 3_000, "jit.log": 500,
             "jit-cache.tgz": 12 * MIB, "jit-cache.tgz.sha256": 80,
             "jit-cache-new.tgz": 14 * MIB, "jit-cache-new.tgz.sha256": 84,
             "sB.log": 2_000, "hostlens.txt": 10, "grid1.log": 1_000, "results.json": 60_000,
             "adaptive-grid.json": 6_000, "continuations.json": 65_000,
             "adaptive-grid-files.tgz": 72_000}
    data = _write(out, files)
    res = _run(out)
    assert res.returncode == 0, res.stderr
    left = [p for p in out.rglob("*") if p.is_file()]
    assert len(left) <= 8
    assert (out / "jit-cache.tgz").exists() and (out / "jit-cache-new.tgz").exists()  # too big
    assert _unpacked(out, tmp_path) == data
    assert "15 file(s)" in res.stdout and f"{len(left)} left" in res.stdout


def test_what_fits_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = _write(out, {f"f{i}.json": 100 for i in range(8)})
    res = _run(out)
    assert res.returncode == 0 and "0 packed into 0 archive(s)" in res.stdout
    assert {p.name for p in out.iterdir()} == set(data)


def test_too_deep_and_odd_names_are_packed_even_when_few(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = _write(out, {"a/b/c/deep.json": 100, "a/b/ok.json": 100, "odd name.txt": 10})
    res = _run(out)
    assert res.returncode == 0, res.stderr
    assert (out / "a" / "b" / "ok.json").exists()
    assert not (out / "a" / "b" / "c").exists() and not (out / "odd name.txt").exists()
    assert _unpacked(out, tmp_path) == data


def test_what_cannot_come_back_is_named_and_fails(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write(out, {"big.bin": 3 * MIB, "x.json": 10})
    res = _run(out, "--max-file-mib", "2")
    assert res.returncode == 1
    assert "will not come back: big.bin: 3.0 MiB, over the 2 MiB" in res.stderr
    # nine files each too big for an archive's room: the count is named
    out2 = tmp_path / "out2"
    _write(out2, {f"p{i}.bin": 2 * MIB for i in range(9)})
    res = _run(out2, "--max-file-mib", "3")
    assert res.returncode == 1 and "9 files, 8 come back" in res.stderr


def test_bad_usage_is_one_line(tmp_path: Path) -> None:
    res = _run(tmp_path / "missing")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "not a directory" in res.stderr
    res = _run(tmp_path, "--max-files", "1")
    assert res.returncode == 2 and "at least 2" in res.stderr


def test_plan_packs_the_smallest_and_leaves_what_no_archive_holds() -> None:
    sizes = {"a": 1, "b": 2, "c": 3, "d": 10, "e": 11, "f": 12}
    assert fit.plan(sizes, max_files=3, archive_room=6) == (("a", "b", "c"),)
    assert fit.verdict({"d": 10, "e": 11, "f": 12, "out-rest-0.tgz": 6}, max_files=3,
                       max_file=100, max_total=1000) == ["4 files, 3 come back (the rest are "
                                                         "too big to pack)"]
    # a second archive opens when the first is full
    assert fit.plan({"a": 4, "b": 4, "c": 4, "d": 4}, max_files=2, archive_room=8) == (
        ("a", "b"), ("c", "d"))
