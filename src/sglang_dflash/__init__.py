"""sglang-dflash: SGLang with DFlash/DDTree speculative decoding, pinned and self-verifying."""

__version__ = "0.1.0"
