"""Package layer: is the sglang that Python would import the pinned, complete, DFlash one?

Never imports sglang (slow, and it writes to $HOME): modules are resolved with
`importlib.machinery.FileFinder` over sys.path and each package's search locations
(PathFinder's search, minus its sys.modules lookups), which reads directories and
returns specs without executing anything.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
from dataclasses import dataclass, field
from importlib import metadata
from importlib.machinery import ModuleSpec
from pathlib import Path

from sglang_dflash.check import requires
from sglang_dflash.check.finder import find_spec_in
from sglang_dflash.check.paths import dangling_link, file_identity, is_inside, link_note, real
from sglang_dflash.check.result import Result, failed, passed, shorten, skipped
from sglang_dflash.manifest import FIX_STALE, Manifest, glob_files, sha256_file
from sglang_dflash.requirements import marker_env, normalize

LAYER = "package"
PACKAGE = "sglang"
# ELF objects in the wheel are rewritten by patchelf in Nix builds (RUNPATH), so
# RECORD can only vouch for their presence; the abi layer proves they load.
PRESENCE_ONLY_SUFFIXES = (".so",)


@dataclass(frozen=True)
class Candidate:
    """One sglang package (or namespace portion) on sys.path, however many ways it is reached.

    `pkg_dir` is where Python finds it through the first entry (unresolved: in a Nix env
    that is the env, not the store); `aliases` are the other entries' paths that lead
    to the same directory or the same files (symlinks), so it is reported once.
    """

    entry: str
    pkg_dir: Path
    regular: bool  # has __init__.py; a regular package beats namespace portions
    aliases: tuple[Path, ...] = ()

    @property
    def real_dir(self) -> Path:
        return real(self.pkg_dir)


@dataclass(frozen=True)
class DistInfo:
    path: Path
    name: str
    version: str


@dataclass
class RecordReport:
    listed: int = 0
    missing: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    linked: int = 0  # files reached through a symlink (a Nix env); hashed at their target
    presence_only: int = 0
    outside: int = 0  # entries outside the site dir (scripts), not checked


def _entry_dir(entry: str) -> str:
    return entry or os.getcwd()


def find_candidates(entries: list[str], name: str = PACKAGE) -> list[Candidate]:
    """Every distinct `name` package on sys.path, in import order, without importing it.

    Two entries reach the same package when its directory resolves to the same real
    directory (the env and its store path, a `result` link) or, for a Nix env whose
    package directory is a real directory of links, when one `__init__.py` is a link
    to the other. Such a package is one candidate with aliases, never a shadowing copy.
    (Hard links alone do not count: uv hard-links identical files into separate venvs.)
    """
    out: list[Candidate] = []
    seen: list[tuple[Path, tuple[int, int] | None, bool]] = []  # real dir, __init__, link?
    for entry in entries:
        try:
            spec = find_spec_in(name, [_entry_dir(entry)])
        except (ImportError, OSError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        # absolute but not resolved: in a Nix env the files are symlinks into the
        # store, and the package is where Python finds it, not where the links point
        pkg_dir = Path(os.path.abspath(next(iter(spec.submodule_search_locations))))
        regular = spec.origin is not None and spec.origin.endswith("__init__.py")
        init = Path(spec.origin) if regular and spec.origin else None
        me = (real(pkg_dir), file_identity(init) if init else None,
              bool(init and init.is_symlink()))
        same = next((i for i, s in enumerate(seen) if s[0] == me[0] or (
            me[1] is not None and s[1] == me[1] and (s[2] or me[2]))), None)
        if same is None:
            out.append(Candidate(entry, pkg_dir, regular))
            seen.append(me)
            continue
        c = out[same]
        if pkg_dir != c.pkg_dir and pkg_dir not in c.aliases:
            out[same] = Candidate(c.entry, c.pkg_dir, c.regular, (*c.aliases, pkg_dir))
    return out


def winner(candidates: list[Candidate]) -> Candidate | None:
    """The one Python imports: the first regular package (namespace portions lose)."""
    return next((c for c in candidates if c.regular), None)


def resolve_module(name: str, top: ModuleSpec) -> ModuleSpec | None:
    """Walk `a.b.c` from the spec of `a` through submodule_search_locations."""
    parts = name.split(".")
    spec: ModuleSpec | None = top
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec else None
        if not locations:
            return None
        spec = find_spec_in(".".join(parts[: i + 1]), list(locations))
        if spec is None:
            return None
    return spec


def spec_location(spec: ModuleSpec) -> Path | None:
    if spec.origin and spec.origin not in ("namespace", "built-in", "frozen"):
        return Path(os.path.abspath(spec.origin))
    if spec.submodule_search_locations:
        return Path(os.path.abspath(next(iter(spec.submodule_search_locations))))
    return None


def dist_infos_in(site: Path, dist: str) -> list[DistInfo]:
    """dist-info directories for `dist` directly in `site` (the package's own metadata)."""
    out = []
    prefix = dist.replace("-", "_").lower()
    try:
        children = sorted(site.iterdir())
    except OSError:
        return []
    for p in children:
        if not p.name.endswith(".dist-info") or not p.name.lower().startswith(prefix + "-"):
            continue
        meta = requires.name_version(p)
        if meta and normalize(meta[0]) == normalize(dist):
            out.append(DistInfo(p, meta[0], meta[1]))
    return out


def record_hash(path: Path) -> str:
    """sha256 in RECORD's encoding: urlsafe base64 without padding."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def hex_to_record(hexdigest: str) -> str:
    return base64.urlsafe_b64encode(bytes.fromhex(hexdigest)).rstrip(b"=").decode()


def verify_record(site: Path, record: Path, patched: dict[str, str]) -> RecordReport:
    """Every RECORD file exists and matches; patched files match the manifest instead.

    Paths are RECORD's, under `site` as Python sees it; symlinks are followed, so a Nix
    env is verified by the content of the store files its links point to.
    """
    rep = RecordReport()
    with record.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    for row in rows:
        rel = row[0]
        digest = row[1] if len(row) > 1 else ""
        if rel.startswith("/") or ".." in Path(rel).parts:
            rep.outside += 1
            continue
        rep.listed += 1
        path = site / rel
        note = link_note(site, rel)
        if not path.is_file():
            link = dangling_link(site, rel)
            why = f" (dangling symlink {link} -> {os.readlink(link)})" if link else ""
            rep.missing.append(rel + why)
            continue
        rep.linked += bool(note)
        if rel.endswith(PRESENCE_ONLY_SUFFIXES) and rel not in patched:
            rep.presence_only += digest.startswith("sha256=")
            continue
        if rel not in patched and not digest.startswith("sha256="):
            continue
        try:
            actual = record_hash(path)
        except OSError as exc:
            rep.unreadable.append(f"{rel} ({exc.strerror or exc}){note}")
            continue
        if rel in patched:
            if actual != hex_to_record(patched[rel]):
                rep.altered.append(f"{rel} (patched file differs from the manifest){note}")
        elif actual != digest[len("sha256="):]:
            rep.altered.append(rel + note)
    return rep


# --- the checks -------------------------------------------------------------------------

def check_location(cands: list[Candidate], win: Candidate | None, pin: str) -> list[Result]:
    fix_install = (f"install the pinned package: `nix build .#sglang-dflash`, or "
                   f"`pip install sglang=={pin}` plus `pip install sglang-dflash`")
    if win is None:
        if cands:
            where = ", ".join(str(c.pkg_dir) for c in cands)
            return [failed(LAYER, "sglang", f"only namespace portions of sglang (no __init__.py): "
                           f"{where}", "re-copy the whole package, or " + fix_install)]
        return [failed(LAYER, "sglang", "no sglang package on sys.path", fix_install)]
    where = f"sglang imports from {win.pkg_dir}"
    if win.real_dir != win.pkg_dir:
        where += f" (-> {win.real_dir})"
    out = [passed(LAYER, "sglang", where)]
    others = [c for c in cands if c is not win]
    if others:
        listing = "; ".join(f"{c.pkg_dir} (shadowed{'' if c.regular else ', namespace'})"
                            for c in others)
        out.append(failed(LAYER, "shadowing",
                          f"{len(cands)} sglang packages on sys.path: {win.pkg_dir} (wins); "
                          f"{listing}",
                          "remove the copy you do not want, or fix PYTHONPATH/sys.path so "
                          "exactly one sglang is reachable"))
    elif win.aliases:
        out.append(passed(LAYER, "shadowing", "exactly one sglang on sys.path, also reached as "
                          + ", ".join(str(a) for a in win.aliases) + " (the same files)"))
    else:
        out.append(passed(LAYER, "shadowing", "exactly one sglang on sys.path"))
    return out


def check_nested(win: Candidate) -> Result:
    nested = win.pkg_dir / PACKAGE / "__init__.py"
    if nested.exists():
        inner = real(nested.parent)
        if inner == win.real_dir:
            return failed(LAYER, "nested", f"{nested.parent} is a symlink back to the package "
                          f"itself ({inner}): every module is importable twice",
                          f"remove the link: `rm {nested.parent}`")
        where = "" if inner == win.pkg_dir / PACKAGE else f" (-> {inner})"
        return failed(
            LAYER, "nested",
            f"nested copy {nested.parent}{where} inside the package that wins (what "
            f"`cp -r`/`scp -r` of a package onto an existing one produces)",
            f"`rm -rf {nested.parent}`, then re-copy with `cp -rT SRC {win.pkg_dir}` or "
            f"`rsync -a SRC/ {win.pkg_dir}/` (trailing slash)")
    return passed(LAYER, "nested", f"no nested sglang/sglang in {win.pkg_dir}")


def check_version(win: Candidate, dists: list[DistInfo], pin: str) -> Result:
    site = win.pkg_dir.parent
    if not dists:
        other = _metadata_version(PACKAGE)
        seen = f" (importlib.metadata reports {other} from elsewhere)" if other else ""
        return failed(LAYER, "version", f"no sglang dist-info beside {win.pkg_dir}{seen}: the "
                      f"package was copied without its metadata",
                      f"install sglang=={pin} with pip/uv/nix instead of copying directories")
    if len(dists) > 1:
        names = ", ".join(d.path.name for d in dists)
        return failed(LAYER, "version", f"{len(dists)} sglang dist-infos in {site}: {names}",
                      f"remove the stale ones; reinstall sglang=={pin}")
    d = dists[0]
    if d.version != pin:
        return failed(LAYER, "version", f"sglang {d.version} at {win.pkg_dir}, pin is {pin}",
                      f"install sglang=={pin} (e.g. `nix build .#sglang-dflash`)")
    return passed(LAYER, "version", f"sglang {d.version} == pin ({d.path.name})")


def _metadata_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_modules(win: Candidate, modules: list[str], version: str | None, pin: str) -> Result:
    top = find_spec_in(PACKAGE, [str(win.pkg_dir.parent)])
    missing, outside = [], []
    for name in modules:
        spec = resolve_module(name, top) if top else None
        loc = spec_location(spec) if spec else None
        if loc is None:
            missing.append(name)
        elif not is_inside(loc, win.pkg_dir, win.aliases):
            outside.append(f"{name} at {loc} (-> {real(loc)})" if real(loc) != loc
                           else f"{name} at {loc}")
    which = f"sglang {version or '(unknown version)'} at {win.pkg_dir}"
    if missing:
        return failed(LAYER, "modules",
                      f"{which} lacks {len(missing)} required module(s): {shorten(missing)}",
                      f"this sglang has no DFlash/DDTree support; install sglang=={pin} "
                      f"(`nix build .#sglang-dflash`), or re-copy the whole package")
    if outside:
        return failed(LAYER, "modules", f"modules resolve outside {win.pkg_dir}: "
                      f"{shorten(outside)}", "remove the other copies from sys.path")
    return passed(LAYER, "modules", f"{len(modules)} required modules found in {win.pkg_dir}")


def check_record(win: Candidate, dist: DistInfo, patched: dict[str, str], pin: str) -> Result:
    record = dist.path / "RECORD"
    if not record.is_file():
        return failed(LAYER, "record", f"{record} is missing",
                      f"reinstall sglang=={pin} with pip/uv/nix")
    rep = verify_record(win.pkg_dir.parent, record, patched)
    reinstall = f"`pip install --force-reinstall --no-deps sglang=={pin}` or re-copy the package"
    problems = []
    if rep.missing:
        problems.append(f"partial copy: {len(rep.missing)} of {rep.listed} files listed in "
                        f"RECORD are missing: {shorten(rep.missing)}")
    if rep.altered:
        problems.append(f"{len(rep.altered)} file(s) differ from RECORD: {shorten(rep.altered)}")
    if rep.unreadable:
        problems.append(f"{len(rep.unreadable)} file(s) unreadable: {shorten(rep.unreadable)}")
    if problems:
        fix = reinstall + "; carry deliberate changes as a patch in overlay.toml"
        if rep.linked:
            fix += ("; in a Nix env the bytes live at the link targets: "
                    "`nix-store --verify --check-contents --repair`, or rebuild")
        return failed(LAYER, "record", "; ".join(problems), fix)
    note = f", {rep.presence_only} shared objects present (hash not checked: patchelf)" \
        if rep.presence_only else ""
    if rep.linked:
        note += f", {rep.linked} reached through symlinks (their targets hashed)"
    if rep.outside:
        note += f", {rep.outside} entries outside {win.pkg_dir.parent} (scripts) not checked"
    return passed(LAYER, "record",
                  f"{rep.listed} files listed in RECORD present, hashes match{note}")


def check_entry_point(manifest: Manifest, entries: list[str]) -> Result:
    ep_spec = manifest.entry_point
    eps = [ep for ep in metadata.entry_points(group=ep_spec.group) if ep.name == ep_spec.name]
    fix = "install sglang-dflash into the same environment as sglang (`pip install sglang-dflash`)"
    if not eps:
        return failed(LAYER, "entry_point",
                      f"no entry point {ep_spec.name!r} in group {ep_spec.group!r}", fix)
    values = sorted({ep.value for ep in eps})
    if len(values) > 1 or values[0] != ep_spec.value:
        return failed(LAYER, "entry_point",
                      f"entry point {ep_spec.name!r} -> {', '.join(values)}, expected "
                      f"{ep_spec.value}", "uninstall the other distribution providing it")
    top_name = ep_spec.module.split(".")[0]
    top = find_spec_in(top_name, [_entry_dir(e) for e in entries])
    spec = resolve_module(ep_spec.module, top) if top else None
    if spec is None or spec_location(spec) is None:
        return failed(LAYER, "entry_point",
                      f"entry point {ep_spec.name} -> {ep_spec.value}, but module "
                      f"{ep_spec.module} is not found",
                      "the installed sglang-dflash is incomplete; reinstall it")
    return passed(LAYER, "entry_point",
                  f"{ep_spec.group}:{ep_spec.name} -> {ep_spec.value} ({spec_location(spec)})")


def check_overlay(manifest: Manifest, root: Path) -> Result:
    missing, altered = [], []
    for rel, digest in sorted(manifest.overlay_files.items()):
        path = root / rel
        if not path.is_file():
            missing.append(rel)
        elif sha256_file(path) != digest:
            altered.append(rel)
    extra = sorted(set(glob_files(root, manifest.overlay_globs)) - manifest.overlay_files.keys())
    problems = []
    if missing:
        problems.append(f"missing: {shorten(missing)}")
    if altered:
        problems.append(f"differ from the manifest: {shorten(altered)}")
    if extra:
        problems.append(f"not in the manifest: {shorten(extra)}")
    if problems:
        return failed(LAYER, "overlay", f"overlay files in {root}: " + "; ".join(problems),
                      f"reinstall sglang-dflash; in a checkout, {FIX_STALE}")
    return passed(LAYER, "overlay",
                  f"{len(manifest.overlay_files)} overlay files match the manifest")


def run_layer(manifest: Manifest | None, manifest_error: str, pins_sglang: str,
              overlay_root: Path, entries: list[str]) -> list[Result]:
    """All package checks, in order; later checks SKIP when what they need is absent."""
    out: list[Result] = []
    if manifest is None:
        out.append(failed(LAYER, "manifest", f"cannot read the manifest: {manifest_error}",
                          f"reinstall sglang-dflash; in a checkout, {FIX_STALE}"))
    else:
        mpin = manifest.pins.get("distributions", {}).get(PACKAGE)
        if mpin != pins_sglang:
            out.append(failed(LAYER, "manifest", f"manifest pins sglang {mpin}, pins.toml "
                              f"{pins_sglang}", FIX_STALE))
        else:
            out.append(passed(LAYER, "manifest", f"manifest for sglang {mpin}, "
                              f"{len(manifest.required_modules)} required modules"))
    cands = find_candidates(entries)
    win = winner(cands)
    out += check_location(cands, win, pins_sglang)
    dependent = ("nested", "version", "modules", "record", "requires")
    if win is None:
        out += [skipped(LAYER, n, "no sglang package to inspect") for n in dependent]
    else:
        out.append(check_nested(win))
        dists = dist_infos_in(win.pkg_dir.parent, PACKAGE)
        out.append(check_version(win, dists, pins_sglang))
        version = dists[0].version if len(dists) == 1 else None
        if manifest is None:
            out.append(skipped(LAYER, "modules", "no manifest to name the required modules"))
        else:
            out.append(check_modules(win, manifest.required_modules, version, pins_sglang))
        if len(dists) == 1:
            patched = manifest.patched_files if manifest else {}
            out.append(check_record(win, dists[0], patched, pins_sglang))
            out.append(requires.check(PACKAGE, dists[0].version, dists[0].path, entries,
                                      marker_env()))
        else:
            out.append(skipped(LAYER, "record", "no single sglang dist-info to read RECORD from"))
            out.append(skipped(LAYER, "requires",
                               "no single sglang dist-info to read Requires-Dist from"))
    if manifest is None:
        out += [skipped(LAYER, n, "no manifest") for n in ("entry_point", "overlay")]
    else:
        out.append(check_entry_point(manifest, entries))
        out.append(check_overlay(manifest, overlay_root))
    return out
