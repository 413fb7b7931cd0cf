"""Test-only and diagnostic code of the DDTree worker, never on the production path.

Each module is imported (by the worker's loaders and the launcher hook) and acts only when
its ``SGLANG_DFLASH_*`` variable is set (tests/overlay/test_worker_layout.py): ``plant``
(and its host oracle ``plant_oracle``) with ``SGLANG_DFLASH_DDTREE_PLANT``, ``profile`` with
``SGLANG_DFLASH_DDTREE_PROFILE``, ``trace`` with ``SGLANG_DFLASH_DDTREE_TRACE``. With the
variable unset nothing here reads a file, records an event or starts a profiler.
"""
