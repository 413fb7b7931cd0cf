"""Models fetched ahead: the config's `offline`, the cache layout, `fetch-models` (against a
stand-in huggingface_hub that writes the layout), the check's models layer and serve's env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dflash.config import ConfigError, parse_config, render_env
from sglang_dflash.models import (
    Backoff,
    FetchError,
    ModelRef,
    fetch,
    fetch_one,
    hub_cache_dir,
    hub_models,
    needs_loader,
    repo_folder,
    snapshot_dir,
    snapshot_problem,
)
from tests.conftest import REPO
from tests.models.fakehub import make_fake_hub, make_snapshot

SHA = "0123456789abcdef0123456789abcdef01234567"
SHA2 = "fedcba9876543210fedcba9876543210fedcba98"
PINNED = {"name": "q", "model": "Qwen/Qwen3-8B", "modelRevision": SHA,
          "draftModel": "z-lab/Qwen3-8B-DFlash-b16", "draftModelRevision": SHA2}


def cfg_of(**keys):
    return parse_config({**PINNED, **keys})


# ---- config: offline ------------------------------------------------------------------------


def test_offline_defaults_from_the_models():
    assert cfg_of().offline is True  # both pinned
    assert cfg_of(model="/srv/m", modelRevision=None, draftModel="./d").offline is True
    assert cfg_of(draftModelRevision="main").offline is False  # a branch moves
    assert cfg_of(modelRevision=None).offline is False
    # the draft of an algorithm "none" instance is never loaded
    assert cfg_of(algorithm="none", draftModelRevision=None).offline is True
    assert cfg_of(offline=False).offline is False


def test_offline_env_is_rendered_and_refused_in_environment():
    env = render_env(cfg_of(cacheDir="/var/cache/x"))
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == "/var/cache/x/huggingface"
    assert "HF_HUB_OFFLINE" not in render_env(cfg_of(modelRevision="v1.0"))
    with pytest.raises(ConfigError, match=r"^environment\.HF_HUB_OFFLINE: set `offline`"):
        cfg_of(environment={"HF_HUB_OFFLINE": "0"})


@pytest.mark.parametrize("keys, key", [
    ({"modelRevision": "main"}, "modelRevision"),
    ({"modelRevision": None}, "modelRevision"),
    ({"draftModelRevision": SHA.upper()}, "draftModelRevision"),
    ({"draftModelRevision": SHA[:12]}, "draftModelRevision"),
])
def test_offline_true_needs_a_commit(keys, key):
    with pytest.raises(ConfigError) as e:
        cfg_of(offline=True, **keys)
    msg = str(e.value)
    assert msg.startswith(f"{key}: offline serving of hub id") and "40 hex" in msg
    assert "\n" not in msg


def test_offline_must_be_a_boolean():
    with pytest.raises(ConfigError, match=r"^offline: must be a boolean"):
        cfg_of(offline="yes")


# ---- cache layout ---------------------------------------------------------------------------


def test_cache_paths_follow_huggingface_hub(tmp_path):
    cfg = cfg_of(cacheDir="/var/cache/sglang-dflash-q")
    cache = hub_cache_dir(cfg, {})
    assert cache == Path("/var/cache/sglang-dflash-q/huggingface/hub")
    assert repo_folder(cache, "Qwen/Qwen3-8B") == cache / "models--Qwen--Qwen3-8B"
    assert snapshot_dir(cache, "Qwen/Qwen3-8B", SHA) == (
        cache / "models--Qwen--Qwen3-8B" / "snapshots" / SHA)
    # no cacheDir: systemd's CACHE_DIRECTORY, as serve resolves it
    bare = cfg_of()
    assert hub_cache_dir(bare, {"CACHE_DIRECTORY": "/c/x:/c/y"}) == Path("/c/x/huggingface/hub")
    # environment's HF_HUB_CACHE wins, as it does in serve's child
    assert hub_cache_dir(cfg_of(environment={"HF_HUB_CACHE": "/m"}), {}) == Path("/m")
    assert hub_cache_dir(bare, {"HOME": str(tmp_path)}) == tmp_path / ".cache/huggingface/hub"
    # a branch resolves through refs/
    make_snapshot(tmp_path, "org/name", SHA, branch="main")
    assert snapshot_dir(tmp_path, "org/name", "main") == repo_folder(
        tmp_path, "org/name") / "snapshots" / SHA


def test_snapshot_presence(tmp_path):
    assert "no snapshot" in snapshot_problem(tmp_path, "org/name", SHA)
    snap = make_snapshot(tmp_path, "org/name", SHA)
    assert snapshot_problem(tmp_path, "org/name", SHA) is None
    (snap / "model.safetensors").symlink_to("../../blobs/gone")
    assert "dangling link" in snapshot_problem(tmp_path, "org/name", SHA)
    (snap / "model.safetensors").unlink()
    (repo_folder(tmp_path, "org/name") / "blobs" / "x.incomplete").write_text("")
    assert "interrupted download" in snapshot_problem(tmp_path, "org/name", SHA)
    (repo_folder(tmp_path, "org/name") / "blobs" / "x.incomplete").unlink()
    (snap / "config.json").unlink()
    assert "no config.json" in snapshot_problem(tmp_path, "org/name", SHA)


def test_which_models_need_fetching():
    assert [m.key for m in hub_models(cfg_of())] == ["model", "draftModel"]
    assert [m.key for m in hub_models(cfg_of(draftModel="/srv/d"))] == ["model"]
    assert needs_loader(cfg_of()) and not needs_loader(cfg_of(modelRevision="main"))
    assert not needs_loader(cfg_of(model="/srv/m", draftModel="/srv/d"))


# ---- fetch (in process, the downloader stubbed) ---------------------------------------------


def test_fetch_retries_with_backoff_then_succeeds(tmp_path):
    calls, slept, logged = [], [], []

    def flaky(repo_id, revision, cache_dir):
        calls.append((repo_id, revision, cache_dir))
        if len(calls) < 3:
            raise OSError("connection reset")
        make_snapshot(Path(cache_dir), repo_id, revision)
        return str(snapshot_dir(Path(cache_dir), repo_id, revision))

    ref = ModelRef("model", "org/name", SHA)
    out = fetch_one(ref, tmp_path, flaky, Backoff(5, 2, 60, 600), logged.append, slept.append)
    assert "fetched into" in out and len(calls) == 3 and slept == [2, 4]
    assert "attempt 1 failed (OSError: connection reset); retrying in 2s" in logged[0]
    # present now: no download at all
    assert "present in" in fetch_one(ref, tmp_path, None, Backoff(), logged.append)


def test_backoff_is_bounded():
    assert Backoff(5, 2, 60, 600).delays() == [2, 4, 8, 16]
    assert Backoff(8, 2, 10, 600).delays() == [2, 4, 8, 10, 10, 10, 10]
    assert Backoff(8, 2, 60, 10).delays() == [2, 4]  # total cap
    assert Backoff(1).delays() == []


def test_fetch_gives_up_and_does_not_retry_permanent_errors(tmp_path):
    def down(**_kw):
        raise OSError("no route to host")

    ref = ModelRef("model", "org/name", SHA)
    with pytest.raises(FetchError, match="gave up after 3 attempt") as e:
        fetch_one(ref, tmp_path, down, Backoff(3, 0, 0, 0), lambda _l: None, lambda _s: None)
    assert e.value.exit_code == 1

    class RevisionNotFoundError(Exception):
        pass

    calls = []

    def missing(**_kw):
        calls.append(1)
        raise RevisionNotFoundError("Invalid rev id")

    with pytest.raises(FetchError, match="not retried"):
        fetch_one(ref, tmp_path, missing, Backoff(5, 0, 0, 0), lambda _l: None)
    assert len(calls) == 1


def test_fetch_refuses_a_download_that_left_no_snapshot(tmp_path):
    ref = ModelRef("model", "org/name", SHA)
    with pytest.raises(FetchError, match="no snapshot"):
        fetch_one(ref, tmp_path, lambda **_kw: str(tmp_path), Backoff(1), lambda _l: None)


def test_fetch_of_local_models_needs_no_hub(tmp_path):
    cfg = cfg_of(model="/srv/m", draftModel="/srv/d")
    assert fetch(cfg, {}, Backoff(), print) == [
        "no hub model to fetch (every model is a local directory)"]


# ---- the commands, as processes -------------------------------------------------------------


@pytest.fixture
def fake_hub(tmp_path):
    return make_fake_hub(tmp_path / "fakehub")


def run_cli(*args, fake_hub=None, env=None, cwd=None):
    pp = [str(fake_hub)] if fake_hub else []
    base = {k: v for k, v in os.environ.items() if k not in ("CACHE_DIRECTORY", "HF_HOME",
                                                              "HF_HUB_CACHE")}
    full = {**base, "PYTHONPATH": os.pathsep.join([*pp, str(REPO / "src")]), **(env or {})}
    return subprocess.run([sys.executable, "-m", "sglang_dflash", *args], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def write(path: Path, **keys) -> Path:
    path.write_text(json.dumps({**PINNED, **keys}))
    return path


def calls_of(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_fetch_models_downloads_then_is_idempotent(tmp_path, fake_hub):
    cfg = write(tmp_path / "q.json", cacheDir=str(tmp_path / "cache"))
    log = tmp_path / "calls.jsonl"
    env = {"FAKE_HF_LOG": str(log), "HF_HUB_OFFLINE": "1"}
    r = run_cli("fetch-models", "--config", str(cfg), fake_hub=fake_hub, env=env)
    assert r.returncode == 0, r.stderr
    calls = calls_of(log)
    hub = str(tmp_path / "cache" / "huggingface" / "hub")
    assert [(c["repo_id"], c["revision"], c["cache_dir"]) for c in calls] == [
        ("Qwen/Qwen3-8B", SHA, hub), ("z-lab/Qwen3-8B-DFlash-b16", SHA2, hub)]
    assert all(c["offline"] is None for c in calls)  # the fetcher itself is online
    # the check now finds both snapshots; serve runs offline against the same cache
    rc = run_cli("check", "--offline", "--layer", "models", "--config", str(cfg))
    assert rc.returncode == 0, rc.stdout
    assert "PASS models.model: Qwen/Qwen3-8B@" in rc.stdout
    # present: no second download
    r = run_cli("fetch-models", "--config", str(cfg), fake_hub=fake_hub, env=env)
    assert r.returncode == 0 and len(calls_of(log)) == 2
    assert r.stdout.count("present in") == 2


def test_fetch_models_retries_through_failures(tmp_path, fake_hub):
    cfg = write(tmp_path / "q.json", cacheDir=str(tmp_path / "cache"), draftModel="/srv/d")
    log = tmp_path / "calls.jsonl"
    r = run_cli("fetch-models", "--config", str(cfg), "--retry-delay", "0.01",
                fake_hub=fake_hub, env={"FAKE_HF_LOG": str(log), "FAKE_HF_FAIL": "2"})
    assert r.returncode == 0, r.stderr
    assert len(calls_of(log)) == 3
    assert r.stderr.count("failed (HfHubHTTPError: 503 Server Error") == 2


@pytest.mark.parametrize("env, args, reason", [
    ({"FAKE_HF_FAIL": "9"}, ("--tries", "2"), "gave up after 2 attempt(s): HfHubHTTPError"),
    ({"FAKE_HF_MODE": "notfound"}, (), "RepositoryNotFoundError: 404 Client Error"),
    ({"FAKE_HF_MODE": "empty"}, (), "but no snapshot"),
])
def test_fetch_models_failure_is_one_line_exit_1(tmp_path, fake_hub, env, args, reason):
    cfg = write(tmp_path / "q.json", cacheDir=str(tmp_path / "cache"))
    r = run_cli("fetch-models", "--config", str(cfg), "--retry-delay", "0", *args,
                fake_hub=fake_hub, env={"FAKE_HF_LOG": str(tmp_path / "l"), **env})
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang-dflash fetch-models: model Qwen/Qwen3-8B@") and reason in last


def test_fetch_models_without_huggingface_hub(tmp_path):
    blocker = tmp_path / "block"
    (blocker / "huggingface_hub").mkdir(parents=True)
    (blocker / "huggingface_hub" / "__init__.py").write_text("raise ImportError('absent')")
    cfg = write(tmp_path / "q.json", cacheDir=str(tmp_path / "cache"))
    r = run_cli("fetch-models", "--config", str(cfg), fake_hub=blocker)
    assert r.returncode == 1
    assert r.stderr.strip() == ("sglang-dflash fetch-models: huggingface_hub is not installed "
                                "(it comes with sglang: install the gpu extra, or run the "
                                "sglang-dflash package)")


@pytest.mark.parametrize("args, keys, msg", [
    (("--tries", "0"), {}, "--tries: 0 is outside 1..20"),
    (("--retry-delay", "-1"), {}, "--retry-delay: -1.0 is outside 0..600"),
    (("--max-delay", "nan"), {}, "--max-delay: nan is outside 0..3600"),
    ((), {"offline": True, "modelRevision": "main"}, "modelRevision: offline serving"),
])
def test_fetch_models_bad_input_is_one_line_exit_2(tmp_path, args, keys, msg):
    cfg = write(tmp_path / "q.json", **keys)
    r = run_cli("fetch-models", "--config", str(cfg), *args)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr


def test_fetch_models_print_cache(tmp_path):
    cfg = write(tmp_path / "q.json")
    r = run_cli("fetch-models", "--config", str(cfg), "--print-cache",
                env={"CACHE_DIRECTORY": "/var/cache/sglang-dflash-q"})  # systemd's, as serve
    assert r.returncode == 0
    assert r.stdout.strip() == "/var/cache/sglang-dflash-q/huggingface/hub"
    r = run_cli("fetch-models", "--config", str(cfg), "--print-cache",
                env={"HOME": str(tmp_path), "XDG_CACHE_HOME": ""})
    assert r.stdout.strip() == str(tmp_path / ".cache/huggingface/hub")
    r = run_cli("fetch-models", "--config", str(write(tmp_path / "c.json", cacheDir="/v/c")),
                "--print-cache")
    assert r.stdout.strip() == "/v/c/huggingface/hub"


def test_check_names_a_missing_model_when_offline(tmp_path):
    cfg = write(tmp_path / "q.json", cacheDir=str(tmp_path / "cache"), draftModel=str(tmp_path))
    r = run_cli("check", "--offline", "--layer", "models", "--config", str(cfg))
    assert r.returncode == 1
    line = next(x for x in r.stdout.splitlines() if x.startswith("FAIL models.model"))
    snap = tmp_path / "cache" / "huggingface" / "hub" / "models--Qwen--Qwen3-8B" / "snapshots"
    assert f"Qwen/Qwen3-8B@{SHA} is not in the cache and the server is offline" in line
    assert f"(no snapshot {snap / SHA})" in line
    assert line.endswith(f"fix: sglang-dflash fetch-models --config {cfg} "
                         "(or systemctl start sglang-dflash-q-models.service)")
    assert f"PASS models.draftModel: {tmp_path} is a local directory" in r.stdout
    # a local directory that is not there
    gone = write(tmp_path / "g.json", model=str(tmp_path / "nope"), algorithm="none")
    r = run_cli("check", "--offline", "--layer", "models", "--config", str(gone))
    assert r.returncode == 1 and f"FAIL models.model: {tmp_path / 'nope'} is not a directory" \
        in r.stdout


def test_check_warns_about_unpinned_hub_ids(tmp_path):
    cfg = write(tmp_path / "q.json", draftModelRevision="main")
    r = run_cli("check", "--offline", "--layer", "models", "--config", str(cfg))
    assert r.returncode == 0, r.stdout
    assert ("SKIP models.draftModel: warning: hub id z-lab/Qwen3-8B-DFlash-b16@main is not "
            "served offline (revision 'main' is not a commit)") in r.stdout
    assert "fix: set draftModelRevision to a 40-hex commit" in r.stdout
    assert "SKIP models.model: warning" in r.stdout  # pinned, but the instance is not offline
    r = run_cli("check", "--offline", "--layer", "models")
    assert "SKIP models.all: no --config" in r.stdout


def test_serve_print_argv_runs_offline_against_the_instance_cache(tmp_path):
    cfg = write(tmp_path / "q.json", cacheDir="/var/cache/sglang-dflash-q")
    r = run_cli("serve", "--config", str(cfg), "--print-argv")
    assert r.returncode == 0, r.stderr
    words = r.stdout.split()
    assert "HF_HUB_OFFLINE=1" in words
    assert "HF_HOME=/var/cache/sglang-dflash-q/huggingface" in words
    assert words[words.index("--revision") + 1] == SHA
    assert words[words.index("--speculative-draft-model-revision") + 1] == SHA2
    r = run_cli("serve", "--config", str(write(tmp_path / "u.json", modelRevision="v1")),
                "--print-argv")
    assert "HF_HUB_OFFLINE=1" not in r.stdout.split()
