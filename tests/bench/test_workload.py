"""Prompt files and synthetic prompts."""

from __future__ import annotations

import json

import pytest

from sglang_dflash.bench.runner import Sampling, build_payload
from sglang_dflash.bench.workload import Prompt, WorkloadError, load_jsonl, synthetic, take


def test_load_jsonl_reads_text_ids_and_per_prompt_lengths(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "hello"}\n\n{"input_ids": [1, 2, 3], "max_new_tokens": 7}\n')
    ps = load_jsonl(f)
    assert ps == [Prompt(text="hello"), Prompt(input_ids=(1, 2, 3), max_new_tokens=7)]


@pytest.mark.parametrize("line, reason", [
    ("not json", "not JSON"),
    ("[1, 2]", "expected an object"),
    ('{"text": "a", "input_ids": [1]}', "exactly one"),
    ("{}", "exactly one"),
    ('{"text": ""}', "non-empty string"),
    ('{"input_ids": []}', "list of token ids"),
    ('{"input_ids": [1, -2]}', "list of token ids"),
    ('{"text": "a", "max_new_tokens": 0}', "positive integer"),
    ('{"text": "a", "max_new_tokens": true}', "positive integer"),
])
def test_load_jsonl_names_file_and_line_of_a_bad_prompt(tmp_path, line, reason):
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "ok"}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=reason) as e:
        load_jsonl(f)
    assert f"{f}:2" in str(e.value) and "\n" not in str(e.value)


def test_load_jsonl_missing_and_empty_files(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(WorkloadError, match="no prompts"):
        load_jsonl(tmp_path / "e.jsonl")


def test_synthetic_is_seeded_and_in_range():
    a = synthetic(5, 16, 100, seed=1)
    assert a == synthetic(5, 16, 100, seed=1)
    assert a != synthetic(5, 16, 100, seed=2)
    assert all(len(p.input_ids) == 16 and all(0 <= t < 100 for t in p.input_ids) for p in a)
    assert len({p.input_ids for p in a}) == 5


def test_take_cycles_a_short_file():
    ps = [Prompt(text="a"), Prompt(text="b")]
    assert [p.text for p in take(ps, 5)] == ["a", "b", "a", "b", "a"]
    assert take(ps, None) == ps


def test_payload_uses_the_prompts_own_length_first():
    s = Sampling(max_new_tokens=32, temperature=0.5)
    p = build_payload(Prompt(input_ids=(1, 2), max_new_tokens=4), s)
    assert p == {"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0.5, "ignore_eos": True}}
    assert build_payload(Prompt(text="x"), s)["sampling_params"]["max_new_tokens"] == 32
    json.dumps(p)
