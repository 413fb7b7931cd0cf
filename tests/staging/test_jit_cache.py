"""scripts/gpu_jit_cache.sh: JIT caches saved on one GPU lease and restored on the next."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
from pathlib import Path

from .helpers import REPO, load_stage

SCRIPT = REPO / "scripts" / "gpu_jit_cache.sh"


def run(home: Path, *args: str, inductor: Path | None = None) -> subprocess.CompletedProcess:
    """The script with ``home`` as $HOME and TorchInductor's cache at ``inductor`` (default: a
    directory beside ``home`` that does not exist, never this machine's own /tmp one)."""
    ind = inductor if inductor is not None else home.parent / f"{home.name}-no-inductor"
    env = dict(os.environ, HOME=str(home), TORCHINDUCTOR_CACHE_DIR=str(ind))
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def fake_caches(home: Path) -> dict[str, bytes]:
    files = {
        ".cache/flashinfer/0.6.15.post1/90a/cached_ops/sampling/sampling.so": b"ELF" * 1000,
        ".triton/cache/abc/kernel.cubin": b"cubin" * 100,
    }
    for rel, data in files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(data)
    return files


def test_save_then_restore_on_a_fresh_home(tmp_path):
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "out"
    for d in (old, new, out):
        d.mkdir()
    files = fake_caches(old)
    r = run(old, "save", str(out))
    assert r.returncode == 0, r.stderr
    assert "saved .cache/flashinfer .triton" in r.stdout  # tvm-ffi absent: skipped
    assert ".cache/tvm-ffi absent" in r.stdout  # every candidate's size, kept or not
    assert re.search(r"candidates: \.cache/flashinfer \d+ KiB", r.stdout)
    r = run(new, "restore", str(out / "jit-cache.tgz"))
    assert r.returncode == 0, r.stderr
    for rel, data in files.items():
        assert (new / rel).read_bytes() == data


def test_failures_are_one_line_and_nonzero(tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    home.mkdir()
    out.mkdir()
    r = run(home, "save", str(out))  # nothing to save
    assert r.returncode == 1 and "nothing to save" in r.stderr and len(r.stderr.splitlines()) == 1
    assert run(home, "frobnicate", "x").returncode == 2
    assert run(home, "save").returncode == 2
    assert run(home, "restore", str(out / "none.tgz")).returncode == 2

    # too large to come back from a device call (incompressible 17 MiB)
    big = home / ".cache" / "flashinfer" / "blob.so"
    big.parent.mkdir(parents=True)
    big.write_bytes(os.urandom(17 * 1024 * 1024))
    r = run(home, "save", str(out))
    assert r.returncode == 1 and "over the 16 MiB" in r.stderr
    assert not (out / "jit-cache.tgz").exists()
    big.unlink()

    fake_caches(home)
    assert run(home, "save", str(out)).returncode == 0
    tgz = out / "jit-cache.tgz"
    data = bytearray(tgz.read_bytes())
    data[-1] ^= 0xFF  # damaged in transit
    tgz.write_bytes(bytes(data))
    r = run(tmp_path / "fresh", "restore", str(tgz))
    assert r.returncode == 1 and "does not match" in r.stderr


def test_restore_refuses_entries_outside_the_caches(tmp_path):
    evil_src = tmp_path / "src"
    (evil_src / ".ssh").mkdir(parents=True)
    (evil_src / ".ssh" / "authorized_keys").write_text("x")
    tgz = tmp_path / "jit-cache.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(evil_src / ".ssh", arcname=".ssh")
    (tmp_path / "jit-cache.tgz.sha256").write_text(
        hashlib.sha256(tgz.read_bytes()).hexdigest() + "  jit-cache.tgz\n")
    home = tmp_path / "home"
    home.mkdir()
    r = run(home, "restore", str(tgz))
    assert r.returncode == 1 and "not a JIT cache" in r.stderr
    assert not (home / ".ssh").exists()


def test_too_big_together_keeps_flashinfer_alone(tmp_path):
    home, out, fresh = tmp_path / "home", tmp_path / "out", tmp_path / "fresh"
    for d in (home, out, fresh):
        d.mkdir()
    files = fake_caches(home)
    big = home / ".triton" / "cache" / "huge.bin"
    big.write_bytes(os.urandom(17 * 1024 * 1024))
    r = run(home, "save", str(out))
    assert r.returncode == 0, r.stderr
    assert "left out (over 16 MiB in either archive): .triton" in r.stderr
    assert not (out / "jit-cache-2.tgz").exists()  # over 16 MiB alone: no second archive
    assert run(fresh, "restore", str(out / "jit-cache.tgz")).returncode == 0
    fi = ".cache/flashinfer/0.6.15.post1/90a/cached_ops/sampling/sampling.so"
    assert (fresh / fi).read_bytes() == files[fi]
    assert not (fresh / ".triton").exists()


def test_what_does_not_fit_goes_to_a_second_archive_and_merge_joins_them(tmp_path):
    """2026-12-05 (H200): FlashInfer's and tvm-ffi's caches filled the 16 MiB archive and
    Triton's was left out. Now it goes to jit-cache-2.tgz; ``merge`` (here, before staging)
    joins archives, a later one's file winning, into one the staging call carries."""
    home, out, merged, fresh = (tmp_path / d for d in ("home", "out", "merged", "fresh"))
    for d in (home, out, merged, fresh):
        d.mkdir()
    files = fake_caches(home)
    (home / ".cache/flashinfer/big.bin").write_bytes(os.urandom(10 * 1024 * 1024))
    (home / ".triton/cache/big.bin").write_bytes(os.urandom(10 * 1024 * 1024))
    r = run(home, "save", str(out))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "saved .cache/flashinfer -> " in r.stdout and "saved .triton -> " in r.stdout
    older = tmp_path / "older"  # an older lease's archive: its flashinfer file is stale
    (older / "h" / ".cache/flashinfer/0.6.15.post1/90a/cached_ops/sampling").mkdir(parents=True)
    stale = older / "h" / ".cache/flashinfer/0.6.15.post1/90a/cached_ops/sampling/sampling.so"
    stale.write_bytes(b"old")
    (older / "h" / ".cache/flashinfer/only-old.so").write_bytes(b"kept")
    assert run(older / "h", "save", str(older)).returncode == 0
    r = run(home, "merge", str(merged), str(older / "jit-cache.tgz"), str(out / "jit-cache.tgz"),
            str(out / "jit-cache-2.tgz"))
    assert r.returncode == 0, r.stderr
    assert "merged 3 archive(s): .cache/flashinfer .triton" in r.stdout
    assert run(fresh, "restore", str(merged / "jit-cache.tgz")).returncode == 0
    for rel, data in files.items():
        assert (fresh / rel).read_bytes() == data  # the later archive's copy
    assert (fresh / ".cache/flashinfer/only-old.so").read_bytes() == b"kept"
    assert (fresh / ".triton/cache/big.bin").stat().st_size == 10 * 1024 * 1024
    # a bad archive stops the merge with one line, and nothing is written
    (out / "jit-cache-2.tgz.sha256").write_text("0" * 64 + "  jit-cache-2.tgz\n")
    (merged / "jit-cache.tgz").unlink()
    r = run(home, "merge", str(merged), str(out / "jit-cache.tgz"), str(out / "jit-cache-2.tgz"))
    assert r.returncode == 1 and "does not match" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (merged / "jit-cache.tgz").exists()
    assert run(home, "merge", str(merged)).returncode == 2  # no archive named


def test_stage_calls_carry_and_restore_the_cache(tmp_path):
    """gpu_stage --jit-cache: one more call carries the archive and restores it there."""
    import json as _json

    gs = load_stage()

    home, saved = tmp_path / "old-home", tmp_path / "saved"
    home.mkdir()
    saved.mkdir()
    files = fake_caches(home)
    assert run(home, "save", str(saved)).returncode == 0
    stage = tmp_path / ".stage"
    stage.mkdir()
    sha = gs.check_jit_cache(saved / "jit-cache.tgz")
    gs.take_jit_cache(saved / "jit-cache.tgz", sha, stage)
    calls = gs.device_calls(["p.part-00"], stage_rel=".stage", jit_cache=True)
    last = calls[-1]
    assert last["carry"] == [".stage/jit-cache.tgz", ".stage/jit-cache.tgz.sha256"]
    # replay it the way the device sees it: the repo's scripts plus the carried files
    device, new_home = tmp_path / "device", tmp_path / "new-home"
    (device / "scripts").mkdir(parents=True)
    (device / "scripts" / "gpu_jit_cache.sh").write_bytes(SCRIPT.read_bytes())
    (device / ".stage").mkdir()
    for rel in last["carry"]:
        (device / rel).write_bytes((tmp_path / rel).read_bytes())
    new_home.mkdir()
    r = subprocess.run(["bash", "-c", last["command"]], cwd=device, capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, HOME=str(new_home)))
    assert r.returncode == 0, r.stderr
    for rel, data in files.items():
        assert (new_home / rel).read_bytes() == data
    assert _json.dumps(calls)  # plain data, as calls.json holds it

    bad = saved / "jit-cache.tgz.sha256"
    bad.write_text("0" * 64 + "  jit-cache.tgz\n")
    try:
        gs.check_jit_cache(saved / "jit-cache.tgz")
    except gs.StageError as e:
        assert "does not match" in str(e)
    else:
        raise AssertionError("a wrong checksum was accepted")


def test_the_cache_rides_with_the_last_part_when_both_fit_one_call():
    """§27 chained the restore onto the last part's call by hand (part 21 MB + cache 17 MB):
    one call fewer, each costing device time while the machine waits. gpu_stage does it when
    the two fit one call beside the working tree."""
    gs = load_stage()
    mib = gs.MIB
    calls = gs.device_calls(["p.part-00", "p.part-01"], jit_cache=True, cache_with_last=True)
    assert len(calls) == 2
    last = calls[-1]
    assert last["carry"] == [".stage/p.part-01", ".stage/SHA256SUMS", ".stage/jit-cache.tgz",
                             ".stage/jit-cache.tgz.sha256"]
    unstage = last["command"].index("gpu_unstage.sh")
    assert last["command"].index("gpu_jit_cache.sh restore .stage/jit-cache.tgz") > unstage
    assert len(gs.device_calls(["p.part-00"], jit_cache=True)) == 2  # apart, as before
    assert gs.fits_one_call(21 * mib + 17 * mib, 7 * mib)
    assert not gs.fits_one_call(60 * mib + 17 * mib, 7 * mib)


def test_inductor_and_ptx_caches_travel_and_go_back_where_torch_looks(tmp_path):
    """TorchInductor's cache lives outside $HOME (/tmp/torchinductor_<user>): it travels as
    .cache/torchinductor and is put back at $TORCHINDUCTOR_CACHE_DIR; CUDA's PTX cache is
    under $HOME (.nv/ComputeCache)."""
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "out"
    for d in (old, new, out):
        d.mkdir()
    fake_caches(old)
    ind_old, ind_new = tmp_path / "ind-old", tmp_path / "ind-new"
    (ind_old / "fxgraph" / "ab").mkdir(parents=True)
    (ind_old / "fxgraph" / "ab" / "entry").write_bytes(b"graph" * 50)
    (old / ".nv" / "ComputeCache" / "7").mkdir(parents=True)
    (old / ".nv" / "ComputeCache" / "7" / "sass").write_bytes(b"sass" * 50)
    r = run(old, "save", str(out), inductor=ind_old)
    assert r.returncode == 0, r.stderr
    assert "saved .cache/flashinfer .triton .cache/torchinductor .nv/ComputeCache" in r.stdout
    with tarfile.open(out / "jit-cache.tgz") as tf:
        names = tf.getnames()
    assert ".cache/torchinductor/fxgraph/ab/entry" in names
    assert not any("ind-old" in n for n in names)
    r = run(new, "restore", str(out / "jit-cache.tgz"), inductor=ind_new)
    assert r.returncode == 0, r.stderr
    assert (ind_new / "fxgraph" / "ab" / "entry").read_bytes() == b"graph" * 50
    assert not (new / ".cache" / "torchinductor").exists()
    assert (new / ".nv" / "ComputeCache" / "7" / "sass").read_bytes() == b"sass" * 50



def test_a_cache_too_big_alone_still_saves_what_the_lease_added(tmp_path):
    """2026-12-05 (§29): FlashInfer's cache (51 MB) was over 16 MiB alone and left out, so the
    modules the lease compiled for a new head size were compiled again on the next machine.
    Now the files newer than the restore's stamp go to jit-cache-new.tgz, which merges."""
    import time

    home, out, first, merged, fresh = (tmp_path / d for d in
                                       ("home", "out", "first", "merged", "fresh"))
    for d in (home, out, first, merged, fresh):
        d.mkdir()
    fake_caches(first)
    assert run(first, "save", str(out)).returncode == 0
    (out / "jit-cache.tgz").rename(tmp_path / "old.tgz")
    (out / "jit-cache.tgz.sha256").rename(tmp_path / "old.tgz.sha256")
    (tmp_path / "old.tgz.sha256").write_text(
        (tmp_path / "old.tgz.sha256").read_text().replace("jit-cache.tgz", "old.tgz"))
    assert run(home, "restore", str(tmp_path / "old.tgz")).returncode == 0
    # the restored FlashInfer cache is big (older files); the lease adds one small module
    big = home / ".cache/flashinfer/0.6.15.post1/90a/cached_ops/old/big.so"
    big.parent.mkdir(parents=True)
    big.write_bytes(os.urandom(17 * 1024 * 1024))
    os.utime(big, (time.time() - 3600, time.time() - 3600))  # as restored: older than the stamp
    time.sleep(1.1)
    added = home / ".cache/flashinfer/0.6.15.post1/90a/cached_ops/hd64/new.so"
    added.parent.mkdir(parents=True)
    added.write_bytes(b"NEW" * 100)
    r = run(home, "save", str(out))
    assert r.returncode == 0, r.stderr
    assert "left out (over 16 MiB in either archive): .cache/flashinfer" in r.stderr
    assert "saved what this lease added to .cache/flashinfer (1 files)" in r.stdout
    with tarfile.open(out / "jit-cache-new.tgz") as t:
        assert t.getnames() == [str(added.relative_to(home))]
    r = run(home, "merge", str(merged), str(tmp_path / "old.tgz"), str(out / "jit-cache.tgz"),
            str(out / "jit-cache-new.tgz"))
    assert r.returncode == 0, r.stderr
    assert run(fresh, "restore", str(merged / "jit-cache.tgz")).returncode == 0
    assert (fresh / added.relative_to(home)).read_bytes() == b"NEW" * 100
    # without a restore's stamp (a machine that restored nothing) there is no such archive
    (home / ".cache/sglang-dflash-jit-restored").unlink()
    (out / "jit-cache-new.tgz").unlink()
    assert run(home, "save", str(out)).returncode == 0
    assert not (out / "jit-cache-new.tgz").exists()
