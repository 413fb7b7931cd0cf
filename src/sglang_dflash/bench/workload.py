"""Benchmark prompts: a JSONL file, or seeded synthetic token ids for dummy-weight servers."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


class WorkloadError(ValueError):
    """A bad prompt file; the message is one line and names the file and line."""


@dataclass(frozen=True)
class Prompt:
    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    max_new_tokens: int | None = None  # None: the command's --max-new-tokens

    def payload_input(self) -> dict:
        if self.input_ids is None:
            return {"text": self.text}
        return {"input_ids": list(self.input_ids)}


def parse_prompt(obj: object, where: str) -> Prompt:
    """One JSONL line's object -> Prompt, with a one-line reason for anything else."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected an object with 'text' or 'input_ids'")
    has_text, has_ids = "text" in obj, "input_ids" in obj
    if has_text == has_ids:
        raise WorkloadError(f"{where}: give exactly one of 'text' and 'input_ids'")
    mnt = obj.get("max_new_tokens")
    if mnt is not None and (isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 1):
        raise WorkloadError(f"{where}: max_new_tokens must be a positive integer, got {mnt!r}")
    if has_text:
        text = obj["text"]
        if not isinstance(text, str) or not text:
            raise WorkloadError(f"{where}: 'text' must be a non-empty string")
        return Prompt(text=text, max_new_tokens=mnt)
    ids = obj["input_ids"]
    if (not isinstance(ids, list) or not ids
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)):
        raise WorkloadError(f"{where}: 'input_ids' must be a non-empty list of token ids")
    return Prompt(input_ids=tuple(ids), max_new_tokens=mnt)


def parse_jsonl(text: str, name: str) -> list[Prompt]:
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{name}:{n}: not JSON: {e.msg}") from None
        prompts.append(parse_prompt(obj, f"{name}:{n}"))
    if not prompts:
        raise WorkloadError(f"{name}: no prompts in the file")
    return prompts


def load_jsonl(path: str | Path) -> list[Prompt]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read prompt file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: prompt file is not UTF-8 text") from None
    return parse_jsonl(text, str(path))


def synthetic(num: int, input_len: int, vocab: int, seed: int) -> list[Prompt]:
    """Seeded random token ids; meaningful with dummy weights, where text is noise anyway."""
    rng = random.Random(seed)
    return [Prompt(input_ids=tuple(rng.randrange(vocab) for _ in range(input_len)))
            for _ in range(num)]


def take(prompts: list[Prompt], num: int | None) -> list[Prompt]:
    """The first num prompts, cycling through the file when it has fewer."""
    if num is None:
        return list(prompts)
    return [prompts[i % len(prompts)] for i in range(num)]
