"""What an instance config (`check --config FILE`) tells the live layer to expect.

Pure decisions only: the config is loaded and validated by `sglang_dflash.config`;
flags given on the command line win over the config, value by value.
"""

from __future__ import annotations

from dataclasses import replace

from sglang_dflash.check.live import Expectations, expectations_from
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
