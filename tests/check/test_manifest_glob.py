"""manifest.glob_files on real trees, including symlinked directories as a Nix env has them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_dflash.manifest import glob_files, glob_match

GLOBS = ["plugin.py", "ddtree/*.py", "sglang_overlay/**/*.py"]


def touch(path: Path, text: str = "x = 1\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_symlinked_directories_are_entered(tmp_path: Path) -> None:
    """Python 3.11's Path.glob('**') skips symlinked subdirectories; the manifest must not."""
    store = tmp_path / "store"  # where Nix keeps the real files
    touch(store / "models" / "qwen.py")
    touch(store / "models" / "deep" / "llama.py")
    touch(store / "models" / "__pycache__" / "qwen.cpython-311.pyc")
    touch(store / "ddtree" / "tree.py")
    (store / "models" / "deep" / "loop").symlink_to(store / "models")  # a cycle
    root = tmp_path / "sglang_dflash"
    touch(root / "plugin.py")
    touch(root / "sglang_overlay" / "worker.py")
    touch(root / "sglang_overlay" / "notes.txt")
    (root / "sglang_overlay" / "models").symlink_to(store / "models")
    (root / "ddtree").symlink_to(store / "ddtree")
    (root / "sglang_overlay" / "gone.py").symlink_to(tmp_path / "missing.py")  # dangling
    assert glob_files(root, GLOBS) == [
        "ddtree/tree.py",
        "plugin.py",
        "sglang_overlay/models/deep/llama.py",
        "sglang_overlay/models/qwen.py",
        "sglang_overlay/worker.py",
    ]


def test_same_result_as_pathlib_on_a_plain_tree(tmp_path: Path) -> None:
    """Without symlinks the walk agrees with Path.glob, wildcard by wildcard."""
    for rel in ["plugin.py", "other.py", "ddtree/a.py", "ddtree/sub/b.py", "ddtree/c.txt",
                "sglang_overlay/a.py", "sglang_overlay/x/y/z.py", "sglang_overlay/x/.h.py",
                "sglang_overlay/__pycache__/a.cpython-311.pyc"]:
        touch(tmp_path / rel)
    globs = [*GLOBS, "*.py", "**/*.txt", "ddtree/**", "sglang_overlay/*/*/*.py", "nothing/*"]
    for pattern in globs:
        expected = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob(pattern)
                          if p.is_file() and "__pycache__" not in p.parts)
        assert glob_files(tmp_path, [pattern]) == expected, pattern


@pytest.mark.parametrize(
    ("path", "pattern", "hit"),
    [
        ("a/b.py", "a/*.py", True),
        ("a/x/b.py", "a/*.py", False),  # * stays inside one segment
        ("a/b.py", "a/**/*.py", True),  # ** spans zero directories
        ("a/x/y/b.py", "a/**/*.py", True),
        ("b/x/b.py", "a/**/*.py", False),
        ("a", "a/**", False),
    ],
)
def test_glob_match_segments(path: str, pattern: str, hit: bool) -> None:
    assert glob_match(tuple(path.split("/")), tuple(pattern.split("/"))) is hit


def test_symlink_to_root_itself(tmp_path: Path) -> None:
    """The package directory may itself be a symlink into the store."""
    touch(tmp_path / "real" / "ddtree" / "a.py")
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert glob_files(tmp_path / "link", ["ddtree/*.py"]) == ["ddtree/a.py"]
