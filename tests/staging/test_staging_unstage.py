"""gpu_unstage.sh end to end: a small real tarball, split by gpu_stage.py, real bash."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .helpers import UNSTAGE_SH, load_stage

gs = load_stage()


def _make_site(root: Path, payload: bytes) -> Path:
    site = root / "site"
    (site / "pkg" / "sub").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    (site / "pkg" / "sub" / "blob.bin").write_bytes(payload)
    tool = site / "pkg" / "tool"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    return site


def _stage(tmp: Path, payload: bytes, part_size: int = 64 * 1024) -> tuple[Path, list[Path]]:
    site = _make_site(tmp / "src", payload)
    out = tmp / "stage"
    out.mkdir()
    tarball = out / gs.TARBALL
    gs.pack(site, tarball, 6)
    parts = gs.split(tarball, part_size)
    gs.write_sums(out, [tarball, *parts])
    tarball.unlink()
    return out, parts


def _unstage(parts_dir: Path, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(UNSTAGE_SH), str(parts_dir), str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def staged(tmp_path):
    payload = os.urandom(200 * 1024)  # incompressible: several 64 KiB parts
    out, parts = _stage(tmp_path, payload)
    return out, parts, payload


def test_reassembles_verifies_and_unpacks(staged, tmp_path):
    out, parts, payload = staged
    assert len(parts) >= 3
    dest = tmp_path / "dest"
    r = _unstage(out, dest)
    assert r.returncode == 0, r.stderr
    unpacked, compiled = r.stdout.strip().splitlines()
    assert "unpacked" in unpacked and "gpu_bytecompile:" in compiled and "1 .pyc files" in compiled
    assert list((dest / "pkg" / "__pycache__").glob("__init__.*.pyc"))  # imports skip compiling
    assert (dest / "pkg" / "sub" / "blob.bin").read_bytes() == payload
    assert (dest / "pkg" / "__init__.py").read_text() == "X = 1\n"
    assert os.access(dest / "pkg" / "tool", os.X_OK)
    assert not (out / gs.TARBALL).exists()  # the reassembled tarball is not left behind


def test_second_run_is_a_no_op(staged, tmp_path):
    out, _, _ = staged
    dest = tmp_path / "dest"
    assert _unstage(out, dest).returncode == 0
    (dest / "pkg" / "marker").write_text("kept")  # proves nothing was re-extracted
    r = _unstage(out, dest)
    assert r.returncode == 0 and "nothing to do" in r.stdout
    assert (dest / "pkg" / "marker").exists()


def test_a_new_tarball_replaces_the_old_dest(staged, tmp_path):
    out, _, _ = staged
    dest = tmp_path / "dest"
    assert _unstage(out, dest).returncode == 0
    (dest / "stale.py").write_text("old")
    out2, _ = _stage(tmp_path / "v2", os.urandom(1000))
    r = _unstage(out2, dest)
    assert r.returncode == 0, r.stderr
    assert not (dest / "stale.py").exists()
    assert (dest / "pkg" / "sub" / "blob.bin").stat().st_size == 1000


def test_corrupted_part_fails_with_one_line_and_leaves_dest_alone(staged, tmp_path):
    out, parts, _ = staged
    dest = tmp_path / "dest"
    data = bytearray(parts[1].read_bytes())
    data[100] ^= 0xFF
    parts[1].write_bytes(bytes(data))
    r = _unstage(out, dest)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and parts[1].name in lines[0] and "corrupt" in lines[0]
    assert not dest.exists()


def test_consistently_rewritten_parts_still_fail_on_the_whole_tarball_hash(staged, tmp_path):
    """A part swapped for another part with its SHA256SUMS line updated: the tarball line
    catches it."""
    out, parts, _ = staged
    sums = out / "SHA256SUMS"
    parts[0].write_bytes(parts[1].read_bytes())
    text = sums.read_text().splitlines()
    fixed = [
        (f"{gs.sha256_file(parts[0])}  {parts[0].name}" if ln.endswith(parts[0].name) else ln)
        for ln in text
    ]
    sums.write_text("\n".join(fixed) + "\n")
    r = _unstage(out, tmp_path / "dest")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "reassembled" in r.stderr


def test_missing_part_names_it(staged, tmp_path):
    out, parts, _ = staged
    parts[-1].unlink()
    r = _unstage(out, tmp_path / "dest")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and parts[-1].name in r.stderr


def test_missing_sums_and_usage_errors(tmp_path):
    r = _unstage(tmp_path, tmp_path / "dest")
    assert r.returncode == 1 and "SHA256SUMS" in r.stderr
    r = subprocess.run(["bash", str(UNSTAGE_SH)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("gpu_unstage: usage")
    r = _unstage(tmp_path / "nope", tmp_path / "dest")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_truncated_tarball_fails_to_unpack_with_one_line(tmp_path):
    """Hashes that match a broken tarball (a bad stage) still give one line, not a dump."""
    out = tmp_path / "stage"
    out.mkdir()
    tarball = out / gs.TARBALL
    site = _make_site(tmp_path / "src", os.urandom(50_000))
    gs.pack(site, tarball, 6)
    tarball.write_bytes(tarball.read_bytes()[:20_000])
    parts = gs.split(tarball, 8_000)
    gs.write_sums(out, [tarball, *parts])
    tarball.unlink()
    r = _unstage(out, tmp_path / "dest")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "unpacking" in r.stderr
    assert not (tmp_path / "dest").exists()


def _device_copy(repo_copy: Path, out: Path, carry: list[str]) -> None:
    """What a `run` call sees: the tracked scripts plus the carried paths, nothing else."""
    (repo_copy / "scripts").mkdir(parents=True, exist_ok=True)
    for script in ("gpu_unstage.sh", "gpu_bytecompile.sh"):
        (repo_copy / "scripts" / script).write_bytes((UNSTAGE_SH.parent / script).read_bytes())
    for rel in carry:
        src = out.parent / rel
        (repo_copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo_copy / rel).write_bytes(src.read_bytes())


def _calls(out: Path, parts: list[Path], tmp: Path) -> list[dict]:
    return gs.device_calls(
        [p.name for p in parts],
        stage_rel=out.name,
        remote=str(tmp / "root-stage"),
        dest=str(tmp / "root-site"),
    )


def test_device_calls_replayed_one_by_one(staged, tmp_path):
    out, parts, payload = staged
    calls = _calls(out, parts, tmp_path)
    assert len(calls) == len(parts)
    # The last call compiles the host's torch tree: here a stand-in found first on the path.
    host = tmp_path / "host-site"
    (host / "torch").mkdir(parents=True)
    (host / "torch" / "__init__.py").write_text("")
    host_env = {**os.environ, "PYTHONPATH": str(host)}
    for i, call in enumerate(calls):
        assert len(call["command"]) < 2000 and len(call["carry"]) <= 8
        copy = tmp_path / f"call{i}"
        _device_copy(copy, out, call["carry"])
        r = subprocess.run(
            ["bash", "-c", call["command"]], cwd=copy, capture_output=True, text=True, timeout=60,
            env=host_env,
        )
        assert r.returncode == 0, r.stderr
        assert f"part {i + 1}/{len(parts)} ok" in r.stdout
    assert "unpacked" in r.stdout
    assert f"gpu_bytecompile: {host}: 1 .pyc files" in r.stdout
    assert (tmp_path / "root-site" / "pkg" / "sub" / "blob.bin").read_bytes() == payload


def test_device_call_with_a_damaged_part_fails(staged, tmp_path):
    out, parts, _ = staged
    call = _calls(out, parts, tmp_path)[0]
    copy = tmp_path / "call0"
    _device_copy(copy, out, call["carry"])
    carried = copy / call["carry"][0]
    carried.write_bytes(carried.read_bytes()[:-1])
    r = subprocess.run(
        ["bash", "-c", call["command"]], cwd=copy, capture_output=True, text=True, timeout=60
    )
    assert r.returncode != 0 and "ok" not in r.stdout


def test_real_stage_calls_fit_the_device_limits():
    """When a real staging run exists here (.stage/calls.json), its calls fit the tool."""
    stage = UNSTAGE_SH.parents[1] / ".stage"
    if not (stage / "calls.json").exists():
        pytest.skip("no real staging run in .stage/ (run scripts/gpu_stage.py)")
    for call in json.loads((stage / "calls.json").read_text()):
        assert len(call["command"]) < 2000 and len(call["carry"]) <= 8
        size = sum((stage.parent / c).stat().st_size for c in call["carry"])
        assert size <= 62 * 1024 * 1024, call["carry"]


BYTECOMPILE_SH = UNSTAGE_SH.parent / "gpu_bytecompile.sh"


def _bytecompile(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BYTECOMPILE_SH), *args], capture_output=True, text=True, timeout=120,
        env=env,
    )


def test_bytecompile_counts_what_does_not_compile_and_python_then_imports_the_pyc(tmp_path):
    tree = tmp_path / "tree"
    (tree / "good").mkdir(parents=True)
    (tree / "good" / "__init__.py").write_text("VALUE = 41 + 1\n")
    (tree / "py2_fixture.py").write_text("print 'python 2'\n")
    r = _bytecompile(str(tree))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and "1 .pyc files, 1 not compiled" in r.stdout
    # The source is gone, the .pyc is what Python imports from now on: it was really written.
    pyc = next((tree / "good" / "__pycache__").glob("__init__.*.pyc"))
    legacy = tree / "good.pyc"
    legacy.write_bytes(pyc.read_bytes())
    out = subprocess.run(
        ["python3", "-c", "import good; print(good.VALUE)"], cwd=tree, capture_output=True,
        text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert out.stdout.strip() == "42", out.stderr


def test_bytecompile_host_finds_the_tree_that_holds_torch(tmp_path):
    fake = tmp_path / "host-site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    r = _bytecompile("--host", env={**os.environ, "PYTHONPATH": str(fake)})
    assert r.returncode == 0, r.stderr
    assert f"gpu_bytecompile: {fake}:" in r.stdout


def test_bytecompile_bad_usage_is_one_line_and_exit_2(tmp_path):
    for args in ((), ("--nope",), (str(tmp_path / "missing"),)):
        r = _bytecompile(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
