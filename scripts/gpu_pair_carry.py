#!/usr/bin/env python3
"""Carry a trained real-drafter pair to a later GPU lease instead of training it again.

``real_drafter.train`` takes ~390 s of a lease's 1,800 (gpu-results.md §28/§29). A lease that
only serves the pair can bring the weights of an earlier one (brought back to this machine in
15 MiB parts, §29 call 8) in two staging calls instead. Weights are never committed: the parts
live in the ignored ``.stage-pair/`` and travel as the device tool's ``carry``.

    python3 scripts/gpu_pair_carry.py --pair DIR [--out .stage-pair] [--part-mib 48]   # repo root

checks every file the pair's ``report.json`` names against its sha256 (a pair whose weights are
not the report's is refused: the served figures would name the wrong pair), packs the pair
(target/, draft/, report.json, prompts.jsonl) into a gzip tarball split into parts, and writes
``SHA256SUMS`` (the parts), ``pair.sha256`` (the report's files, ``sha256sum -c`` format) and
``calls.json``: one call per part, each checking its part on arrival; the last reassembles the
pair into ``--dest`` (default /root/pair) and checks the report's sha256 there. Stdlib only; every
failure is one line on stderr and exit status 1 (bad data) or 2 (usage).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

# what a call may carry beside the working tree is 64 MiB; the tree itself takes a few
PART_MIB = 48
MEMBERS = ("target", "draft", "report.json", "prompts.jsonl")
PART_PREFIX = "pair.tgz.part-"


class CarryError(Exception):
    """A one-line reason the pair cannot be carried."""


def checked_files(pair: Path) -> dict[str, str]:
    """The report's ``sha256`` map ({path in the pair: digest}) after checking every file
    against it; a CarryError names the first that is missing or differs."""
    report = pair / "report.json"
    try:
        sums = json.loads(report.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CarryError(f"{report}: not a real_drafter report with sha256 ({exc})") from None
    if not isinstance(sums, dict) or not sums:
        raise CarryError(f"{report}: its sha256 names no files")
    for rel, want in sums.items():
        path = pair / rel
        if not path.is_file():
            raise CarryError(f"{path}: missing (the report names it)")
        with path.open("rb") as f:
            got = hashlib.file_digest(f, "sha256").hexdigest()
        if got != want:
            raise CarryError(f"{path}: sha256 {got[:12]} is not the report's {str(want)[:12]}")
    return dict(sums)


def pack(pair: Path) -> bytes:
    """The pair as a gzip tarball, members in a fixed order under ``pair/`` (what the device
    unpacks into /root)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in MEMBERS:
            path = pair / name
            if not path.exists():
                raise CarryError(f"{path}: missing (a pair has {', '.join(MEMBERS)})")
            tar.add(path, arcname=f"pair/{name}", recursive=True,
                    filter=lambda ti: ti if not ti.name.endswith(".pyc") else None)
    return buf.getvalue()


def split(data: bytes, part_bytes: int) -> list[bytes]:
    return [data[i:i + part_bytes] for i in range(0, len(data), part_bytes)] or [b""]


def device_calls(parts: list[str], stage_rel: str, remote: str, dest: str) -> list[dict]:
    """One call per part (checked on arrival); the last reassembles the pair into ``dest`` and
    checks the report's sha256 there."""
    calls = []
    parent = str(Path(dest).parent)
    for i, part in enumerate(parts):
        # the first call empties the landing dir: a stale part of an earlier, longer carry
        # would otherwise join the reassembly
        fresh = f"rm -rf {remote}; " if i == 0 else ""
        cmd = (f"set -eo pipefail; {fresh}mkdir -p {remote};"
               f" cp {stage_rel}/{part} {stage_rel}/SHA256SUMS {remote}/;"
               f" (cd {remote} && grep -F ' {part}' SHA256SUMS | sha256sum -c --quiet -);"
               f" echo 'pair part {i + 1}/{len(parts)} ok'")
        carry = [f"{stage_rel}/{part}", f"{stage_rel}/SHA256SUMS"]
        if i == len(parts) - 1:
            cmd += (f"; cp {stage_rel}/pair.sha256 {remote}/; mkdir -p {parent}"
                    f"; rm -rf {parent}/pair.unpack && mkdir {parent}/pair.unpack"
                    f"; cat {remote}/{PART_PREFIX}* | tar -xzf - -C {parent}/pair.unpack"
                    f"; rm -rf {dest} && mv {parent}/pair.unpack/pair {dest}"
                    f"; rmdir {parent}/pair.unpack"
                    f"; (cd {dest} && sha256sum -c --quiet {remote}/pair.sha256)"
                    f"; echo 'pair ok: {dest} (the report sha256 checked)'")
            carry.append(f"{stage_rel}/pair.sha256")
        calls.append({"command": cmd, "carry": carry})
    return calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", type=Path, required=True, help="a real_drafter.train --out")
    ap.add_argument("--out", type=Path, default=Path(".stage-pair"))
    ap.add_argument("--part-mib", type=int, default=PART_MIB)
    ap.add_argument("--dest", default="/root/pair", help="where the device unpacks the pair")
    ap.add_argument("--remote", default="/root/pair-parts", help="where the parts land")
    args = ap.parse_args(argv)
    if args.out.is_absolute():
        try:
            args.out = args.out.relative_to(Path.cwd())
        except ValueError:
            print(f"gpu_pair_carry: --out {args.out}: must be inside the repository (run from its "
                  "root; the device tool carries working-tree paths)", file=sys.stderr)
            return 2
    if not 1 <= args.part_mib <= 62:
        print(f"gpu_pair_carry: --part-mib {args.part_mib}: 1..62 (a call carries 64 MiB)",
              file=sys.stderr)
        return 2
    try:
        sums = checked_files(args.pair)
        data = pack(args.pair)
    except CarryError as exc:
        print(f"gpu_pair_carry: {exc}", file=sys.stderr)
        return 1
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    chunks = split(data, args.part_mib * 1024 * 1024)
    names = [f"{PART_PREFIX}{i:02d}" for i in range(len(chunks))]
    lines = []
    for name, chunk in zip(names, chunks, strict=True):
        (args.out / name).write_bytes(chunk)
        lines.append(f"{hashlib.sha256(chunk).hexdigest()}  {name}\n")
    (args.out / "SHA256SUMS").write_text("".join(lines))
    (args.out / "pair.sha256").write_text("".join(f"{d}  {p}\n" for p, d in sums.items()))
    stage_rel = args.out.as_posix()
    calls = device_calls(names, stage_rel, args.remote, args.dest)
    (args.out / "calls.json").write_text(json.dumps(calls, indent=1) + "\n")
    print(f"gpu_pair_carry: {args.pair} -> {args.out}: {len(names)} part(s), "
          f"{len(data) / 1048576:.1f} MiB, {len(sums)} files checked against the report; "
          f"{args.out}/calls.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
