"""scripts/gpu_pair_carry.py: a trained pair carried to a later lease in checked parts.

The calls it writes run here as they would on the device (bash, sha256sum, tar), into temporary
directories in place of /root."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from .helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_pair_carry.py"


def _pair(root: Path) -> dict[str, bytes]:
    files = {
        "target/config.json": b'{"architectures": ["Qwen3ForCausalLM"]}',
        "target/model.safetensors": os.urandom(int(2.5 * 1024 * 1024)),
        "target/tokenizer.json": b"{}",
        "draft/config.json": b'{"architectures": ["DFlashDraftModel"]}',
        "draft/model.safetensors": os.urandom(300_000),
        "prompts.jsonl": b'{"input_ids": [1, 2]}\n',
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    named = ("target/model.safetensors", "target/tokenizer.json", "draft/model.safetensors",
             "prompts.jsonl")
    report = {"sha256": {rel: hashlib.sha256(files[rel]).hexdigest() for rel in named}}
    (root / "report.json").write_text(json.dumps(report))
    files["report.json"] = (root / "report.json").read_bytes()
    return files


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_parts_travel_and_the_last_call_rebuilds_the_checked_pair(tmp_path):
    pair, out, dev = tmp_path / "pair", tmp_path / "stage-pair", tmp_path / "dev"
    files = _pair(pair)
    r = _run("--pair", str(pair), "--out", str(out), "--part-mib", "1",
             "--dest", str(dev / "pair"), "--remote", str(dev / "parts"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 part(s)" in r.stdout and "4 files checked" in r.stdout
    calls = json.loads((out / "calls.json").read_text())
    assert len(calls) == 3
    for c in calls:  # carried paths are relative to the repository root (here tmp_path)
        assert all(not Path(p).is_absolute() and (tmp_path / p).is_file()
                   and (tmp_path / p).parent == out for p in c["carry"])
    for i, c in enumerate(calls):
        done = subprocess.run(["bash", "-c", c["command"]], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"pair part {i + 1}/3 ok" in done.stdout
    assert "pair ok" in done.stdout
    for rel, data in files.items():
        assert (dev / "pair" / rel).read_bytes() == data
    # a stale part of an earlier, longer carry does not join the next reassembly
    (dev / "parts" / "pair.tgz.part-07").write_bytes(b"stale")
    # a second carry into the same machine replaces the pair, not nests it
    for c in calls:
        assert subprocess.run(["bash", "-c", c["command"]], cwd=tmp_path,
                              capture_output=True, timeout=60).returncode == 0
    assert not (dev / "pair" / "pair").exists()


def test_a_part_damaged_on_the_way_stops_its_call(tmp_path):
    pair, out, dev = tmp_path / "pair", tmp_path / "stage-pair", tmp_path / "dev"
    _pair(pair)
    assert _run("--pair", str(pair), "--out", str(out), "--part-mib", "1",
                "--dest", str(dev / "pair"), "--remote", str(dev / "parts"),
                cwd=tmp_path).returncode == 0
    part = out / "pair.tgz.part-01"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    calls = json.loads((out / "calls.json").read_text())
    assert subprocess.run(["bash", "-c", calls[0]["command"]], cwd=tmp_path,
                          capture_output=True, timeout=60).returncode == 0
    bad = subprocess.run(["bash", "-c", calls[1]["command"]], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "FAILED" in bad.stdout + bad.stderr


def test_weights_that_are_not_the_reports_are_refused_in_one_line(tmp_path):
    pair = tmp_path / "pair"
    _pair(pair)
    (pair / "draft/model.safetensors").write_bytes(b"another drafter")
    r = _run("--pair", str(pair), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert "draft/model.safetensors" in r.stderr and "not the report's" in r.stderr
    assert not (tmp_path / "o").exists()
    r = _run("--pair", str(tmp_path / "none"), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "report" in r.stderr
    r = _run("--pair", str(pair), "--out", str(tmp_path / "o"), "--part-mib", "0",
             cwd=tmp_path)
    assert r.returncode == 2 and "--part-mib" in r.stderr
    r = _run("--pair", str(pair), "--out", str(tmp_path / "o"), cwd=REPO)
    assert r.returncode == 2 and "inside the repository" in r.stderr
