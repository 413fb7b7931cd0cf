"""The probes' one output line, shared by the scripts that run inside the SGLang CPU env and
by the tests that read them (``test_sglang_hooks._run_script``): ``PROBE-JSON <object>``, and
``{"crash": <traceback>}`` when the probe itself raised."""

from __future__ import annotations

import json
import traceback

PREFIX = "PROBE-JSON "


def report(main, *args) -> None:
    """Run ``main(*args)`` and print its result (or the traceback) as the one line."""
    try:
        result = main(*args)
    except Exception:
        result = {"crash": traceback.format_exc()}
    print(PREFIX + json.dumps(result))
