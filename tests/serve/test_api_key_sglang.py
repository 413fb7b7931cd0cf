"""The key file serve writes is read back by SGLang 0.5.17's own --config merger.

Loads `sglang/srt/server_args_config_parser.py` (stdlib + PyYAML only) from an unpacked
SGLang 0.5.17 wheel: $SGLANG_DFLASH_SGLANG_DIR, else the SGLang CPU env CI builds
($SGLANG_DFLASH_SGLANG_SITE, tests/overlay/install_sglang_cpu.sh). Skips otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

import pytest

from sglang_dflash.serve import write_key_config


def _sglang_dir() -> Path:
    explicit = os.environ.get("SGLANG_DFLASH_SGLANG_DIR")
    if explicit:
        return Path(explicit)
    venv = os.environ.get("SGLANG_DFLASH_SGLANG_SITE", "").strip()
    found = sorted(Path(venv).glob("lib/python3*/site-packages/sglang")) if venv else []
    return found[0] if found else Path("/tmp/sgl/sglang")


SGLANG_DIR = _sglang_dir()
PARSER_FILE = SGLANG_DIR / "srt" / "server_args_config_parser.py"


def load_merger():
    if not PARSER_FILE.is_file():
        pytest.skip(f"no unpacked SGLang at {SGLANG_DIR} (set SGLANG_DFLASH_SGLANG_DIR or "
                    "SGLANG_DFLASH_SGLANG_SITE)")
    pytest.importorskip("yaml", reason="SGLang's --config reader needs PyYAML")
    spec = importlib.util.spec_from_file_location("sglang_config_parser_under_test", PARSER_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ConfigArgumentMerger


@pytest.mark.parametrize("key", ["sk-plain", 'we"ird: #key \\ with {yaml} chars', "ключ-ü"])
def test_sglang_reads_the_key_file(tmp_path, key):
    merger_cls = load_merger()
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path")
    parser.add_argument("--api-key")
    parser.add_argument("--config")
    path = write_key_config(key, {"RUNTIME_DIRECTORY": str(tmp_path)})
    argv = ["--model-path", "m", "--config", str(path)]
    merged = merger_cls(parser).merge_config_with_args(argv)
    assert parser.parse_args(merged).api_key == key
