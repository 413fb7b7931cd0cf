"""Path comparisons that hold in a Nix environment, where site-packages is made of symlinks.

uv2nix/pyproject.nix `mkVirtualEnv` (like nixpkgs' buildEnv) links each package's files
from its own /nix/store path: a package directory may itself be a link, or a real
directory whose files and subdirectories are links, possibly into several store paths.
So "where Python finds it" (the unresolved path) and "where the bytes are" (the
resolved one) differ, and a check must accept a match on either.
"""

from __future__ import annotations

import os
from pathlib import Path


def real(path: Path) -> Path:
    """The resolved path; never raises (a symlink loop resolves as far as it can)."""
    return Path(os.path.realpath(path))


def is_inside(path: Path, pkg_dir: Path, aliases: tuple[Path, ...] = ()) -> bool:
    """`path` belongs to the package at `pkg_dir` (or its aliases), seen either way.

    Unresolved: a file linked into the package from another store path (an overlay
    merged into the package directory) is still part of it. Resolved: the same package
    reached another way (a linked package directory, or an alias: the store path that
    also sits on sys.path). A real directory of links is not its store path's twin
    unless sys.path says so (an alias): its contents may differ (merged overlays).
    """
    p = Path(os.path.normpath(os.path.abspath(path)))
    for d in (pkg_dir, *aliases):
        d = Path(os.path.normpath(os.path.abspath(d)))
        if p.is_relative_to(d) or real(p).is_relative_to(real(d)):
            return True
    return False


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what `path` points to; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def link_note(base: Path, rel: str) -> str:
    """' (-> target)' when `base/rel` is reached through a symlink below `base`, else ''.

    Names where the bytes live (the store path to repair), without noise from links
    above `base` (a `result` link, a symlinked /tmp).
    """
    target = real(base / rel)
    return "" if target == real(base) / rel else f" (-> {target})"


def dangling_link(base: Path, rel: str) -> Path | None:
    """The first link on the way from `base` to `base/rel` whose target is gone (a
    garbage-collected or broken store path), or None."""
    here = base
    for part in Path(rel).parts:
        here = here / part
        if here.is_symlink() and not here.exists():
            return here
    return None
