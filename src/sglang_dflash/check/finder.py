"""Locate modules on disk without importing them or touching sys.modules."""

from __future__ import annotations

import os
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)

_LOADERS = ((ExtensionFileLoader, EXTENSION_SUFFIXES), (SourceFileLoader, SOURCE_SUFFIXES),
            (SourcelessFileLoader, BYTECODE_SUFFIXES))


def find_spec_in(fullname: str, locations: list[str]) -> ModuleSpec | None:
    """PathFinder's search, over directories only, without touching sys.modules.

    (PathFinder builds a _NamespacePath for namespace packages, which looks the parent
    up in sys.modules, i.e. needs it imported; this returns plain location lists.)
    A regular package or module in any location wins over namespace portions.
    """
    portions: list[str] = []
    for loc in locations:
        if not os.path.isdir(loc):
            continue
        spec = FileFinder(loc, *_LOADERS).find_spec(fullname)
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions += list(spec.submodule_search_locations or [])
    if portions:
        spec = ModuleSpec(fullname, None, is_package=True)
        spec.submodule_search_locations = portions
        return spec
    return None
