"""What an instance config (`check --config FILE`) tells the checks: what the live layer
expects, and (the models layer) where the server will find its models.

The config is loaded and validated by `sglang_dflash.config`; flags given on the command
line win over the config, value by value. The models layer reads the file system only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from sglang_dflash.check.live import Expectations, expectations_from
from sglang_dflash.check.result import SKIP, Result, failed, passed
from sglang_dflash.config import InstanceConfig
from sglang_dflash.hosts import local_url


def config_url(cfg: InstanceConfig) -> str:
    """The server's base URL from its bind address (a wildcard is reached on loopback)."""
    return local_url(cfg.host, cfg.port)


def merged_expectations(cfg: InstanceConfig | None, algorithm: str | None,
                        draft_model: str | None, ddtree_budget: int | None,
                        ddtree_policy: str | None = None) -> Expectations:
    """Flags first, then the config; ValueError (one line) for an impossible combination.

    The config's draft model is expected only when speculation is expected, and its
    DDTree budget only when both the config and the expectation are DDTree: a config's
    `ddtree.budget` means nothing for a DFlash instance.
    """
    if cfg is None:
        return expectations_from(algorithm, draft_model, ddtree_budget, ddtree_policy)
    algo = (algorithm if algorithm is not None else cfg.algorithm).lower()
    if draft_model is None and algo != "none" and cfg.speculative:
        draft_model = cfg.draft_model
    if algo == "ddtree" and cfg.algorithm == "ddtree":
        if ddtree_budget is None:
            ddtree_budget = cfg.ddtree.budget
        if ddtree_policy is None:
            ddtree_policy = cfg.ddtree.policy
    exp = expectations_from(algo, draft_model, ddtree_budget, ddtree_policy)
    return replace(exp, metrics=True) if cfg.metrics_enable else exp


# ---- the models layer: can the server find its models offline? -------------------------------

MODELS_LAYER = "models"


def model_results(cfg: InstanceConfig, config_path: str, environ: Mapping[str, str]
                  ) -> list[Result]:
    """One line per model SGLang loads. A local directory must exist; on an offline instance
    a hub model must be a complete snapshot in the hub cache serve points SGLang at (the
    server runs with HF_HUB_OFFLINE=1); an unpinned hub model SKIPs with a warning. Reads
    the file system only (no network)."""
    from sglang_dflash.models import hub_cache_dir, needed, snapshot_dir, snapshot_problem

    fetch = f"sglang-dflash fetch-models --config {config_path}"
    loader = f"systemctl start sglang-dflash-{cfg.name}-models.service"
    cache = hub_cache_dir(cfg, environ)
    out: list[Result] = []
    for ref in needed(cfg):
        if ref.local:
            if Path(ref.model).is_dir():
                out.append(passed(MODELS_LAYER, ref.key, f"{ref.model} is a local directory"))
            else:
                out.append(failed(MODELS_LAYER, ref.key,
                                  f"{ref.model} is not a directory (a local model path)",
                                  f"put the model there, or set {ref.key} to a hub id"))
        elif not cfg.offline:
            if ref.pinned:
                why = "the instance is not offline: offline=false, or another model is unpinned"
                fix = "pin every hub model to a commit, or set offline=true"
            else:
                why = ("no revision" if ref.revision is None else
                       f"revision {ref.revision!r} is not a commit")
                fix = f"set {ref.key}Revision to a 40-hex commit to serve offline"
            out.append(Result(MODELS_LAYER, ref.key, SKIP,
                              f"warning: hub id {ref.label()} is not served offline ({why}): "
                              "SGLang downloads or resolves it at start (needs the network)",
                              fix))
        else:
            rev = str(ref.revision)
            problem = snapshot_problem(cache, ref.model, rev)
            if problem is None:
                out.append(passed(MODELS_LAYER, ref.key, f"{ref.model}@{rev} in "
                                  f"{snapshot_dir(cache, ref.model, rev)}"))
            else:
                out.append(failed(MODELS_LAYER, ref.key,
                                  f"{ref.model}@{rev} is not in the cache and the server is "
                                  f"offline ({problem})", f"{fetch} (or {loader})"))
    return out
