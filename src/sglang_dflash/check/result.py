"""Typed check results and their two renderings (one line each, or JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

PASS = "PASS"
FAIL = "FAIL"
SKIP = "SKIP"


@dataclass(frozen=True)
class Result:
    """One check's outcome: what was found, and how to fix it when it failed."""

    layer: str
    name: str
    status: str
    found: str
    fix: str = ""

    @property
    def id(self) -> str:
        return f"{self.layer}.{self.name}"


def passed(layer: str, name: str, found: str) -> Result:
    return Result(layer, name, PASS, found)


def failed(layer: str, name: str, found: str, fix: str = "") -> Result:
    return Result(layer, name, FAIL, found, fix)


def skipped(layer: str, name: str, reason: str) -> Result:
    return Result(layer, name, SKIP, reason)


def render_line(r: Result) -> str:
    line = f"{r.status} {r.id}: {r.found}"
    return f"{line} — fix: {r.fix}" if r.fix else line


def summary(results: Iterable[Result]) -> dict[str, int | bool]:
    results = list(results)
    counts = {s.lower(): sum(r.status == s for r in results) for s in (PASS, FAIL, SKIP)}
    return {**counts, "ok": counts["fail"] == 0}


def render_text(results: list[Result]) -> str:
    s = summary(results)
    lines = [render_line(r) for r in results]
    lines.append(f"{'OK' if s['ok'] else 'FAILED'}: {s['pass']} passed, "
                 f"{s['fail']} failed, {s['skip']} skipped")
    return "\n".join(lines)


def render_json(results: list[Result]) -> str:
    return json.dumps({"results": [asdict(r) for r in results], "summary": summary(results)},
                      indent=2)


def exit_code(results: Iterable[Result]) -> int:
    return 0 if summary(results)["ok"] else 1


def shorten(items: list[str], limit: int = 5) -> str:
    """'a, b, c and 7 more' — keep one line readable when many things fail."""
    head = ", ".join(items[:limit])
    return head if len(items) <= limit else f"{head} and {len(items) - limit} more"
