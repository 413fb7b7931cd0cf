"""SGLang plugin entry point (group ``sglang.srt.plugins``): installs the DDTree mode of DFLASH.

SGLang calls ``register()`` with no arguments early in every process (launcher, engine,
scheduler), then applies the registered ``HookRegistry`` hooks. Without
``SGLANG_DFLASH_DDTREE_BUDGET`` nothing is registered and stock DFlash runs untouched. An
invalid budget still registers the hooks, so the launcher's argument handling fails with a
one-line reason (exceptions raised here would only be logged by SGLang's plugin loader).
"""

from __future__ import annotations

import logging
import os

from sglang_dflash.sglang_overlay import settings

logger = logging.getLogger(__name__)


def register() -> list[str]:
    """Register the DDTree hooks when the switch is set; returns the hooked targets."""
    if not settings.is_requested():
        return []
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_dflash.sglang_overlay.hooks import register_all

    targets = register_all(HookRegistry, HookType)
    plant = os.environ.get(settings.PLANT_ENV, "").strip()
    if plant:
        logger.warning(
            "!!! %s=%s is set: TEST-ONLY planted draft source. DDTree drafts will be "
            "overwritten from that file. Never use this in production. !!!",
            settings.PLANT_ENV,
            plant,
        )
    logger.info(
        "sglang-dflash: DDTree mode requested (%s=%s); hooks registered on %d targets.",
        settings.BUDGET_ENV,
        os.environ.get(settings.BUDGET_ENV),
        len(targets),
    )
    return targets
