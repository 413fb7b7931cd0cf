"""--plot: output tokens/s and acceptance length against the DDTree budget.

matplotlib is optional (the `bench` extra); the series are computed by a pure function
so the plot's content is tested without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from sglang_dflash.bench.report import ConfigResult
from sglang_dflash.bench.stats import Summary
from sglang_dflash.bench.sweep import format_value

BUDGET_KEY = "ddtree.budget"
MISSING_MSG = ("--plot needs matplotlib, which is not installed: "
               "pip install 'sglang-dflash[bench]' (or matplotlib)")


def require_matplotlib() -> Any:
    """pyplot with the file-only Agg backend; ImportError with a one-line reason if missing."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise ImportError(MISSING_MSG) from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def series(configs: Sequence[ConfigResult], summaries: Sequence[Summary],
           x_key: str = BUDGET_KEY) -> tuple[str, dict[str, list[tuple[Any, float | None,
                                                                           float | None]]]]:
    """(x axis name, {series label: [(x, tok/s, accept len), ...]}).

    With x_key swept, x is its value and each series is the other swept keys at one
    concurrency; otherwise x is the configuration's label (one point per configuration).
    """
    by_label = {c.label: c for c in configs}
    swept = any(x_key in c.point for c in configs)
    out: dict[str, list[tuple[Any, float | None, float | None]]] = {}
    for s in summaries:
        cfg = by_label.get(s.config)
        if cfg is None:
            continue
        if swept and x_key in cfg.point:
            rest = " ".join(f"{k}={format_value(v)}" for k, v in cfg.point.items() if k != x_key)
            name = f"{rest} c={s.concurrency}".strip()
            x = cfg.point[x_key]
        else:
            name, x = f"c={s.concurrency}", s.config
        out.setdefault(name, []).append((x, s.output_tokens_per_s, s.accept_length))
    for pts in out.values():
        if swept:
            pts.sort(key=lambda p: p[0])
    return (x_key if swept else "configuration"), out


MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")
SPREAD = 0.3  # the series at one x share this width (budget: in log2 units; else: slots)


def spread(i: int, n: int, width: float = SPREAD) -> float:
    """Offset of series i of n around its x, so equal values do not hide each other."""
    return 0.0 if n < 2 else (i - (n - 1) / 2) * width / (n - 1)


def write_plot(path: str, configs: Sequence[ConfigResult], summaries: Sequence[Summary]) -> None:
    plt = require_matplotlib()
    x_name, data = series(configs, summaries)
    fig, (ax_t, ax_a) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    slots = {str(p[0]): k for k, p in enumerate(
        dict.fromkeys(str(p[0]) for pts in data.values() for p in pts))} \
        if x_name == "configuration" else {}
    nan = float("nan")
    for i, (name, pts) in enumerate(sorted(data.items())):
        d = spread(i, len(data))
        if x_name == "configuration":
            xs = [slots[str(p[0])] + d for p in pts]
        else:
            xs = [p[0] * 2 ** d for p in pts]
        style = {"marker": MARKERS[i % len(MARKERS)], "label": name, "alpha": 0.85}
        ax_t.plot(xs, [nan if p[1] is None else p[1] for p in pts], **style)
        ax_a.plot(xs, [nan if p[2] is None else p[2] for p in pts], **style)
    if x_name == "configuration":
        ax_a.set_xticks(list(slots.values()), list(slots))
        ax_a.set_xlim(-0.5, len(slots) - 0.5)
    if x_name == BUDGET_KEY:
        budgets = sorted({p[0] for pts in data.values() for p in pts})
        ax_t.set_xscale("log", base=2)
        ax_a.set_xticks(budgets, [str(b) for b in budgets])
        ax_a.minorticks_off()
    ax_t.set_ylabel("output tokens/s")
    ax_a.set_ylabel("acceptance length")
    ax_a.set_xlabel(x_name)
    ax_t.legend(fontsize="small")
    ax_t.grid(True, alpha=0.3)
    ax_a.grid(True, alpha=0.3)
    fig.suptitle("sglang-dflash bench")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
