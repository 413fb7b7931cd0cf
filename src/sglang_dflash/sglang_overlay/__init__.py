"""The DDTree mode of SGLang 0.5.17's DFLASH, delivered through SGLang's plugin hooks.

``settings`` and ``diagnostics.plant`` are pure (no torch, no SGLang); ``verify`` and
``draft_head`` need torch only; ``hooks`` imports SGLang lazily inside each hook; ``worker``
imports SGLang at module level and is loaded only by the ``create_worker`` hook inside an
SGLang process. ``diagnostics`` holds the test-only and diagnostic code (plant, profiler,
tracer), each switched on by its own ``SGLANG_DFLASH_*`` variable.
"""
