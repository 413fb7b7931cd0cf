"""The plugin entry and hook table without SGLang: nothing happens while the switch is unset."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from sglang_dflash import plugin
from sglang_dflash.sglang_overlay import hooks


class _Registry:
    """Records registrations the way SGLang's HookRegistry.register receives them."""

    def __init__(self):
        self.calls = []

    def register(self, target, hook, hook_type):
        self.calls.append((target, hook, hook_type))


def test_unset_switch_registers_nothing_and_imports_no_sglang(monkeypatch):
    monkeypatch.delenv("SGLANG_DFLASH_DDTREE_BUDGET", raising=False)
    assert plugin.register() == []
    monkeypatch.setenv("SGLANG_DFLASH_DDTREE_BUDGET", "  ")
    assert plugin.register() == []


def test_set_switch_needs_sglang(monkeypatch):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is importable here; tests/overlay/test_sglang_hooks.py covers it")
    monkeypatch.setenv("SGLANG_DFLASH_DDTREE_BUDGET", "8")
    with pytest.raises(ModuleNotFoundError):
        plugin.register()


def test_hook_table_registers_every_hook_once_as_around():
    reg = _Registry()
    hook_type = SimpleNamespace(AROUND="around")
    targets = hooks.register_all(reg, hook_type)
    assert len(targets) == len(set(targets)) == len(hooks.HOOKS) == 9
    assert set(hooks.HOOKS) == set(hooks.TARGETS)
    assert all(t.startswith("sglang.srt.") for t in targets)
    assert [c[0] for c in reg.calls] == targets
    assert {c[2] for c in reg.calls} == {"around"}
    assert all(callable(c[1]) for c in reg.calls)


def test_hooks_pass_through_when_unset(monkeypatch):
    monkeypatch.delenv("SGLANG_DFLASH_DDTREE_BUDGET", raising=False)
    seen = []

    def original(*args):
        seen.append(args)
        return "stock"

    assert hooks.handle_dflash(original, "ARGS") == "stock"
    assert hooks.validate_request(original, "REQ", True) == "stock"
    assert hooks.create_worker(original, SimpleNamespace(is_dflash=lambda: True), "SA") == "stock"
    assert seen == [("ARGS",), ("REQ", True), (seen[2][0], "SA")]
    # the workspace hook never touches SGLang's env or imports it when the switch is unset
    assert hooks.flashinfer_workspace(original, "BACKEND", "RUNNER") == "stock"
    assert seen[-1] == ("BACKEND", "RUNNER")


@pytest.mark.parametrize(
    ("params", "kind"),
    [({}, None), ({"regex": "a+"}, "regex"), ({"json_schema": "{}"}, "json_schema"),
     ({"ebnf": "x"}, "ebnf"), ({"structural_tag": "t"}, "structural_tag"), ({"regex": ""}, None)],
)  # fmt: skip
def test_request_grammar(params, kind):
    fields = dict.fromkeys(hooks.GRAMMAR_FIELDS)
    fields.update(params)
    assert hooks.request_grammar(SimpleNamespace(sampling_params=SimpleNamespace(**fields))) == kind


def test_launcher_refuses_the_bound_with_flashinfer(monkeypatch):
    """HOST_LENS=bound with FlashInfer attention is a one-line error in the launcher, before
    SGLang's own DFLASH handling runs (its split-KV plans need exact lengths, §29); unset, or
    on Triton, the launcher goes on to SGLang's."""
    from sglang_dflash.sglang_overlay import settings

    monkeypatch.setenv(settings.BUDGET_ENV, "16")
    seen = []

    def original(server_args):
        seen.append(server_args.attention_backend)
        server_args.speculative_num_draft_tokens = 16

    def args(backend, draft=None):
        return SimpleNamespace(attention_backend=backend, prefill_attention_backend=None,
                               decode_attention_backend=None, page_size=1, pp_size=1,
                               speculative_draft_window_size=None,
                               speculative_num_draft_tokens=None,
                               speculative_draft_attention_backend=draft)

    monkeypatch.setenv(settings.HOST_LENS_ENV, "bound")
    with pytest.raises(settings.DDTreeConfigError) as exc:
        hooks.handle_dflash(original, args("flashinfer"))
    assert "\n" not in str(exc.value) and "FlashInfer" in str(exc.value)
    with pytest.raises(settings.DDTreeConfigError, match="drafter's attention is FlashInfer"):
        hooks.handle_dflash(original, args("triton", draft="flashinfer"))
    assert seen == []
    hooks.handle_dflash(original, args("triton"))
    hooks.handle_dflash(original, args("flashinfer", draft="triton"))  # the padded verify
    monkeypatch.delenv(settings.HOST_LENS_ENV)
    hooks.handle_dflash(original, args("flashinfer"))
    assert seen == ["triton", "flashinfer", "flashinfer"]
