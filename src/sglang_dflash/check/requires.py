"""package.requires: is every distribution sglang declares (Requires-Dist) installed, at a
version its specifier accepts?

A site directory assembled by hand (copied, or staged without "optional" wheels) can hold a
complete, pinned sglang whose own dependencies are missing; the server then dies at start-up
(`No module named 'xgrammar'`, imported by sglang/srt/server_args.py: seen on the H200 on
2026-12-02) while every other check passes. This reads the metadata only, like `pip check`:
nothing is imported. Markers are evaluated for the running interpreter; requirements behind an
extra are not sglang's base dependencies and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def name_version(dist_info: Path) -> tuple[str, str] | None:
    """(Name, Version) from a dist-info's METADATA headers, or None when unreadable."""
    try:
        head = (dist_info / "METADATA").read_text(errors="replace")
    except OSError:
        return None
    names, versions = metadata_headers(head, "Name"), metadata_headers(head, "Version")
    return (names[0], versions[0]) if names and versions else None


def installed_distributions(entries: list[str]) -> dict[str, Installed]:
    """Every ``*.dist-info`` directly in a search-path entry; the first entry wins (as imports)."""
    out: dict[str, Installed] = {}
    for entry in entries:
        try:
            children = sorted(Path(entry or ".").iterdir())
        except OSError:
            continue
        for p in children:
            if not p.name.endswith(".dist-info"):
                continue
            nv = name_version(p)
            if nv and normalize(nv[0]) not in out:
                out[normalize(nv[0])] = Installed(nv[1], p)
    return out


@dataclass(frozen=True)
class Verdict:
    """What is wrong with one distribution's declared requirements here (empty: nothing)."""

    declared: int
    missing: list[str]
    mismatched: list[str]
    unreadable: list[str]


def judge(requires: list[str], env: dict[str, str], installed: dict[str, Installed]) -> Verdict:
    """Pure: the Requires-Dist lines that apply in ``env``, against what is installed."""
    try:
        reqs = requirements(requires, env)
    except RequirementError as e:
        return Verdict(0, [], [], [str(e)])
    missing, mismatched, unreadable = [], [], []
    for req in reqs:
        have = installed.get(req.name)
        if have is None:
            missing.append(f"{req.name}{req.spec}")
            continue
        if not req.spec:
            continue
        try:
            ok = satisfies(have.version, req.spec)
        except RequirementError as e:
            unreadable.append(f"{req.name}: {e}")
            continue
        if not ok:
            mismatched.append(f"{req.name} {have.version} (needs {req.spec})")
    return Verdict(len(reqs), missing, mismatched, unreadable)


def check(dist: str, version: str, dist_info: Path, entries: list[str],
          env: dict[str, str]) -> Result:
    """The package.requires line for ``dist`` (its dist-info at ``dist_info``)."""
    try:
        text = (dist_info / "METADATA").read_text(errors="replace")
    except OSError as e:
        return failed(LAYER, NAME, f"cannot read {dist_info / 'METADATA'}: {e.strerror or e}",
                      f"reinstall {dist}=={version} with pip/uv/nix")
    v = judge(metadata_headers(text, "Requires-Dist"), env, installed_distributions(entries))
    which = f"{dist} {version}"
    problems = []
    if v.missing:
        problems.append(f"{len(v.missing)} missing: {shorten(v.missing, 12)}")
    if v.mismatched:
        problems.append(f"{len(v.mismatched)} at a version it does not accept: "
                        f"{shorten(v.mismatched, 5)}")
    if v.unreadable:
        problems.append(f"unreadable: {shorten(v.unreadable, 3)}")
    if problems:
        return failed(LAYER, NAME, f"{which} declares {v.declared} requirements here; "
                      + "; ".join(problems),
                      f"install {dist}=={version} together with its dependencies (`uv sync "
                      f"--frozen`, `pip install {dist}=={version}`, `nix build "
                      f".#sglang-dflash`); a copied or hand-staged site dir lacks them")
    return passed(LAYER, NAME, f"{which}: all {v.declared} declared requirements installed "
                  f"at accepted versions")
