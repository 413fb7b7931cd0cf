"""A stand-in for huggingface_hub at the network edge: `snapshot_download` writes the hub
cache layout instead of downloading. Put FAKE_HUB on PYTHONPATH (before the real one).

Behaviour from the environment: FAKE_HF_LOG (a file: one JSON line per call, with the
HF_HUB_OFFLINE the process saw at import), FAKE_HF_FAIL (fail this many calls first, counted
in FAKE_HF_LOG), FAKE_HF_MODE=notfound (raise RepositoryNotFoundError), =empty (return
without writing a snapshot).
"""

from __future__ import annotations

from pathlib import Path

FAKE_HUB_SOURCE = r'''
import json, os
from pathlib import Path

OFFLINE_AT_IMPORT = os.environ.get("HF_HUB_OFFLINE")


class HfHubHTTPError(OSError):
    pass


class RepositoryNotFoundError(HfHubHTTPError):
    pass


def snapshot_download(repo_id, revision=None, cache_dir=None, **kw):
    log = Path(os.environ["FAKE_HF_LOG"])
    calls = log.read_text().splitlines() if log.exists() else []
    with log.open("a") as f:
        f.write(json.dumps({"repo_id": repo_id, "revision": revision, "cache_dir": cache_dir,
                            "offline": OFFLINE_AT_IMPORT}) + "\n")
    mode = os.environ.get("FAKE_HF_MODE", "")
    if mode == "notfound":
        raise RepositoryNotFoundError(f"404 Client Error: Repository Not Found for {repo_id}")
    if len(calls) < int(os.environ.get("FAKE_HF_FAIL", "0")):
        raise HfHubHTTPError("503 Server Error: Service Unavailable")
    folder = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snap = folder / "snapshots" / revision
    if mode != "empty":
        (folder / "blobs").mkdir(parents=True, exist_ok=True)
        (folder / "blobs" / "abc").write_text("{}")
        snap.mkdir(parents=True, exist_ok=True)
        link = snap / "config.json"
        if not link.is_symlink():
            link.symlink_to("../../blobs/abc")
        (folder / "refs").mkdir(exist_ok=True)
    return str(snap)
'''


def make_fake_hub(root: Path) -> Path:
    pkg = root / "huggingface_hub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_HUB_SOURCE)
    return root


def make_snapshot(cache: Path, repo_id: str, revision: str, branch: str = "main") -> Path:
    """A snapshot as huggingface_hub leaves it: blobs, a linked config.json, refs/<branch>."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "deadbeef").write_text("{}")
    snap = folder / "snapshots" / revision
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/deadbeef")
    (folder / "refs").mkdir()
    (folder / "refs" / branch).write_text(revision)
    return snap
