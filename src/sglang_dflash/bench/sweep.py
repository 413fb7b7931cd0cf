"""Sweep expansion and dotted overrides of a raw instance-config dict; pure functions only.

Overrides apply to the raw JSON dict (the NixOS option names), before validation, so a
sweep can set any key the config file can, and the config module stays the one validator.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class SweepError(ValueError):
    """A malformed --sweep/--baseline expression; the message is one line."""


@dataclass(frozen=True)
class Sweep:
    key: str
    values: tuple[Any, ...]


def parse_value(text: str) -> Any:
    """A sweep value: JSON when it parses (16, 0.5, true, null, [0,1]), else the plain string."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside [...] or {...}, so `gpus=[0,1],[2,3]` is two values."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_assignment(text: str) -> tuple[str, str]:
    """`a.b=rest` -> ("a.b", "rest"), with the key checked."""
    key, sep, rest = text.partition("=")
    key = key.strip()
    if not sep:
        raise SweepError(f"{text!r}: expected KEY=VALUE[,VALUE...]")
    if not _KEY_RE.match(key):
        raise SweepError(f"{text!r}: {key!r} is not a dotted key like ddtree.budget")
    return key, rest


def parse_sweep(text: str) -> Sweep:
    """`ddtree.budget=16,32,64` -> Sweep("ddtree.budget", (16, 32, 64))."""
    key, rest = parse_assignment(text)
    raw = split_top_level(rest)
    if any(not v.strip() for v in raw):
        raise SweepError(f"{text!r}: empty value in the list")
    values = tuple(parse_value(v) for v in raw)
    seen: list[Any] = []
    for v in values:
        if v in seen:
            raise SweepError(f"{text!r}: value {v!r} is listed twice")
        seen.append(v)
    return Sweep(key, values)


def expand(sweeps: Sequence[Sweep]) -> list[dict[str, Any]]:
    """Cartesian product of the sweeps, first sweep outermost; no sweeps -> one empty point."""
    keys = [s.key for s in sweeps]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise SweepError(f"--sweep {dup} is given twice; list all its values in one --sweep")
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(
        *(s.values for s in sweeps))]


def apply_override(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of raw with the dotted key set; missing parents become objects."""
    out = copy.deepcopy(raw)
    node = out
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            path = ".".join(parts[: i + 1])
            raise SweepError(f"{key}: {path} is {type(child).__name__}, not an object")
        node = child
    node[parts[-1]] = copy.deepcopy(value)
    return out


def apply_overrides(raw: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    out = raw
    for key, value in point.items():
        out = apply_override(out, key, value)
    return out if point else copy.deepcopy(raw)


_MISSING = object()


def get_dotted(raw: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is _MISSING:
                raise KeyError(key)
            return default
        node = node[part]
    return node


def format_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def label(point: dict[str, Any]) -> str:
    """A short, stable name for a sweep point: `algorithm=ddtree ddtree.budget=32`."""
    return " ".join(f"{k}={format_value(v)}" for k, v in point.items()) or "config"


def find_baseline(points: Sequence[dict[str, Any]], resolved: Sequence[dict[str, Any]],
                  expr: str | None) -> int:
    """Index of the baseline: the first point whose resolved config has KEY=VALUE, else 0.

    Matching the resolved config (not only the swept keys) lets `--baseline algorithm=dflash`
    name the config file's own setting when algorithm is not swept.
    """
    if expr is None:
        return 0
    key, rest = parse_assignment(expr)
    want = parse_value(rest)
    for i, (point, cfg) in enumerate(zip(points, resolved, strict=True)):
        have = point[key] if key in point else get_dotted(cfg, key, None)
        if have == want or format_value(have) == format_value(want):
            return i
    raise SweepError(f"--baseline {expr}: no configuration in the sweep has {key}={rest}")


@dataclass(frozen=True)
class Dropped:
    """A sweep point that would start the same server as an earlier one."""

    index: int
    same_as: int
    ignored: tuple[str, ...]  # the swept keys whose values differ, which the server ignores


def duplicate_points(points: Sequence[dict[str, Any]],
                     rendered: Sequence[Any]) -> list[Dropped]:
    """Points whose rendered server (argv and environment) equals an earlier point's.

    `rendered[i]` is anything comparable that is all the server sees (serve's argv and env),
    so `algorithm=dflash` with different `ddtree.budget`s is one server, not three.
    """
    first: dict[Any, int] = {}
    out: list[Dropped] = []
    for i, (point, key) in enumerate(zip(points, rendered, strict=True)):
        if key in first:
            j = first[key]
            ignored = tuple(k for k in point if points[j].get(k) != point[k])
            out.append(Dropped(i, j, ignored))
        else:
            first[key] = i
    return out
