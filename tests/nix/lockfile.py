"""uv.lock, read independently of uv2nix: the dependency closure of a requirement and the
wheel a CPython of the pinned version on x86_64 Linux would pick. The uv2nix test compares
this with what the Nix overlay would fetch."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename


@dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    url: str
    hash: str


def marker_env(python: str, full: str) -> dict[str, str]:
    return {
        "python_version": python, "python_full_version": full, "sys_platform": "linux",
        "platform_machine": "x86_64", "platform_system": "Linux", "os_name": "posix",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "platform_release": "", "platform_version": "", "implementation_version": full,
        "extra": "",
    }


def holds(marker: str | None, env: dict[str, str], extra: str = "") -> bool:
    return marker is None or Marker(marker).evaluate({**env, "extra": extra})


class Lock:
    def __init__(self, path: Path, python: str, full: str):
        data = tomllib.loads(path.read_text())
        self.env = marker_env(python, full)
        self.packages: dict[str, list[dict]] = {}
        for pkg in data["package"]:
            self.packages.setdefault(pkg["name"], []).append(pkg)
        self.python = python

    def pick(self, name: str, version: str | None = None) -> dict:
        """The locked package of that name for this environment."""
        cands = [p for p in self.packages[name] if version is None or p["version"] == version]
        cands = [p for p in cands
                 if not p.get("resolution-markers")
                 or any(holds(m, self.env) for m in p["resolution-markers"])]
        if len(cands) != 1:
            raise LookupError(f"{name}: {len(cands)} locked candidates for this environment")
        return cands[0]

    def closure(self, root: str, extras: list[str]) -> dict[str, dict]:
        """Packages needed by `root[extras]`, following markers and extras."""
        seen: dict[str, dict] = {}
        todo = [(root, None, tuple(extras))]
        done: set[tuple[str, tuple[str, ...]]] = set()
        while todo:
            name, version, want = todo.pop()
            if (name, want) in done:
                continue
            done.add((name, want))
            pkg = self.pick(name, version)
            seen[name] = pkg
            deps = list(pkg.get("dependencies", []))
            for extra in want:
                deps += [d | {"_extra": extra} for d in
                         pkg.get("optional-dependencies", {}).get(extra, [])]
            for dep in deps:
                if holds(dep.get("marker"), self.env, dep.get("_extra", "")):
                    todo.append((dep["name"], dep.get("version"), tuple(dep.get("extra", []))))
        return seen

    def supported_tags(self, glibc_minor: int) -> dict[Tag, int]:
        major, minor = (int(x) for x in self.python.split("."))
        platforms = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 4, -1)]
        platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
                      "linux_x86_64"]
        tags = list(cpython_tags((major, minor), platforms=platforms))
        tags += list(compatible_tags((major, minor), interpreter=f"cp{major}{minor}",
                                     platforms=platforms))
        return {t: i for i, t in enumerate(tags)}

    def best_wheel(self, pkg: dict, ranks: dict[Tag, int]) -> Artifact | None:
        best: tuple[int, dict] | None = None
        for whl in pkg.get("wheels", []):
            _n, _v, _b, tags = parse_wheel_filename(whl["url"].rsplit("/", 1)[1])
            rank = min((ranks[t] for t in tags if t in ranks), default=None)
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, whl)
        if best is None:
            return None
        return Artifact(pkg["name"], pkg["version"], best[1]["url"], best[1]["hash"])

    def artifacts(self, name: str, version: str) -> set[tuple[str, str]]:
        pkg = self.pick(name, version)
        found = {(w["url"], w["hash"]) for w in pkg.get("wheels", [])}
        if "sdist" in pkg:
            found.add((pkg["sdist"]["url"], pkg["sdist"]["hash"]))
        return found
