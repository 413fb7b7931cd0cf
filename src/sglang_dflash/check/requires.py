"""package.requires: is every distribution sglang needs installed, at a version the
distribution that needs it accepts — sglang's Requires-Dist and, through the installed
distributions' own metadata, the whole closure?

A site directory assembled by hand (copied, or staged without "optional" wheels) can hold a
complete, pinned sglang whose own dependencies are missing; the server then dies at start-up
(`No module named 'xgrammar'`, imported by sglang/srt/server_args.py, when that wheel is left
out) while every other check passes. This reads the metadata only, like `pip check`:
nothing is imported. Markers are evaluated for the running interpreter; requirements behind an
extra are not sglang's base dependencies and are left out.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from sglang_dflash.check.result import Result, failed, passed, shorten
from sglang_dflash.requirements import (
    RequirementError,
    metadata_headers,
    normalize,
    requirements,
    satisfies,
)

LAYER = "package"
NAME = "requires"


@dataclass(frozen=True)
class Installed:
    """A distribution found on the search path: its version and where its metadata is."""

    version: str
    dist_info: Path


METADATA_FILES = ("METADATA", "PKG-INFO")  # dist-info, egg-info


def _metadata_text(info: Path) -> str | None:
    for name in METADATA_FILES:
        try:
            return (info / name).read_text(errors="replace")
        except OSError:
            continue
    return None


def name_version(info: Path) -> tuple[str, str] | None:
    """(Name, Version) from a dist-info's METADATA (egg-info: PKG-INFO), None when unreadable."""
    head = _metadata_text(info)
    if head is None:
        return None
    names, versions = metadata_headers(head, "Name"), metadata_headers(head, "Version")
    return (names[0], versions[0]) if names and versions else None


def installed_distributions(entries: list[str]) -> dict[str, Installed]:
    """Every ``*.dist-info`` / ``*.egg-info`` directory directly in a search-path entry (Debian's
    dist-packages still installs egg-info); the first entry wins, as for imports."""
    out: dict[str, Installed] = {}
    for entry in entries:
        try:
            children = sorted(Path(entry or ".").iterdir())
        except OSError:
            continue
        for p in children:
            if not p.name.endswith((".dist-info", ".egg-info")) or not p.is_dir():
                continue
            nv = name_version(p)
            if nv and normalize(nv[0]) not in out:
                out[normalize(nv[0])] = Installed(nv[1], p)
    return out


@dataclass(frozen=True)
class Verdict:
    """What the walk found: sizes, and what is wrong (all empty: nothing)."""

    declared: int  # the root's own requirements that apply here
    closure: int  # installed distributions reached from the root
    missing: list[str]  # "name spec (who needs it)"
    mismatched: list[str]  # "name version (who needs spec)"
    unreadable: list[str]


def walk(root: str, root_requires: list[str], env: dict[str, str],
         installed: dict[str, Installed],
         requires_of: Callable[[Installed], list[str] | None]) -> Verdict:
    """Pure (given ``requires_of``): breadth-first from the root's Requires-Dist through the
    installed distributions, each followed with the extras asked of it. A requirement is
    reported once, with the first distribution found needing it."""
    root_name = normalize(root)
    seen = {(root_name, ())}
    reached: set[str] = set()
    missing: dict[str, str] = {}
    mismatched: dict[tuple[str, str], str] = {}
    unreadable: list[str] = []
    declared = 0
    queue: deque[tuple[str, list[str], tuple[str, ...]]] = deque([(root, root_requires, ())])
    while queue:
        who, lines, extras = queue.popleft()
        try:
            reqs = requirements(lines, env, extras)
        except RequirementError as e:
            unreadable.append(f"{who}: {e}")
            continue
        if who == root:
            declared = len(reqs)
        for req in reqs:
            have = installed.get(req.name)
            if have is None:
                missing.setdefault(req.name, f"{req.name}{req.spec} ({who})")
                continue
            try:
                ok = not req.spec or satisfies(have.version, req.spec)
            except RequirementError as e:
                unreadable.append(f"{req.name}: {e}")
                ok = True
            if not ok:
                mismatched.setdefault((req.name, who),
                                      f"{req.name} {have.version} ({who} needs {req.spec})")
            if req.name != root_name:
                reached.add(req.name)
            if (req.name, req.extras) in seen:
                continue
            seen.add((req.name, req.extras))
            more = requires_of(have)
            if more is None:
                unreadable.append(f"{req.name}: no readable metadata in {have.dist_info}")
                continue
            queue.append((req.name, more, req.extras))
    return Verdict(declared, len(reached), list(missing.values()), list(mismatched.values()),
                   unreadable)


def read_requires(dist: Installed) -> list[str] | None:
    """Requires-Dist of an installed distribution (egg-info: requires.txt, converted by
    importlib.metadata, markers and extras kept), or None when its metadata is unreadable."""
    if not any(os.access(dist.dist_info / n, os.R_OK) for n in METADATA_FILES):
        return None  # tested, not read: PathDistribution reads it once below
    return list(metadata.PathDistribution(dist.dist_info).requires or [])


def check(dist: str, version: str, dist_info: Path, entries: list[str],
          env: dict[str, str]) -> Result:
    """The package.requires line for ``dist`` (its dist-info at ``dist_info``)."""
    root = read_requires(Installed(version, dist_info))
    if root is None:
        return failed(LAYER, NAME, f"cannot read {dist_info / 'METADATA'}",
                      f"reinstall {dist}=={version} with pip/uv/nix")
    v = walk(dist, root, env, installed_distributions(entries), read_requires)
    which = (f"{dist} {version} ({v.declared} declared requirements, {v.closure} installed "
             f"distributions reached)")
    problems = []
    if v.missing:
        problems.append(f"{len(v.missing)} missing: {shorten(v.missing, 12)}")
    if v.mismatched:
        problems.append(f"{len(v.mismatched)} at a version not accepted: "
                        f"{shorten(v.mismatched, 5)}")
    if v.unreadable:
        problems.append(f"unreadable: {shorten(v.unreadable, 3)}")
    if problems:
        return failed(LAYER, NAME, f"{which}: " + "; ".join(problems),
                      f"install {dist}=={version} together with its dependencies (`uv sync "
                      f"--frozen`, `pip install {dist}=={version}`, `nix build "
                      f".#sglang-dflash`); a copied or hand-staged site dir lacks them")
    return passed(LAYER, NAME, f"{which}: all installed at accepted versions")
