"""`sglang-dflash unit`: the hardened unit for non-NixOS hosts, from the shared directives."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dflash.config import parse_config
from sglang_dflash.unit import (
    UnitOptions,
    directive_lines,
    load_hardening,
    quote_exec_arg,
    render_unit,
)
from tests.systemd_unit.systemd_tools import analyze_verify, package_prefix

ROOT = Path(__file__).parents[2]
MODULE = ROOT / "modules" / "sglang-dflash.nix"
BASE = {"name": "qwen", "model": "Qwen/Qwen3-8B", "draftModel": "z-lab/d",
        "algorithm": "ddtree", "gpus": [0]}
EXPOSURE_TARGET = 3.5


def unit_lines(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def render(raw: dict | None = None, **opts) -> str:
    cfg = parse_config({**BASE, **(raw or {})})
    return render_unit(cfg, "/etc/sglang-dflash/qwen.json", UnitOptions(**opts))


def test_unit_has_lifecycle_hardening_and_commands():
    lines = unit_lines(render())
    assert lines["Type"] == ["notify"]
    assert lines["Restart"] == ["on-failure"]
    assert lines["DynamicUser"] == ["true"]
    assert lines["DevicePolicy"] == ["closed"]
    assert "char-nvidia-uvm rw" in lines["DeviceAllow"]
    assert lines["CapabilityBoundingSet"] == [""]
    assert lines["UMask"] == ["0077"]
    exe = "/nix/var/nix/profiles/sglang-dflash/bin/sglang-dflash"
    assert lines["ExecStartPre"] == [
        f"{exe} check --offline --config /etc/sglang-dflash/qwen.json"]  # as the NixOS module
    assert lines["ExecStart"] == [f"{exe} serve --config /etc/sglang-dflash/qwen.json"]
    assert lines["TimeoutStartSec"] == ["2100s"]
    assert 'Environment="LD_LIBRARY_PATH=/run/opengl-driver/lib"' in render()
    assert "LoadCredential" not in lines


def test_every_shared_directive_is_rendered_exactly():
    lines = unit_lines(render())
    shared = load_hardening()
    for entry in shared["unit"] + shared["lifecycle"] + shared["hardening"]:
        expected = directive_lines([entry])
        assert [f"{entry['key']}={v}" for v in lines[entry["key"]]] == expected, entry["key"]
        assert entry["why"].strip(), f"{entry['key']} has no reason"


def test_options_change_the_unit():
    text = render({"apiKeyFile": "/etc/sglang/key", "preflight": False, "startTimeout": 60},
                  package_path="/opt/sd", driver_lib_dir="/usr/lib/nvidia-only",
                  environment_file="/etc/sglang/env", user="svc", group="gpu")
    lines = unit_lines(text)
    assert lines["LoadCredential"] == ["api-key:/etc/sglang/key"]
    assert "ExecStartPre" not in lines
    assert lines["ExecStart"][0].startswith("/opt/sd/bin/sglang-dflash serve")
    assert lines["EnvironmentFile"] == ["/etc/sglang/env"]
    assert lines["User"] == ["svc"] and lines["Group"] == ["gpu"]
    assert "DynamicUser" not in lines
    assert lines["TimeoutStartSec"] == ["360s"]
    assert '"TRITON_LIBCUDA_PATH=/usr/lib/nvidia-only"' in text


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [("/etc/a.json", "/etc/a.json"), ("/etc/my dir/a.json", '"/etc/my dir/a.json"'),
     ("/x/50%", "/x/50%%"), ("/x/$HOME", "/x/$$HOME"), ('/x/"q"', '"/x/\\"q\\""')],
)
def test_exec_arguments_are_quoted_for_systemd(arg, quoted):
    assert quote_exec_arg(arg) == quoted


def test_module_reads_the_same_hardening_file():
    text = MODULE.read_text()
    assert "lib.importJSON ../src/sglang_dflash/unit-hardening.json" in text
    # the module states none of the shared directives itself
    shared = load_hardening()
    for entry in shared["unit"] + shared["lifecycle"] + shared["hardening"]:
        assert not re.search(rf"^\s*{entry['key']}\s*=", text, re.M), entry["key"]


def run_cli(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    """`sglang-dflash unit ARGS`; a fixed --package-path unless ARGS name one, so the unit does
    not depend on where this interpreter lives (its prefix may be under /home or /tmp)."""
    if "--package-path" not in args:
        args = ("--package-path", "/opt/sglang-dflash", *args)
    return subprocess.run([python, "-m", "sglang_dflash", "unit", *args],
                          capture_output=True, text=True, timeout=30)


def test_package_path_defaults_to_this_environment_and_says_so(visible_tmp):
    """Without Nix the unit runs the sglang-dflash of the environment `unit` runs from."""
    config = visible_tmp / "qwen.json"
    config.write_text(json.dumps(BASE))
    r = subprocess.run([sys.executable, "-m", "sglang_dflash", "unit", "--config", str(config)],
                       capture_output=True, text=True, timeout=30)
    prefix = os.path.abspath(sys.prefix)
    assert f"note: the unit runs {prefix}/bin/sglang-dflash" in r.stderr, r.stderr
    if r.returncode == 0:
        assert f"ExecStart={prefix}/bin/sglang-dflash serve" in r.stdout
    else:  # this interpreter lives where the sandbox hides it (a venv under /home or /tmp)
        assert r.returncode == 2 and "--package-path" in r.stderr and "hidden" in r.stderr


def test_missing_api_key_file_is_a_one_line_note(visible_tmp):
    config = visible_tmp / "qwen.json"
    config.write_text(json.dumps({**BASE, "apiKeyFile": str(visible_tmp / "no-such-key")}))
    r = run_cli("--config", str(config))
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "apiKeyFile" in line]
    assert len(notes) == 1 and "does not exist" in notes[0], r.stderr
    (visible_tmp / "no-such-key").write_text("k\n")
    r = run_cli("--config", str(config))
    assert r.returncode == 0 and "apiKeyFile" not in r.stderr, r.stderr


def test_cli_writes_the_unit_and_refuses_bad_flags(visible_tmp, tmp_path):
    config = visible_tmp / "qwen.json"
    config.write_text(json.dumps(BASE))
    out = tmp_path / "sglang-dflash-qwen.service"
    r = run_cli("--config", str(config), "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert f"serve --config {config}" in out.read_text()
    r = run_cli("--config", str(config), "--package-path", "relative/path")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "absolute" in r.stderr
    r = run_cli("--config", str(config), "--group", "gpu")
    assert r.returncode == 2 and "--group needs --user" in r.stderr


def exposure(unit_file: Path) -> float:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    r = subprocess.run([analyze, "security", "--offline=true", "--no-pager", str(unit_file)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


@pytest.mark.parametrize("variant", [{}, {"apiKeyFile": "/etc/k"}, {"algorithm": "none"}])
def test_systemd_analyze_exposure_within_target(tmp_path, variant):
    path = tmp_path / "sglang-dflash-qwen.service"
    path.write_text(render(variant))
    score = exposure(path)
    assert score <= EXPOSURE_TARGET, f"exposure {score} > {EXPOSURE_TARGET}"


def test_systemd_analyze_verify_accepts_the_unit(tmp_path, visible_tmp):
    """systemd's own parser: only the keys newer than this systemd may be reported."""
    prefix = visible_tmp / "prefix"
    package_prefix(prefix)
    unit = tmp_path / "sglang-dflash-qwen.service"
    unit.write_text(render({"apiKeyFile": "/etc/k"}, package_path=str(prefix),
                           environment_file="/etc/sglang/env"))
    rc, problems, output = analyze_verify(unit, tmp_path)
    assert rc == 0, output
    assert problems == []


@pytest.mark.parametrize(
    ("where", "raw", "flags", "directive"),
    [
        ("config", {}, (), "PrivateTmp"),  # the config itself in pytest's /tmp
        ("visible", {"model": "/home/me/models/qwen"}, (), "ProtectHome"),
        ("visible", {"draftModel": "/var/tmp/draft"}, (), "PrivateTmp"),
        ("visible", {"cacheDir": "/tmp/hf"}, (), "PrivateTmp"),
        ("visible", {}, ("--package-path", "/tmp/prefix"), "PrivateTmp"),
        ("visible", {}, ("--driver-lib-dir", "/home/nv"), "ProtectHome"),
    ],
)
def test_cli_refuses_paths_the_sandbox_hides(tmp_path, visible_tmp, where, raw, flags, directive):
    """Found under a real systemd (tests/systemd_unit/test_systemd_boot.py): a unit whose config or
    program sits in /tmp can never start, because PrivateTmp gives the service an empty /tmp."""
    base = tmp_path if where == "config" else visible_tmp
    config = base / "qwen.json"
    config.write_text(json.dumps({**BASE, **raw}))
    r = run_cli("--config", str(config), *flags)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"hidden from the service by {directive}=true" in r.stderr


def test_cli_accepts_hub_ids_and_files_systemd_reads_itself(visible_tmp):
    """A Hugging Face id is no path; EnvironmentFile= and the API key (LoadCredential=) are
    read by systemd before the sandbox applies, so /root is fine for them."""
    config = visible_tmp / "qwen.json"
    config.write_text(json.dumps({**BASE, "model": "Qwen/Qwen3-8B", "apiKeyFile": "/root/key"}))
    r = run_cli("--config", str(config), "--environment-file", "/root/sglang.env")
    assert r.returncode == 0, r.stderr
    assert "EnvironmentFile=/root/sglang.env" in r.stdout
    assert "LoadCredential=api-key:/root/key" in r.stdout
