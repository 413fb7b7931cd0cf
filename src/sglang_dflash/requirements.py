"""PEP 508 requirements, PEP 440 specifiers and environment markers, with the stdlib only.

The subset real wheels and uv.lock use: enough to read a distribution's Requires-Dist, decide
which lines apply to an interpreter, and judge an installed version against a specifier. Used
by `sglang-dflash check` (on any Python >= 3.11, before anything else is installed) and by
scripts/gpu_stage.py; `packaging` is not required for either.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass


class RequirementError(ValueError):
    """A requirement, marker, specifier or version this module cannot read (one line)."""


def marker_env() -> dict[str, str]:
    """The marker variables of the running interpreter (PEP 508), ``extra`` left empty."""
    impl = sys.implementation
    full = platform.python_version()
    return {
        "python_version": ".".join(full.split(".")[:2]),
        "python_full_version": full,
        "implementation_name": impl.name,
        "implementation_version": ".".join(str(x) for x in impl.version[:3]),
        "platform_python_implementation": platform.python_implementation(),
        "sys_platform": sys.platform,
        "platform_machine": platform.machine(),
        "platform_system": platform.system(),
        "platform_release": platform.release(),
        "os_name": os.name,
        "extra": "",
    }


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0]))


def _compare(op: str, lhs: str, rhs: str) -> bool:
    if op in ("==", "!=") and rhs.endswith(".*"):
        prefix = _version_tuple(rhs[:-2])
        hit = _version_tuple(lhs)[: len(prefix)] == prefix
        return hit if op == "==" else not hit
    numeric = bool(re.fullmatch(r"[\d.]+", lhs)) and bool(re.fullmatch(r"[\d.]+", rhs))
    a, b = (_version_tuple(lhs), _version_tuple(rhs)) if numeric else (lhs, rhs)
    ops = {
        "==": a == b,
        "!=": a != b,
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
        "===": lhs == rhs,
    }
    if op in ("in", "not in"):
        return (lhs in rhs) == (op == "in")
    if op not in ops:
        raise RequirementError(f"unsupported marker operator {op!r}")
    return ops[op]


_TOKEN = re.compile(
    r"""\s*(\(|\)|'[^']*'|"[^"]*"|===|==|!=|<=|>=|<|>|(?:not\s+in|in|and|or)\b|[A-Za-z_.]+)"""
)


def eval_marker(marker: str, env: dict[str, str]) -> bool:
    """Evaluate a PEP 508 environment marker (the subset uv.lock writes) for `env`."""
    tokens, pos = [], 0
    while pos < len(marker.rstrip()):
        m = _TOKEN.match(marker, pos)
        if not m:
            raise RequirementError(f"cannot parse marker {marker!r}")
        tok = m.group(1)
        tokens.append("not in" if tok.startswith("not") else tok)
        pos = m.end()

    def value(tok: str) -> str:
        if tok[0] in "'\"":
            return tok[1:-1]
        if tok == "extra":
            return env.get("extra", "")
        if tok not in env:
            raise RequirementError(f"unknown marker variable {tok!r} in {marker!r}")
        return env[tok]

    def atom(i: int) -> tuple[bool, int]:
        if tokens[i] == "(":
            v, i = disj(i + 1)
            return v, i + 1
        return _compare(tokens[i + 1], value(tokens[i]), value(tokens[i + 2])), i + 3

    def conj(i: int) -> tuple[bool, int]:
        v, i = atom(i)
        while i < len(tokens) and tokens[i] == "and":
            w, i = atom(i + 1)
            v = v and w
        return v, i

    def disj(i: int) -> tuple[bool, int]:
        v, i = conj(i)
        while i < len(tokens) and tokens[i] == "or":
            w, i = conj(i + 1)
            v = v or w
        return v, i

    result, end = disj(0)
    if end != len(tokens):
        raise RequirementError(f"cannot parse marker {marker!r}")
    return result


@dataclass(frozen=True)
class Req:
    """One applicable requirement of a wheel's Requires-Dist: name and specifier (may be "")."""

    name: str
    spec: str
    extras: tuple[str, ...] = ()  # the extras requested of it (`flashinfer_python[cu13]`)

    @property
    def exact(self) -> bool:
        """`==` (wildcards too), `===` or `~=`: the wheel wants one release (series)."""
        return any(c.strip()[:2] in ("==", "~=") for c in self.spec.split(","))


def metadata_headers(text: str, key: str) -> list[str]:
    """The values of header `key` in a METADATA file (the part before the body)."""
    head = text.replace("\r\n", "\n").split("\n\n", 1)[0]
    prefix = key.lower() + ":"
    return [ln[len(prefix) :].strip() for ln in head.splitlines() if ln.lower().startswith(prefix)]


_REQ = re.compile(
    r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*\(?([^;()]*)\)?\s*(?:;(.*))?$"
)
_PHASE = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "": 4, "post": 5}


def version_key(v: str) -> tuple:
    """A sort key for the PEP 440 versions met here (release, dev/a/b/rc < final < post)."""
    m = re.match(r"v?(\d+(?:\.\d+)*)[._-]?(dev|alpha|beta|a|b|c|rc|post)?[._-]?(\d*)", v.strip())
    if not m:
        raise RequirementError(f"cannot read version {v!r}")
    release = tuple(int(x) for x in m.group(1).split("."))
    release += (0,) * (8 - len(release))
    return release, _PHASE[m.group(2) or ""], int(m.group(3) or 0)


def satisfies(version: str, spec: str) -> bool:
    """Does `version` meet every clause of a PEP 440 specifier such as `>=1.2,<2` or `~=1.4.2`?"""
    key = version_key(version)
    for clause in (c.strip() for c in spec.split(",")):
        if not clause:
            continue
        m = re.fullmatch(r"(===|==|!=|~=|<=|>=|<|>)\s*(\S+)", clause)
        if not m:
            raise RequirementError(f"cannot read specifier {clause!r}")
        op, rhs = m.groups()
        if op == "===":
            ok = version == rhs
        elif rhs.endswith(".*"):
            prefix = tuple(int(x) for x in rhs[:-2].split("."))
            hit = key[0][: len(prefix)] == prefix
            ok = hit if op == "==" else not hit
        elif op == "~=":
            parts = rhs.split(".")
            upper = tuple(int(x) for x in parts[:-1])
            ok = key >= version_key(rhs) and key[0][: len(upper)] == upper
        else:
            r = version_key(rhs)
            ok = {
                "==": key == r,
                "!=": key != r,
                "<": key < r,
                "<=": key <= r,
                ">": key > r,
                ">=": key >= r,
            }[op]
        if not ok:
            return False
    return True


def requirements(
    requires: Iterable[str], env: dict[str, str], extras: Iterable[str] = ()
) -> list[Req]:
    """The requirements that apply in `env` with `extras` requested.

    A marker this evaluator cannot read counts as applying: a pin is never silently lost.
    """
    out = []
    for req in requires:
        m = _REQ.match(req)
        if not m:
            raise RequirementError(f"cannot parse requirement {req!r}")
        name, spec, marker = normalize(m.group(1)), m.group(3).strip(), (m.group(4) or "").strip()
        if marker:
            applies = False
            for extra in ("", *extras):
                try:
                    applies = eval_marker(marker, dict(env, extra=extra))
                except RequirementError:
                    applies = True
                if applies:
                    break
            if not applies:
                continue
        wanted = tuple(sorted(normalize(e) for e in (m.group(2) or "").strip("[]").split(",")
                              if e.strip()))
        out.append(Req(name, spec, wanted))
    return out
