"""A rendered unit file as the module's attribute set spells it: so a test can compare what
`sglang-dflash unit` writes with what the NixOS module renders, directive by directive."""

from __future__ import annotations


def unit_directives(text: str) -> dict[str, list[str]]:
    """Every `Key=value` line of a unit file, values in order (repeated keys kept)."""
    rendered: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            rendered.setdefault(k, []).append(v)
    return rendered


def as_lines(value) -> list[str]:
    """A module attribute value as the unit lines systemd reads (booleans as true/false)."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]
