"""The locked wheel set of the sglang-dflash[gpu] closure (the wheels uv2nix fetches for CPython
of the pinned version on x86_64 Linux) and the cache that holds them, shared by the linkage
test and its download step.

    python3 -m tests.nix.wheelcache          # download what is missing, sha256 from uv.lock

The cache is ~/.cache/sglang-dflash/wheels (or SGLANG_DFLASH_WHEELS), the one
scripts/gpu_stage.py fills; a wheel is only ever moved into it after its sha256 matched."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import urllib.request
from pathlib import Path

from sglang_dflash.pins import load_pins
from tests.nix.lockfile import Artifact, Lock
from tests.nix.nixtools import REPO

MIB = 1 << 20


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_DFLASH_WHEELS", Path.home() / ".cache/sglang-dflash/wheels"))


def locked_wheels() -> list[Artifact]:
    pins = load_pins()
    lock = Lock(REPO / "uv.lock", pins.python_package, f"{pins.python_package}.0")
    ranks = lock.supported_tags(40)
    want = [lock.best_wheel(p, ranks) for p in lock.closure("sglang-dflash", ["gpu"]).values()
            if p.get("source", {}).get("registry")]
    return [a for a in want if a is not None]


def filename(a: Artifact) -> str:
    return a.url.rsplit("/", 1)[1]


def missing(cache: Path | None = None) -> list[Artifact]:
    cache = cache or cache_dir()
    return [a for a in locked_wheels() if not (cache / filename(a)).is_file()]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def download(a: Artifact, cache: Path) -> Path:
    algo, _, want = a.hash.partition(":")
    assert algo == "sha256", a.hash
    dest = cache / filename(a)
    tmp = dest.with_name(dest.name + ".part")
    with urllib.request.urlopen(a.url, timeout=300) as r, tmp.open("wb") as f:
        shutil.copyfileobj(r, f, 4 * MIB)
    got = sha256_file(tmp)
    if got != want:
        tmp.unlink()
        raise SystemExit(f"{dest.name}: sha256 {got} != uv.lock's {want}")
    tmp.replace(dest)
    return dest


def main() -> int:
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    todo = missing(cache)
    print(f"{len(locked_wheels()) - len(todo)} locked wheels cached in {cache}, "
          f"{len(todo)} to download", flush=True)
    for i, a in enumerate(todo, 1):
        p = download(a, cache)
        print(f"[{i}/{len(todo)}] {p.name} ({p.stat().st_size // MIB} MiB)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
