"""The overlay manifest: pins + required modules + file hashes + entry point.

`overlay.toml` (data) and `pins.toml` say what the overlay is; this module turns
them and the overlay's files into `manifest.json`, which is committed and installed
with the package so `sglang-dflash check` can verify an installation against it.
`sglang-dflash manifest --write` regenerates it; `--check` exits 1 naming what is stale.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglang_dflash.pins import Pins

PACKAGE_DIR = Path(__file__).resolve().parent
OVERLAY_FILE = "overlay.toml"
MANIFEST_FILE = "manifest.json"
SCHEMA = 1
FIX_STALE = "run `sglang-dflash manifest --write` and commit src/sglang_dflash/manifest.json"


@dataclass(frozen=True)
class EntryPoint:
    group: str
    name: str
    value: str

    @property
    def module(self) -> str:
        return self.value.split(":", 1)[0]


@dataclass(frozen=True)
class Patch:
    patch: str
    changes: list[str]


@dataclass(frozen=True)
class Overlay:
    """overlay.toml, typed."""

    required_modules: list[str]
    entry_point: EntryPoint
    file_globs: list[str]
    patches: list[Patch]
    extensions: dict[str, str]


@dataclass(frozen=True)
class Manifest:
    """manifest.json, typed; what the check reads."""

    pins: dict
    required_modules: list[str]
    entry_point: EntryPoint
    overlay_globs: list[str]
    overlay_files: dict[str, str]  # path relative to sglang_dflash -> sha256 hex
    patches: list[dict] = field(default_factory=list)
    patched_files: dict[str, str] = field(default_factory=dict)  # sglang-relative -> sha256
    extensions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        data = {"schema": SCHEMA, "generated_by": "sglang-dflash manifest --write", **asdict(self)}
        return json.dumps(data, indent=2, sort_keys=False) + "\n"


def parse_overlay(text: str) -> Overlay:
    data = tomllib.loads(text)
    ov = data["overlay"]
    return Overlay(
        required_modules=list(data["sglang"]["required_modules"]),
        entry_point=EntryPoint(**data["entry_point"]),
        file_globs=list(ov["files"]),
        patches=[Patch(p["patch"], list(p["changes"])) for p in ov.get("patches", [])],
        extensions=dict(data.get("extensions", {})),
    )


def parse_manifest(text: str) -> Manifest:
    """Parse manifest.json; raises ValueError naming what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}")
    try:
        return Manifest(
            pins=data["pins"],
            required_modules=list(data["required_modules"]),
            entry_point=EntryPoint(**data["entry_point"]),
            overlay_globs=list(data["overlay_globs"]),
            overlay_files=dict(data["overlay_files"]),
            patches=list(data.get("patches", [])),
            patched_files=dict(data.get("patched_files", {})),
            extensions=dict(data.get("extensions", {})),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"missing or malformed field {exc}") from exc


def load_manifest(path: Path | None = None) -> Manifest:
    """The manifest installed with this package (or `path`)."""
    return parse_manifest((path or PACKAGE_DIR / MANIFEST_FILE).read_text())


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def glob_match(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """pathlib glob semantics on path segments: `**` spans any number of directories,
    other wildcards stay inside one segment (fnmatch alone would let `*` cross a `/`).
    parts name a file, and a trailing `**` matches only directories, so never a file."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        if not rest:
            return False
        return any(glob_match(parts[i:], rest) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and glob_match(parts[1:], rest)


def walk_files(root: Path) -> list[tuple[str, ...]]:
    """Every file under root as path segments, entering symlinked directories.

    Python 3.11's Path.glob("**") does not follow symlinks to directories, and in a Nix
    environment the overlay's subdirectories can be exactly that. A directory reached twice
    (a symlink loop) is walked once.
    """
    seen: set[tuple[int, int]] = set()
    out: list[tuple[str, ...]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in seen:
            dirnames.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = Path(dirpath).relative_to(root).parts
        out += [(*rel, f) for f in filenames if os.path.isfile(os.path.join(dirpath, f))]
    return out


def glob_files(root: Path, globs: list[str]) -> list[str]:
    """Files under root matching the globs, as sorted posix paths relative to root."""
    patterns = [tuple(Path(g).parts) for g in globs]
    return sorted(
        "/".join(parts)
        for parts in walk_files(root)
        if any(glob_match(parts, pat) for pat in patterns)
    )


def build_manifest(pins: Pins, overlay: Overlay, root: Path,
                   patched_root: Path | None = None) -> Manifest:
    """Compute the manifest from the pins, overlay.toml and the files on disk."""
    files = {rel: sha256_file(root / rel) for rel in glob_files(root, overlay.file_globs)}
    patches, patched = [], {}
    for p in overlay.patches:
        patches.append({"patch": p.patch, "sha256": sha256_file(root / p.patch),
                        "changes": p.changes})
        if p.changes and patched_root is None:
            raise ValueError(f"patch {p.patch} changes files: give --patched-root")
        for rel in p.changes:
            patched[rel] = sha256_file(patched_root / rel)
    return Manifest(
        pins=asdict(pins),
        required_modules=overlay.required_modules,
        entry_point=overlay.entry_point,
        overlay_globs=overlay.file_globs,
        overlay_files=files,
        patches=patches,
        patched_files=patched,
        extensions=overlay.extensions,
    )


def _diff_keys(label: str, old: dict, new: dict) -> list[str]:
    out = [f"{label} added: {k}" for k in sorted(new.keys() - old.keys())]
    out += [f"{label} removed: {k}" for k in sorted(old.keys() - new.keys())]
    out += [f"{label} changed: {k}" for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    return out


def stale_reasons(committed: Manifest, fresh: Manifest) -> list[str]:
    """What differs between the committed manifest and a fresh one; empty if up to date."""
    out = _diff_keys("pin", _flat(committed.pins), _flat(fresh.pins))
    if committed.required_modules != fresh.required_modules:
        out.append("required_modules differ from overlay.toml")
    if committed.entry_point != fresh.entry_point:
        out.append("entry_point differs from overlay.toml")
    if committed.overlay_globs != fresh.overlay_globs:
        out.append("overlay file globs differ from overlay.toml")
    if committed.extensions != fresh.extensions:
        out.append("extensions differ from overlay.toml")
    out += _diff_keys("overlay file", committed.overlay_files, fresh.overlay_files)
    if committed.patches != fresh.patches:
        out.append("patches differ from overlay.toml / patch files")
    out += _diff_keys("patched file", committed.patched_files, fresh.patched_files)
    return out


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
