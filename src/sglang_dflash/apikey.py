"""An instance's API key, read the way the unit delivers it; shared by `serve` and `check`.

A library module so `check` does not import the launcher to read a key file.
"""

from __future__ import annotations

from pathlib import Path

from sglang_dflash.config import ConfigError, InstanceConfig

CREDENTIAL_NAME = "api-key"  # LoadCredential=api-key:<apiKeyFile> in the unit


def read_api_key(cfg: InstanceConfig, environ: dict[str, str]) -> str | None:
    """The key from systemd's credential if the unit loaded one, else from apiKeyFile."""
    if cfg.api_key_file is None:
        return None
    source = Path(cfg.api_key_file)
    cred_dir = environ.get("CREDENTIALS_DIRECTORY")
    if cred_dir and (Path(cred_dir) / CREDENTIAL_NAME).is_file():
        source = Path(cred_dir) / CREDENTIAL_NAME
    try:
        key = source.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise ConfigError(f"apiKeyFile: cannot read {source}: {why}") from None
    if not key or "\n" in key:
        raise ConfigError(f"apiKeyFile: {source} must hold exactly one non-empty line")
    return key
