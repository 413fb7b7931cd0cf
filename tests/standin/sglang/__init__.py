"""Stand-in `sglang` package for tests on machines without a GPU (see ../README.md)."""

__version__ = "0.5.17"
