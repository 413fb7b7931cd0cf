#!/usr/bin/env python3
"""Stage the pinned GPU stack for the H200 test host (no network there).

Reads uv.lock, selects the closure of this project's `gpu` extra for CPython 3.12 on
manylinux x86_64, leaves out what the host already has (its torch/triton and the CUDA
libraries its torch brings; any package on --host-packages unless pins.toml, a shipped
wheel's requirement or --ship needs the locked version) and the optional heavy wheels that
SGLang does not import at startup with the triton/flashinfer attention backends, downloads
each wheel (sha256 from the lock, cached), builds this project's wheel, unpacks everything
into ONE directory (applying overlays/patches/sglang-<ver>/*.patch to the unpacked sglang, as
the Nix overlay does), packs a gzip tarball and splits it into parts small enough to carry to
the device one call at a time. Standard library only. See docs/gpu-staging.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The requirement/marker/specifier reader is shared with `sglang-dflash check` (stdlib only).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from sglang_dflash.requirements import (
    Req,
    RequirementError,
    eval_marker,
    metadata_headers,
    normalize,
    requirements,
    satisfies,
)

PROJECT = "sglang-dflash"
EXTRA = "gpu"
TARBALL = "sglang-dflash-stage.tar.gz"
MIB = 1024 * 1024
# what one device call may carry beside the working tree: 64 MiB, 2 MiB to spare
CALL_ROOM = 62 * MIB
# Every file of the tarball gets this mtime (2026-01-01 UTC). FlashInfer JIT-builds its kernels
# with ninja (`deps = gcc`), which rebuilds a module whose headers are newer than its objects;
# with the staging time as the headers' mtime every restored JIT cache was older than its own
# headers, and each fresh card rebuilt every module (gpu-results §25: 259 s to the first server
# with the cache, 261 without; §38: 213 s). A fixed time before any cache was built keeps a
# restored cache valid, as the Nix store's mtime 1 does; it also makes the tarball reproducible.
STAGE_MTIME = 1_767_225_600

# The interpreter and platform of the H200 host (docs/gpu-staging.md, KINDS.md).
HOST_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "os_name": "posix",
}

# What the host image brings itself: our pins of these match it exactly, and shipping a
# second copy of torch's CUDA libraries on PYTHONPATH would shadow the ones it was built with.
# The Python bindings torch also needs (cuda-bindings, cuda-pathfinder) DO travel: cuda-python
# in the lock pins cuda-bindings~=13.4.4, and the host's version is not known to match.
HOST_ROOTS = ("torch", "triton")
HOST_LIBRARY = re.compile(r"nvidia-.*|cuda-toolkit")

# Optional heavy wheels not imported at startup with the triton/flashinfer attention backends
# (seen on the H200: shared/research/gpu-probe.md). Leaving one out disables only the feature
# named here. xgrammar is NOT optional: sglang/srt/server_args.py imports it through the
# function-call parsers (seen on the H200, 2026-12-02: "No module named 'xgrammar'").
OPTIONAL_HEAVY = {
    "tokenspeed-triton": "95 MB; Triton fork used only by tokenspeed-mla's MLA kernels",
    "nvidia-cutlass-dsl-libs-cu12": "88 MB; CuTe DSL runtime for CUDA 12 (host is CUDA 13)",
    "nvidia-cutlass-dsl-libs-cu13": "88 MB; CuTe DSL runtime (FA4/cute kernels, diffusion ops), "
    "imported lazily",
    "nvidia-nvvm": "75 MB; NVVM for the CuTe DSL / numba-cuda JIT, not used by triton attention",
    "tilelang": "50 MB; imported only by DSA (DeepSeek sparse attention) kernels",
    "nvidia-cuda-nvcc": "47 MB; the host has nvcc 13.0 (CUDA_HOME) for flashinfer's JIT",
    "z3-solver": "29 MB; a solver used by tilelang/helion autotuning only",
    "nvidia-mathdx": "23 MB; cuBLASDx/cuFFTDx headers for numba-cuda device code only",
}

FLASH_OPS_GLOB = "sgl_kernel/flash_ops*.so"
FLASH_OPS_REASON = (
    "FA3 attention backend (imported only by sgl_kernel/flash_attn.py); 1.1 GB unpacked. "
    "With it left out --attention-backend fa3 is unavailable and `check` reports the file "
    "missing against sglang-kernel's RECORD"
)


# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class Wheel:
    filename: str
    url: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Dep:
    name: str
    version: str | None = None
    extras: tuple[str, ...] = ()
    marker: str | None = None


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    deps: tuple[Dep, ...]
    optional: dict[str, tuple[Dep, ...]]
    wheels: tuple[Wheel, ...]
    source: dict


@dataclass(frozen=True)
class Target:
    """The interpreter/platform a wheel must install on."""

    py_major: int = 3
    py_minor: int = 12
    max_glibc_minor: int = 39  # manylinux_2_N with N <= this
    arch: str = "x86_64"


@dataclass
class Selected:
    name: str
    version: str
    wheel: Wheel
    via: list[str] = field(default_factory=list)


@dataclass
class Excluded:
    name: str
    version: str
    reason: str
    size: int | None  # bytes of the wheel we would have shipped, when one fits


@dataclass
class HostDecision:
    """Why a locked package that the host also has travels anyway, or is left to the host."""

    name: str
    version: str  # uv.lock's
    action: str  # "host" (not shipped, the host's copy is used) or "ship"
    reason: str


@dataclass
class Plan:
    selected: list[Selected]
    excluded: list[Excluded]
    host_decisions: list[HostDecision] = field(default_factory=list)


@dataclass(frozen=True)
class HostPackages:
    """The host image's distributions (normalised names) and the versions known of them."""

    names: frozenset[str]
    versions: dict[str, str]

    def judge(self, req: Req) -> str | None:
        """Why the host's copy cannot serve `req`, or None when it can (or may).

        An exact pin needs a known host version that satisfies it; any other specifier fails
        only when the host's version is known and outside it.
        """
        have = self.versions.get(req.name)
        if have is None:
            return f"exact pin {req.spec} (host version unknown)" if req.exact else None
        if satisfies(have, req.spec):
            return None
        kind = "exact pin" if req.exact else "requires"
        return f"{kind} {req.spec} (host has {have})"


class StageError(Exception):
    """A one-line reason the staging cannot go on."""


# ---------------------------------------------------------------- names, markers, tags


def wheel_tags(filename: str) -> tuple[list[str], list[str], list[str]]:
    """(python tags, abi tags, platform tags) of a wheel file name."""
    parts = filename[: -len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        raise StageError(f"not a wheel file name: {filename}")
    py, abi, plat = parts[-3:]
    return py.split("."), abi.split("."), plat.split(".")


def platform_rank(tag: str, target: Target) -> int | None:
    """Higher is more specific; None when the tag cannot install on `target`."""
    if tag == "any":
        return 0
    legacy = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
    m = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", tag)
    if m:
        minor, arch = legacy[m.group(1)], m.group(2)
    else:
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
        if not m:
            return 1 if tag == f"linux_{target.arch}" else None
        if int(m.group(1)) != 2:
            return None
        minor, arch = int(m.group(2)), m.group(3)
    if arch != target.arch or minor > target.max_glibc_minor:
        return None
    return 10 + minor


def interpreter_rank(py: str, abi: str, target: Target) -> int | None:
    """Rank of a (python tag, abi tag) pair for CPython `target`; None if incompatible."""
    cp = f"cp{target.py_major}{target.py_minor}"
    if py == cp and abi == cp:
        return 100
    m = re.fullmatch(r"cp(\d)(\d+)", py)
    if m and abi == "abi3" and int(m.group(1)) == target.py_major:
        return 50 + int(m.group(2)) if int(m.group(2)) <= target.py_minor else None
    if abi != "none":
        return None
    if py == cp:
        return 40
    m = re.fullmatch(r"py(\d)(\d*)", py)
    if m and int(m.group(1)) == target.py_major:
        if not m.group(2):
            return 10
        return 20 + int(m.group(2)) if int(m.group(2)) <= target.py_minor else None
    return None


def wheel_rank(filename: str, target: Target) -> tuple[int, int] | None:
    """Best (interpreter, platform) rank over the wheel's compressed tag sets."""
    pys, abis, plats = wheel_tags(filename)
    irank = [r for p in pys for a in abis if (r := interpreter_rank(p, a, target)) is not None]
    prank = [r for p in plats if (r := platform_rank(p, target)) is not None]
    if not irank or not prank:
        return None
    return max(irank), max(prank)


def pick_wheel(pkg: Package, target: Target) -> Wheel | None:
    ranked = [(r, w) for w in pkg.wheels if (r := wheel_rank(w.filename, target)) is not None]
    return max(ranked, key=lambda rw: rw[0])[1] if ranked else None


# ---------------------------------------------------------------- host list, Requires-Dist


def parse_host_packages(text: str) -> HostPackages:
    """`name` or `name==version` per line (`pip list --format=freeze` output reads as is; its
    `name @ URL` lines give a name only); `#` starts a comment."""
    names, versions = set(), {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(
            r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([A-Za-z0-9.+!*-]+)|\s@\s+\S+)?", line
        )
        if not m:
            raise StageError(f"host package list line {n}: cannot parse {raw.strip()!r}")
        name = normalize(m.group(1))
        names.add(name)
        if m.group(2):
            versions[name] = m.group(2)
    if not names:
        raise StageError("host package list names no package")
    return HostPackages(frozenset(names), versions)


def wheel_requires(whl: Path) -> list[str]:
    """Requires-Dist of a wheel's top-level .dist-info/METADATA."""
    with zipfile.ZipFile(whl) as z:
        md = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(md) != 1:
            raise StageError(f"{whl.name}: {len(md)} .dist-info/METADATA files")
        return metadata_headers(z.read(md[0]).decode("utf-8", "replace"), "Requires-Dist")


def declared_left_out(sglang_wheel: Path, left_out: Iterable[str]) -> list[str]:
    """sglang's own requirements (for the host's markers) that this set leaves out on purpose.

    `sglang-dflash check` reads the same Requires-Dist (package.requires) and FAILs naming
    them, so the summary says so before anything travels.
    """
    gone = set(left_out)
    return [f"{r.name}{r.spec}" for r in requirements(wheel_requires(sglang_wheel), HOST_ENV)
            if r.name in gone]


# ---------------------------------------------------------------- the lock


def _deps(raw: Iterable[dict]) -> tuple[Dep, ...]:
    return tuple(
        Dep(normalize(d["name"]), d.get("version"), tuple(d.get("extra", ())), d.get("marker"))
        for d in raw
    )


def parse_lock(text: str) -> list[Package]:
    data = tomllib.loads(text)
    out = []
    for p in data.get("package", []):
        wheels = tuple(
            Wheel(
                w["url"].rsplit("/", 1)[1],
                w["url"],
                w["hash"].removeprefix("sha256:"),
                int(w.get("size", 0)),
            )
            for w in p.get("wheels", [])
            if "url" in w
        )
        optional = {k: _deps(v) for k, v in p.get("optional-dependencies", {}).items()}
        out.append(
            Package(
                normalize(p["name"]),
                p["version"],
                _deps(p.get("dependencies", [])),
                optional,
                wheels,
                p.get("source", {}),
            )
        )
    return out


def _find(packages: list[Package], dep: Dep) -> Package:
    hits = [
        p
        for p in packages
        if p.name == dep.name and (dep.version is None or p.version == dep.version)
    ]
    if len(hits) != 1:
        raise StageError(f"uv.lock has {len(hits)} entries for {dep.name} {dep.version or ''}")
    return hits[0]


def closure(
    packages: list[Package], roots: Iterable[Dep], env: dict[str, str], stop: set[str] = frozenset()
) -> dict[str, tuple[Package, list[str]]]:
    """Every package reachable from `roots` (extras followed, markers evaluated for `env`).

    Names in `stop` are not entered: neither they nor what only they need appear.
    Returns name -> (package, names of the packages that pulled it in).
    """
    found: dict[str, tuple[Package, list[str]]] = {}
    queue: list[tuple[Dep, str]] = [(d, "<root>") for d in roots]
    expanded: set[tuple[str, str]] = set()
    while queue:
        dep, parent = queue.pop()
        if dep.name in stop or (dep.marker and not eval_marker(dep.marker, env)):
            continue
        pkg = _find(packages, dep)
        if pkg.name in found:
            if parent not in found[pkg.name][1]:
                found[pkg.name][1].append(parent)
        else:
            found[pkg.name] = (pkg, [parent])
            queue.extend((d, pkg.name) for d in pkg.deps)
        for extra in dep.extras:
            if (pkg.name, extra) not in expanded:
                expanded.add((pkg.name, extra))
                queue.extend((d, pkg.name) for d in pkg.optional.get(extra, ()))
    return found


def project_roots(packages: list[Package], extra: str = EXTRA) -> tuple[Dep, ...]:
    proj = [p for p in packages if p.name == PROJECT]
    if not proj or extra not in proj[0].optional:
        raise StageError(f"uv.lock has no {PROJECT}[{extra}]")
    return proj[0].optional[extra]


def host_provided(packages: list[Package], env: dict[str, str]) -> dict[str, str]:
    """torch, triton, and the nvidia-* / cuda-toolkit packages torch's dependency list pulls in."""
    reasons = {n: "preinstalled on the host at the pinned version" for n in HOST_ROOTS}
    torch_deps = closure(packages, [Dep("torch")], env)
    for name, (_, via) in sorted(torch_deps.items()):
        if name not in reasons and HOST_LIBRARY.fullmatch(name):
            reasons[name] = f"brought by the host's torch (dependency of {', '.join(sorted(via))})"
    return reasons


def requested_extras(packages: Iterable[Package], names: Iterable[str]) -> dict[str, set[str]]:
    """name -> the extras any of `names`' lock dependencies ask of it."""
    by_name = {p.name: p for p in packages}
    out: dict[str, set[str]] = {}
    for n in names:
        pkg = by_name[n]
        for d in (*pkg.deps, *(d for ds in pkg.optional.values() for d in ds)):
            if d.extras:
                out.setdefault(d.name, set()).update(d.extras)
    return out


def host_selection(
    candidates: dict[str, str],
    shipped_via: Callable[[set[str]], set[str]],
    requires: dict[str, list[str]],
    host: HostPackages,
    pinned: set[str],
    ship: set[str],
    env: dict[str, str],
    extras: dict[str, set[str]],
) -> tuple[set[str], list[HostDecision]]:
    """Which `candidates` (name -> locked version) are left to the host's copy.

    A candidate on the host is left to it unless it is in pins.toml (`pinned`), named by
    --ship, or a shipped wheel's Requires-Dist rules the host's copy out (HostPackages.judge:
    an exact pin the listed host version does not prove, or a range the listed version misses).
    `shipped_via(left_to_host)` is the set that then ships; its wheels' requirements may force
    more to ship, so this runs to a fixpoint (the host set only shrinks).
    Returns (names left to the host, one decision per candidate on the host).
    """
    forced: dict[str, str] = {}
    for n in sorted(pinned & set(candidates) & host.names):
        have = host.versions.get(n, "an unknown version")
        forced[n] = f"pinned in pins.toml [distributions] (host has {have})"
    for n in sorted(ship & set(candidates) & host.names):
        forced.setdefault(n, "--ship")
    while True:
        to_host = {n for n in candidates if n in host.names and n not in forced}
        shipped = shipped_via(to_host)
        proven: dict[str, list[str]] = {}
        new: dict[str, str] = {}
        for src in sorted(shipped):
            for req in requirements(requires.get(src, ()), env, extras.get(src, ())):
                if req.name not in to_host:
                    continue
                why = host.judge(req)
                if why:
                    new.setdefault(req.name, f"{why} by {src}")
                elif req.exact:
                    proven.setdefault(req.name, []).append(f"{src} pins {req.spec}")
        if not new:
            break
        forced.update(new)
    decisions = []
    for n in sorted(n for n in candidates if n in host.names):
        if n in forced:
            decisions.append(HostDecision(n, candidates[n], "ship", forced[n]))
            continue
        have = host.versions.get(n)
        reason = "on the host" + (f" at {have}" if have else " (version not listed)")
        if n in proven:
            reason += "; proven for " + ", ".join(proven[n])
        decisions.append(HostDecision(n, candidates[n], "host", reason))
    return to_host, decisions


def make_plan(
    packages: list[Package],
    target: Target,
    env: dict[str, str],
    keep: set[str] = frozenset(),
    host: HostPackages | None = None,
    pinned: set[str] = frozenset(),
    ship: set[str] = frozenset(),
    requires: dict[str, list[str]] | None = None,
    extras: tuple[str, ...] = (EXTRA,),
) -> Plan:
    """What ships and what does not (with a reason for each package left out).

    With `host`, locked packages the host image also has are left to it (host_selection);
    `requires` (name -> Requires-Dist) should hold every package that ships, else its exact
    pins are not seen: stage() loops until it does.
    """
    roots = tuple(d for e in dict.fromkeys(extras) for d in project_roots(packages, e))
    full = closure(packages, roots, env)
    rules = host_provided(packages, env)
    rules.update(
        {
            n: f"optional, not imported at startup: {r}"
            for n, r in OPTIONAL_HEAVY.items()
            if n not in keep
        }
    )
    decisions: list[HostDecision] = []
    if host is not None:
        base = closure(packages, roots, env, stop=set(rules))
        candidates = {n: p.version for n, (p, _) in base.items()}

        def shipped_via(to_host: set[str]) -> set[str]:
            return set(closure(packages, roots, env, stop=set(rules) | to_host))

        extras = requested_extras(packages, base)
        extras.update({d.name: set(d.extras) | extras.get(d.name, set()) for d in roots})
        _, decisions = host_selection(
            candidates, shipped_via, requires or {}, host, pinned, ship, env, extras
        )
        for d in decisions:
            if d.action == "host":
                rules[d.name] = d.reason + f"; uv.lock has {d.version}, the host's copy is used"
    kept = closure(packages, roots, env, stop=set(rules))
    selected, excluded = [], []
    for name, (pkg, via) in sorted(full.items()):
        wheel = pick_wheel(pkg, target)
        if name not in kept:
            reason = rules.get(name) or (
                "needed only by packages left out ("
                + ", ".join(sorted(v for v in via if v not in kept))
                + ")"
            )
            excluded.append(Excluded(name, pkg.version, reason, wheel.size if wheel else None))
            continue
        if wheel is None:
            raise StageError(
                f"no wheel of {name} {pkg.version} in uv.lock fits cp3"
                f"{target.py_minor} manylinux x86_64 (glibc <= 2."
                f"{target.max_glibc_minor})"
            )
        selected.append(Selected(name, pkg.version, wheel, sorted(kept[name][1])))
    for d in decisions:
        if d.action == "ship" and d.name not in kept:
            d.action = "host"
            d.reason += "; but only packages left to the host need it, so it does not travel"
    return Plan(selected, excluded, decisions)


# ---------------------------------------------------------------- I/O: fetch, build, unpack


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch(wheel: Wheel, cache: Path) -> tuple[Path, bool]:
    """The cached wheel, downloaded and sha256-checked when absent. Returns (path, downloaded)."""
    dest = cache / wheel.filename
    if dest.exists() and sha256_file(dest) == wheel.sha256:
        return dest, False
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(wheel.url, timeout=120) as r, tmp.open("wb") as f:
        shutil.copyfileobj(r, f, 4 * MIB)
    got = sha256_file(tmp)
    if got != wheel.sha256:
        tmp.unlink()
        raise StageError(f"{wheel.filename}: sha256 {got} != uv.lock's {wheel.sha256}")
    tmp.replace(dest)
    return dest, True


def build_project_wheel(repo: Path, out: Path) -> Path:
    """This project's wheel, built by pip like any consumer builds it."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(repo)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(out.glob("sglang_dflash-*.whl"))
    if r.returncode != 0 or not wheels:
        last = (r.stderr.strip().splitlines() or ["no wheel produced"])[-1]
        raise StageError(f"building {PROJECT}'s wheel failed: {last}")
    return wheels[-1]


def source_state(repo: Path) -> dict:
    """The commit the project wheel was built from, and whether the tree differed from it."""

    def git(*a: str) -> str | None:
        r = subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain", "--", "src", "pyproject.toml", "overlays")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def unpack_wheel(whl: Path, site: Path) -> list[str]:
    """Install a wheel by unzipping it into `site` (purelib/platlib of .data merged in,
    file modes kept). Returns the .data subtrees skipped (scripts, headers, data)."""
    skipped = set()
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data") and len(parts) > 2:
                if parts[1] not in ("purelib", "platlib"):
                    skipped.add("/".join(parts[:2]))
                    continue
                name = "/".join(parts[2:])
            if not name or name.endswith("/"):
                continue
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, dest.open("wb") as f:
                shutil.copyfileobj(src, f, 4 * MIB)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                dest.chmod(mode | 0o200)
    return sorted(skipped)


def apply_patches(patch_dir: Path, site: Path) -> list[str]:
    """Apply overlays/patches/sglang-<ver>/*.patch (paths relative to site-packages, -p1)."""
    applied = []
    for p in sorted(patch_dir.glob("*.patch")) if patch_dir.is_dir() else []:
        r = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "-d", str(site), "-i", str(p)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            last = ((r.stdout + r.stderr).strip().splitlines() or ["(no output)"])[-1]
            raise StageError(f"patch {p.name} does not apply: {last}")
        applied.append(p.name)
    return applied


def drop_files(site: Path, pattern: str) -> list[tuple[str, int]]:
    dropped = []
    for p in sorted(site.glob(pattern)):
        dropped.append((str(p.relative_to(site)), p.stat().st_size))
        p.unlink()
    return dropped


def tree_size(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files), len(files)


def fixed_member(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A member as every staging run writes it: STAGE_MTIME, owned by root (see STAGE_MTIME)."""
    info.mtime = STAGE_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def pack(site: Path, tarball: Path, level: int) -> None:
    """The site as one gzip tarball, byte-identical for the same files (gzip header mtime 0)."""
    with (
        tarball.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for p in sorted(site.iterdir()):
            tar.add(p, arcname=p.name, filter=fixed_member)


def write_sums(out: Path, files: list[Path]) -> dict[str, str]:
    """SHA256SUMS in `sha256sum -c` format; gpu_unstage.sh reads the same file."""
    sums = {p.name: sha256_file(p) for p in files}
    (out / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sums.items()))
    return sums


def split(tarball: Path, part_size: int) -> list[Path]:
    parts = []
    with tarball.open("rb") as f:
        for i in range(10_000):
            chunk = f.read(part_size)
            if not chunk:
                break
            part = tarball.with_name(f"{tarball.name}.part-{i:02d}")
            part.write_bytes(chunk)
            parts.append(part)
    return parts


# ---------------------------------------------------------------- the device calls


JIT_CACHE = "jit-cache.tgz"


def device_calls(
    parts: list[str],
    stage_rel: str = ".stage",
    remote: str = "/root/stage",
    dest: str = "/root/site",
    jit_cache: bool = False,
    cache_with_last: bool = False,
) -> list[dict]:
    """The `run` calls that move the parts to the device, one part per call (the carry limit
    is 64 MiB a call), each part checked on arrival, the last call unpacking. Files under
    /root survive between back-to-back calls while the machine stays warm. With
    ``jit_cache``, the JIT caches a previous lease saved (scripts/gpu_jit_cache.sh) are
    restored into $HOME there: in the last part's call when ``cache_with_last`` (it fits
    beside that part: one call fewer, each costing device time while the machine waits),
    else in one more call."""
    calls = []
    for i, part in enumerate(parts):
        cmd = (
            f"set -eo pipefail; mkdir -p {remote};"
            f" cp {stage_rel}/{part} {stage_rel}/SHA256SUMS {remote}/;"
            f" (cd {remote} && grep -F ' {part}' SHA256SUMS | sha256sum -c --quiet -);"
            f" echo 'part {i + 1}/{len(parts)} ok'; ls {remote}"
        )
        carry = [f"{stage_rel}/{part}", f"{stage_rel}/SHA256SUMS"]
        if i == len(parts) - 1:
            # the unstage byte-compiles the site; the host's torch tree is compiled here
            cmd += f"; bash scripts/gpu_unstage.sh {remote} {dest}"
            cmd += "; bash scripts/gpu_bytecompile.sh --host"
            if jit_cache and cache_with_last:
                cmd += f"; bash scripts/gpu_jit_cache.sh restore {stage_rel}/{JIT_CACHE}"
                carry += [f"{stage_rel}/{JIT_CACHE}", f"{stage_rel}/{JIT_CACHE}.sha256"]
        calls.append({"command": cmd, "carry": carry})
    if jit_cache and not cache_with_last:
        calls.append({
            "command": f"set -eo pipefail; bash scripts/gpu_jit_cache.sh restore "
                       f"{stage_rel}/{JIT_CACHE}",
            "carry": [f"{stage_rel}/{JIT_CACHE}", f"{stage_rel}/{JIT_CACHE}.sha256"],
        })
    return calls


def check_jit_cache(src: Path) -> str:
    """The sha256 of a saved JIT cache, checked against the .sha256 written beside it."""
    sums = Path(f"{src}.sha256")
    if not src.is_file():
        raise StageError(f"--jit-cache {src}: no such file")
    if not sums.is_file():
        raise StageError(f"--jit-cache {src}: {sums.name} missing beside it (save writes both)")
    want = sums.read_text().split()[0] if sums.read_text().split() else ""
    got = hashlib.sha256(src.read_bytes()).hexdigest()
    if want != got:
        raise StageError(f"--jit-cache {src}: sha256 {got[:12]} does not match {sums.name}")
    return got


def take_jit_cache(src: Path, sha: str, out: Path) -> None:
    """Copy the checked JIT cache into the stage dir under the name the calls carry."""
    shutil.copyfile(src, out / JIT_CACHE)
    (out / f"{JIT_CACHE}.sha256").write_text(f"{sha}  {JIT_CACHE}\n")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    here = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=here, help="project root (uv.lock, overlays/)")
    ap.add_argument("--out", type=Path, default=None, help="default: <repo>/.stage")
    ap.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache" / "sglang-dflash" / "wheels"
    )
    ap.add_argument(
        "--work",
        type=Path,
        default=None,
        help="where the site directory is assembled (default: a temp dir)",
    )
    ap.add_argument("--part-mib", type=int, default=None,
                    help="part size; default: what fits beside the working tree in one call "
                         "(64 MiB - tree - 2 MiB, at most 60)")
    ap.add_argument("--jit-cache", type=Path, default=None,
                    help="a jit-cache.tgz saved by scripts/gpu_jit_cache.sh on an earlier lease "
                         "(its .sha256 beside it): one more call restores it")
    ap.add_argument("--max-glibc", type=int, default=39, help="N of manylinux_2_N (host: 2.39)")
    ap.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="NAME",
        help="ship an optional heavy wheel after all (repeatable)",
    )
    ap.add_argument(
        "--keep-flash-ops",
        action="store_true",
        help=f"keep {FLASH_OPS_GLOB} (the FA3 backend, 1.1 GB unpacked)",
    )
    ap.add_argument(
        "--host-packages",
        type=Path,
        default=here / "scripts" / "h200-host-packages.txt",
        metavar="FILE",
        help="distributions the host image has (name or name==version a line); those are not "
        "shipped unless pinned (default: scripts/h200-host-packages.txt)",
    )
    ap.add_argument(
        "--no-host-packages",
        action="store_true",
        help="ship every locked package the host's torch does not bring (the old behaviour)",
    )
    ap.add_argument(
        "--ship",
        action="append",
        default=[],
        metavar="NAME",
        help="ship a package the host also has, at the locked version (repeatable)",
    )
    ap.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="NAME",
        help=f"also stage this extra of {PROJECT} besides `gpu` (e.g. `router`: smg, for "
        "benchmarks/router_pair; repeatable)",
    )
    ap.add_argument("--gzip-level", type=int, default=6)
    ap.add_argument("--plan-only", action="store_true", help="print the plan as JSON and stop")
    return ap.parse_args(argv)


def read_pinned(repo: Path) -> set[str]:
    """The distributions of pins.toml [distributions]: they always travel at the locked version."""
    pins = repo / "src" / "sglang_dflash" / "pins.toml"
    try:
        data = tomllib.loads(pins.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise StageError(f"{pins}: {e}") from e
    dists = data.get("distributions")
    if not isinstance(dists, dict) or not dists:
        raise StageError(f"{pins}: no [distributions] table")
    return {normalize(n) for n in dists}


def plan_with_host(
    args: argparse.Namespace, packages: list[Package], target: Target, keep: set[str]
) -> Plan:
    """make_plan with the host list; fetches each shipping wheel (cached) to read its exact
    pins, re-planning until every shipping wheel's Requires-Dist has been read."""
    try:
        host = parse_host_packages(args.host_packages.read_text())
    except OSError as e:
        raise StageError(f"--host-packages {args.host_packages}: {e.strerror}") from e
    ship = {normalize(n) for n in args.ship}
    unknown = ship - host.names
    if unknown:
        raise StageError(f"--ship {', '.join(sorted(unknown))}: not in {args.host_packages}")
    pinned = read_pinned(args.repo)
    requires: dict[str, list[str]] = {}
    while True:
        plan = make_plan(packages, target, HOST_ENV, keep, host, pinned, ship, requires,
                         extras=(EXTRA, *args.extra))
        todo = [s for s in plan.selected if s.name not in requires]
        if not todo or not any(d.action == "host" for d in plan.host_decisions):
            return plan  # nothing left to the host: no requirement can change that
        for s in todo:
            path, _ = fetch(s.wheel, args.cache)
            requires[s.name] = wheel_requires(path)


def stage(args: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    lock = args.repo / "uv.lock"
    if not lock.is_file():
        raise StageError(f"{lock}: no such file")
    packages = parse_lock(lock.read_text())
    if args.part_mib is None:
        args.part_mib = auto_part_mib(working_tree_bytes(args.repo))
    if not 1 <= args.part_mib <= 63:
        raise StageError(f"--part-mib {args.part_mib}: must be 1..63 (a call carries <= 64 MiB)")
    target = Target(max_glibc_minor=args.max_glibc)
    unknown = {normalize(k) for k in args.keep} - set(OPTIONAL_HEAVY)
    if unknown:
        raise StageError(f"--keep {', '.join(sorted(unknown))}: not an optional exclusion")
    keep = {normalize(k) for k in args.keep}
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.no_host_packages:
        plan = make_plan(packages, target, HOST_ENV, keep, extras=(EXTRA, *args.extra))
    else:
        plan = plan_with_host(args, packages, target, keep)
    if args.plan_only:
        return {
            "selected": [asdict(s) for s in plan.selected],
            "excluded": [asdict(e) for e in plan.excluded],
            "host_decisions": [asdict(d) for d in plan.host_decisions],
        }

    out = args.out or args.repo / ".stage"
    jit_sha = check_jit_cache(args.jit_cache) if args.jit_cache is not None else None
    downloaded = 0
    paths = []
    for s in plan.selected:
        path, new = fetch(s.wheel, args.cache)
        downloaded += s.wheel.size if new else 0
        paths.append(path)
    t_fetch = time.monotonic()

    work = Path(tempfile.mkdtemp(prefix="gpu-stage-", dir=args.work))
    try:
        site = work / "site"
        site.mkdir()
        own = build_project_wheel(args.repo, work / "own")
        skipped = {}
        for path in [*paths, own]:
            if s := unpack_wheel(path, site):
                skipped[path.name] = s
        sglang = next(s for s in plan.selected if s.name == "sglang")
        left_out = declared_left_out(
            paths[plan.selected.index(sglang)],
            [e.name for e in plan.excluded if e.name in OPTIONAL_HEAVY],
        )
        patch_dir = args.repo / "overlays" / "patches" / f"sglang-{sglang.version}"
        patches = apply_patches(patch_dir, site)
        dropped = [] if args.keep_flash_ops else drop_files(site, FLASH_OPS_GLOB)
        unpacked, nfiles = tree_size(site)
        t_unpack = time.monotonic()

        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(f"{TARBALL}*"):
            old.unlink()
        tarball = out / TARBALL
        pack(site, tarball, args.gzip_level)
        parts = split(tarball, args.part_mib * MIB)
        sums = write_sums(out, [tarball, *parts])
        tar_size = tarball.stat().st_size
        tarball.unlink()  # the parts are what travels; gpu_unstage.sh rebuilds it
    finally:
        shutil.rmtree(work, ignore_errors=True)
    t_end = time.monotonic()

    manifest = {
        "target": {
            "python": "cp312",
            "platform": f"manylinux_2_{args.max_glibc}_x86_64 or older",
            "env": HOST_ENV,
        },
        "project_wheel": own.name,
        "project_source": source_state(args.repo),
        "wheels": [
            {
                "name": s.name,
                "version": s.version,
                "file": s.wheel.filename,
                "size": s.wheel.size,
                "sha256": s.wheel.sha256,
                "needed_by": s.via,
            }
            for s in plan.selected
        ],
        "excluded": [asdict(e) for e in plan.excluded],
        "declared_left_out": left_out,
        "host_packages": None
        if args.no_host_packages
        else {
            "file": str(args.host_packages),
            "sha256": sha256_file(args.host_packages),
            "ship": sorted(normalize(n) for n in args.ship),
            "decisions": [asdict(d) for d in plan.host_decisions],
        },
        "dropped_files": [{"path": p, "size": n, "reason": FLASH_OPS_REASON} for p, n in dropped],
        "skipped_wheel_data": skipped,
        "patches_applied": patches,
        "patch_dir": str(patch_dir.relative_to(args.repo)),
        "sizes": {
            "wheels": len(plan.selected) + 1,
            "download_bytes": sum(s.wheel.size for s in plan.selected),
            "downloaded_now_bytes": downloaded,
            "unpacked_bytes": unpacked,
            "unpacked_files": nfiles,
            "tarball_bytes": tar_size,
            "tarball_sha256": sums[TARBALL],
            "parts": [
                {"file": p.name, "size": p.stat().st_size, "sha256": sums[p.name]} for p in parts
            ],
        },
        "seconds": {
            "fetch": round(t_fetch - t0, 1),
            "unpack": round(t_unpack - t_fetch, 1),
            "pack": round(t_end - t_unpack, 1),
            "total": round(t_end - t0, 1),
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if jit_sha is not None:
        take_jit_cache(args.jit_cache, jit_sha, out)
    cache_with_last = jit_sha is not None and fits_one_call(
        parts[-1].stat().st_size + args.jit_cache.stat().st_size, working_tree_bytes(args.repo))
    calls = device_calls([p.name for p in parts], jit_cache=args.jit_cache is not None,
                         cache_with_last=cache_with_last)
    (out / "calls.json").write_text(json.dumps(calls, indent=1) + "\n")
    return manifest


def summary(m: dict) -> str:
    s = m["sizes"]
    decisions = (m.get("host_packages") or {}).get("decisions", [])
    lines = [f"on the host too ({len(decisions)}):"]
    lines += [
        f"  - {d['name']} {d['version']}: "
        + ("skipped: " if d["action"] == "host" else "shipped: ")
        + d["reason"]
        for d in decisions
    ]
    lines.append(f"excluded {len(m['excluded'])}:")
    lines += [f"  - {e['name']} {e['version']}: {e['reason']}" for e in m["excluded"]]
    lines += [
        f"  - file {d['path']} ({d['size'] / MIB:.0f} MiB): {d['reason']}"
        for d in m["dropped_files"]
    ]
    if m.get("declared_left_out"):
        names = m["declared_left_out"]
        lines.append(
            f"note: sglang declares {len(names)} requirement(s) left out here "
            f"({', '.join(names)}): `sglang-dflash check` will FAIL package.requires on this "
            f"set; --keep NAME ships one"
        )
    lines.append(
        f"staged {s['wheels']} wheels ({s['download_bytes'] / MIB:.0f} MiB download), "
        f"unpacked {s['unpacked_bytes'] / MIB:.0f} MiB in {s['unpacked_files']} files, "
        f"tarball {s['tarball_bytes'] / MIB:.0f} MiB in {len(s['parts'])} parts, "
        f"{m['seconds']['total']} s; patches: {len(m['patches_applied'])}"
    )
    return "\n".join(lines)


def working_tree_bytes(repo: Path) -> int:
    """Bytes of what a device call sends: tracked and untracked-not-ignored files."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard",
                              "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 8 * MIB  # not a git checkout: assume a modest tree
    total = 0
    for name in filter(None, out.decode(errors="replace").split("\0")):
        with contextlib.suppress(OSError):
            total += (repo / name).stat().st_size
    return total


def fits_one_call(carried_bytes: int, tree_bytes: int) -> bool:
    """Whether files of ``carried_bytes`` travel in one call beside the working tree."""
    return carried_bytes + tree_bytes <= CALL_ROOM


def auto_part_mib(tree_bytes: int) -> int:
    """The largest part that still fits one call (64 MiB with the tree and 2 MiB to spare).

    A fixed 60 MiB stopped fitting once committed GPU results grew the tree past 4 MiB
    (2026-12-02: "the working tree is larger than 64 MiB")."""
    room = (CALL_ROOM - tree_bytes) // MIB
    if room < 1:
        raise StageError(f"the working tree is {tree_bytes / MIB:.1f} MiB: no room for a part "
                         "in a 64 MiB call; move large untracked files out or ignore them")
    return min(60, room)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = stage(args)
    except (StageError, RequirementError) as e:
        print(f"gpu_stage: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"gpu_stage: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1) if args.plan_only else summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
