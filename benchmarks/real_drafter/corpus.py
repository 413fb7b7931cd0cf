"""The training text: the sorted ``*.py`` files of a source tree (the stdlib by default).

Deterministic order (sorted relative paths) and a deterministic held-out split (sha256 of the
relative path), so two machines with the same stdlib get the same corpus id and the same split.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_MOD = 20  # 1 file in 20 is held out


@dataclass(frozen=True)
class Corpus:
    """Documents in path order, split by path hash; ``sha256`` covers every file's path+text."""

    root: str
    train: list[str]
    held_out: list[str]
    files: int
    sha256: str
    chars: int

    def id(self) -> dict:
        return {"root": self.root, "files": self.files, "sha256": self.sha256,
                "chars": self.chars, "train_files": len(self.train),
                "held_out_files": len(self.held_out)}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_held_out(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % HELD_OUT_MOD == 0


def load_corpus(root: Path | None = None) -> Corpus:
    """Read every ``*.py`` under ``root`` outside site-/dist-packages, as UTF-8 (bad bytes
    replaced), empty files skipped."""
    root = Path(root) if root is not None else stdlib_root()
    paths = sorted(
        (p for p in root.rglob("*.py")
         if p.is_file() and not {"site-packages", "dist-packages"} & set(p.parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    digest = hashlib.sha256()
    train: list[str] = []
    held: list[str] = []
    chars = 0
    for p in paths:
        rel = p.relative_to(root).as_posix()
        text = p.read_bytes().decode("utf-8", errors="replace")
        if not text.strip():
            continue
        digest.update(rel.encode() + b"\0" + text.encode() + b"\0")
        chars += len(text)
        (held if _is_held_out(rel) else train).append(text)
    return Corpus(root=str(root), train=train, held_out=held, files=len(train) + len(held),
                  sha256=digest.hexdigest(), chars=chars)
