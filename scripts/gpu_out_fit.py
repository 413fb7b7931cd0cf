#!/usr/bin/env python3
"""Runs ON the GPU host, last in a call: make ``$OUT`` fit what the device tool brings back.

The tool returns at most 8 files a call, 16 MiB each, 64 MiB together, two folders deep; the rest
is listed as left out and lost with the machine (gpu-results.md §30: a call wrote 15 files and
lost a serve directory's tarball and the tie margin). This packs the smallest files into
``out-rest-<n>.tgz`` archives (each kept under 15 MiB) until at most 8 files remain, and names
in one line each what still cannot come back (a file over 16 MiB, or more than 64 MiB in all).

    python3 scripts/gpu_out_fit.py "$OUT" [--max-files 8] [--max-file-mib 16] [--max-total-mib 64]

Here: ``tar -xzf out-rest-0.tgz`` restores the packed files at their paths under ``$OUT``.
Stdlib only. Exit 0 when everything fits (or now does), 1 when something still cannot come
back (what, on stderr), 2 on usage.
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

MIB = 1024 * 1024
ARCHIVE_PREFIX = "out-rest-"
DEPTH = 3  # $OUT/a/b/file comes back: the file's path has at most three parts
NAME = re.compile(r"[A-Za-z0-9._-]+")  # the only names that come back


def returnable(path: str) -> bool:
    """Whether a file at this path under $OUT can come back at all (depth, names)."""
    parts = Path(path).parts
    return len(parts) <= DEPTH and all(NAME.fullmatch(x) for x in parts)


def plan(sizes: dict[str, int], max_files: int = 8,
         archive_room: int = 15 * MIB) -> tuple[tuple[str, ...], ...]:
    """Pure: which files go into which archive (relative paths, one tuple per archive). The
    smallest files are packed, at most ``archive_room`` bytes an archive (uncompressed: a bound
    on the archive), until at most ``max_files`` files remain; a file that could not come back
    as it is (too deep, an odd name) is always packed (alone when larger than an archive). The
    largest files stay as they are: they are the ones an archive could not hold."""
    deep = sorted(p for p in sizes if not returnable(p))
    flat = sorted((p for p in sizes if p not in deep), key=lambda p: (sizes[p], p))
    archives: list[list[str]] = []
    current: list[str] = []
    room = archive_room
    for path in deep + list(flat):
        must = path in deep
        if not must and len(flat) + len(archives) + (1 if current else 0) <= max_files:
            break
        big = sizes[path] > archive_room
        if big and not must:
            continue
        if current and (big or sizes[path] > room):
            archives.append(current)
            current, room = [], archive_room
        current.append(path)
        room -= sizes[path]
        if big:
            archives.append(current)
            current, room = [], archive_room
        if not must:
            flat.remove(path)
    if current:
        archives.append(current)
    return tuple(tuple(a) for a in archives)


def verdict(sizes: dict[str, int], max_files: int = 8, max_file: int = 16 * MIB,
            max_total: int = 64 * MIB) -> list[str]:
    """Pure: one line for each reason some of these files will not come back."""
    lost = [f"{p}: {sizes[p] / MIB:.1f} MiB, over the {max_file / MIB:.0f} MiB a file may have"
            for p in sorted(sizes) if sizes[p] > max_file]
    lost += [f"{p}: deeper than $OUT/a/b/file or a name beside [A-Za-z0-9._-]"
             for p in sorted(sizes) if not returnable(p)]
    if len(sizes) > max_files:
        lost.append(f"{len(sizes)} files, {max_files} come back (the rest are too big to pack)")
    total = sum(sizes.values())
    if total > max_total:
        lost.append(f"{total / MIB:.1f} MiB in all, over the {max_total / MIB:.0f} MiB that "
                    "come back together")
    return lost


def files_under(out: Path) -> dict[str, int]:
    """Every regular file under ``out`` (relative path -> size)."""
    return {p.relative_to(out).as_posix(): p.stat().st_size
            for p in sorted(out.rglob("*")) if p.is_file() and not p.is_symlink()}


def apply(out: Path, archives: tuple[tuple[str, ...], ...]) -> list[Path]:
    """Write the archives (paths relative to ``out``), then remove the packed files."""
    made = []
    n = 0
    for members in archives:
        while (out / f"{ARCHIVE_PREFIX}{n}.tgz").exists():
            n += 1
        name = out / f"{ARCHIVE_PREFIX}{n}.tgz"
        with tarfile.open(name, "w:gz", compresslevel=6) as tar:
            for rel in members:
                tar.add(out / rel, arcname=rel)
        for rel in members:
            (out / rel).unlink()
        made.append(name)
    for d in sorted((d for d in out.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-files", type=int, default=8)
    ap.add_argument("--max-file-mib", type=float, default=16)
    ap.add_argument("--max-total-mib", type=float, default=64)
    args = ap.parse_args(argv)
    if not args.out.is_dir():
        print(f"gpu_out_fit: {args.out}: not a directory", file=sys.stderr)
        return 2
    if args.max_files < 2:
        print("gpu_out_fit: --max-files must be at least 2", file=sys.stderr)
        return 2
    sizes = files_under(args.out)
    archives = plan(sizes, args.max_files, int(min(15, args.max_file_mib - 1) * MIB))
    made = apply(args.out, archives)
    after = files_under(args.out)
    print(f"gpu_out_fit: {len(sizes)} file(s) under {args.out}; "
          f"{sum(len(a) for a in archives)} packed into {len(made)} archive(s) "
          f"({', '.join(m.name for m in made) or 'none'}); {len(after)} left")
    lost = verdict(after, args.max_files, int(args.max_file_mib * MIB),
                   int(args.max_total_mib * MIB))
    for line in lost:
        print(f"gpu_out_fit: will not come back: {line}", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
