"""Models fetched ahead of the server: which snapshots a config needs, where they live, and
the bounded-retry download behind `sglang-dflash fetch-models` (and its loader unit).

An offline instance (config key `offline`, see `sglang_dflash.config.default_offline`) serves
with HF_HUB_OFFLINE=1, so every hub model must already be a snapshot in the instance's cache:
huggingface_hub's layout, `<hub cache>/models--{org}--{name}/snapshots/{revision}/`, with the
hub cache under HF_HOME (`<cacheDir>/huggingface/hub`, the same HF_HOME serve gives SGLang).
Everything here but `fetch` is pure or only reads the file system; huggingface_hub is imported
lazily, by `fetch`'s default downloader only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sglang_dflash.config import (
    HF_OFFLINE_ENV,
    InstanceConfig,
    is_local_model,
    is_pinned,
    render_env,
)
from sglang_dflash.errors import UserError

# Failures huggingface_hub raises that no retry can fix (by class name, so that nothing here
# imports it): the repo or revision does not exist, or the token may not read it.
PERMANENT_ERRORS = ("RepositoryNotFoundError", "RevisionNotFoundError", "GatedRepoError",
                    "DisabledRepoError", "EntryNotFoundError", "RemoteEntryNotFoundError")


@dataclass(frozen=True)
class ModelRef:
    """One model SGLang loads: the config key naming it, the hub id or path, the revision."""

    key: str
    model: str
    revision: str | None

    @property
    def local(self) -> bool:
        return is_local_model(self.model)

    @property
    def pinned(self) -> bool:
        return is_pinned(self.revision)

    def label(self) -> str:
        if self.local or self.revision is None:
            return self.model
        return f"{self.model}@{self.revision}"


def needed(cfg: InstanceConfig) -> list[ModelRef]:
    """Every model the instance loads (the draft only when it speculates)."""
    return [ModelRef(k, m, r) for k, m, r in cfg.models()]


def hub_models(cfg: InstanceConfig) -> list[ModelRef]:
    """The models that come from the hub (the ones fetch-models downloads)."""
    return [m for m in needed(cfg) if not m.local]


def needs_loader(cfg: InstanceConfig) -> bool:
    """An offline instance with a hub model: its server needs the loader unit first."""
    return cfg.offline and bool(hub_models(cfg))


def instance_cache_dir(cfg: InstanceConfig, environ: Mapping[str, str]) -> str | None:
    """The instance's cache directory as serve resolves it: cacheDir, else systemd's
    $CACHE_DIRECTORY (the non-NixOS unit leaves cacheDir unset), else none."""
    if cfg.cache_dir:
        return cfg.cache_dir
    return environ.get("CACHE_DIRECTORY", "").split(":")[0] or None


def with_cache_dir(cfg: InstanceConfig, environ: Mapping[str, str]) -> InstanceConfig:
    cache = instance_cache_dir(cfg, environ)
    return dataclasses.replace(cfg, cache_dir=cache) if cache else cfg


def hub_cache_dir(cfg: InstanceConfig, environ: Mapping[str, str]) -> Path:
    """Where SGLang's huggingface_hub looks for snapshots: computed from the environment
    serve gives it (the instance cache's HF_HOME, or `environment`'s HF_HOME/HF_HUB_CACHE),
    with huggingface_hub's own defaults after that."""
    env = {**environ, **render_env(with_cache_dir(cfg, environ))}
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(xdg) / "huggingface" / "hub"


def repo_folder(cache: Path, repo_id: str) -> Path:
    """huggingface_hub's folder for a model repo: models--{org}--{name}."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def snapshot_dir(cache: Path, repo_id: str, revision: str) -> Path:
    """The snapshot of a commit; a branch or tag is first resolved through refs/<name>."""
    folder = repo_folder(cache, repo_id)
    if not is_pinned(revision):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            revision = (folder / "refs" / revision).read_text().strip() or revision
    return folder / "snapshots" / revision


def snapshot_problem(cache: Path, repo_id: str, revision: str) -> str | None:
    """Why the snapshot cannot serve offline, or None when it is complete: it must be a
    directory holding config.json, no link in it may dangle, and no download may be
    half-written (huggingface_hub's blobs/*.incomplete)."""
    snap = snapshot_dir(cache, repo_id, revision)
    if not snap.is_dir():
        return f"no snapshot {snap}"
    if not (snap / "config.json").is_file():
        return f"{snap} has no config.json"
    for p in snap.rglob("*"):
        if p.is_symlink() and not p.exists():
            return f"{p} is a dangling link (an interrupted download)"
    blobs = repo_folder(cache, repo_id) / "blobs"
    if blobs.is_dir() and any(blobs.glob("*.incomplete")):
        return f"{blobs} holds an interrupted download (*.incomplete)"
    return None


def present(ref: ModelRef, cache: Path) -> bool:
    """A pinned hub model whose snapshot is complete (an unpinned one is never "present":
    its branch may have moved)."""
    return ref.pinned and snapshot_problem(cache, ref.model, str(ref.revision)) is None


# ---- the download ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Bounded retries: `tries` attempts per model, waiting `base` s doubling to `cap` s,
    and never past `total` s of waiting in all."""

    tries: int = 5
    base: float = 2.0
    cap: float = 60.0
    total: float = 600.0

    def delays(self) -> list[float]:
        """The waits between the attempts (len tries - 1), within the total budget."""
        out: list[float] = []
        for i in range(self.tries - 1):
            d = min(self.cap, self.base * 2 ** i)
            if sum(out) + d > self.total:
                break
            out.append(d)
        return out


class FetchError(UserError):
    """A model could not be fetched; one line naming it (exit 1: not bad input)."""

    exit_code = 1


Downloader = Callable[..., str]


def hf_snapshot_download() -> Downloader:
    """huggingface_hub.snapshot_download, imported here (sglang's dependency, the gpu extra)."""
    os.environ.pop(HF_OFFLINE_ENV, None)  # read at import: the fetcher is the online step
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FetchError("huggingface_hub is not installed (it comes with sglang: install the "
                         "gpu extra, or run the sglang-dflash package)") from None
    return snapshot_download


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"


def _permanent(exc: BaseException) -> bool:
    return any(c.__name__ in PERMANENT_ERRORS for c in type(exc).__mro__)


def fetch_one(ref: ModelRef, cache: Path, download: Downloader, backoff: Backoff,
              log: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> str:
    """Download one hub model into `cache` with bounded retries; returns what was done.

    A pinned snapshot that is already complete is not fetched again (no network).
    """
    revision = ref.revision or "main"
    if present(ref, cache):
        return f"{ref.key} {ref.label()}: present in {snapshot_dir(cache, ref.model, revision)}"
    delays = backoff.delays()
    for attempt in range(1, len(delays) + 2):
        try:
            path = download(repo_id=ref.model, revision=revision, cache_dir=str(cache))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # the hub client raises many kinds
            if _permanent(exc):
                raise FetchError(f"{ref.key} {ref.model}@{revision}: {_reason(exc)} (not "
                                 "retried: check the id, the revision and HF_TOKEN)") from None
            if attempt > len(delays):
                raise FetchError(f"{ref.key} {ref.model}@{revision}: gave up after {attempt} "
                                 f"attempt(s): {_reason(exc)}") from None
            wait = delays[attempt - 1]
            log(f"{ref.key} {ref.model}@{revision}: attempt {attempt} failed "
                f"({_reason(exc)}); retrying in {wait:g}s")
            sleep(wait)
            continue
        if ref.pinned:
            problem = snapshot_problem(cache, ref.model, revision)
            if problem is not None:
                raise FetchError(f"{ref.key} {ref.model}@{revision}: the download returned "
                                 f"{path} but {problem}")
        return f"{ref.key} {ref.label()}: fetched into {path}"
    raise AssertionError("unreachable")


def fetch(cfg: InstanceConfig, environ: Mapping[str, str], backoff: Backoff,
          log: Callable[[str], None], download: Downloader | None = None,
          sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Fetch every hub model of `cfg` into the hub cache serve points SGLang at."""
    refs = hub_models(cfg)
    if not refs:
        return ["no hub model to fetch (every model is a local directory)"]
    cache = hub_cache_dir(cfg, environ)
    done = []
    for ref in refs:
        if download is None and not present(ref, cache):
            download = hf_snapshot_download()
        done.append(fetch_one(ref, cache, download or _unused, backoff, log, sleep))
    return done


def _unused(**_kw: object) -> str:
    raise AssertionError("fetch_one downloaded a snapshot that is present")
