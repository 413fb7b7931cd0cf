"""Code layout: command modules apart from library modules, imports pointing one way, one
error base class reported once by cli.main."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pytest

from sglang_dflash import cli
from sglang_dflash.errors import UserError

PKG = Path(__file__).resolve().parents[1] / "src" / "sglang_dflash"
# The lead's trees (the SGLang overlay and the DDTree core) are outside this layout rule.
OWN = [p for p in sorted(PKG.rglob("*.py"))
       if not {"sglang_overlay", "ddtree"} & set(p.relative_to(PKG).parts)]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every sglang_dflash module the file imports (absolute names, `from X import y` as X.y
    too, since y may be a submodule)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] == "sglang_dflash"}


def imports_of(prefix: str) -> dict[str, set[str]]:
    return {module_name(p): imported_modules(p) for p in OWN if module_name(p).startswith(prefix)}


def test_check_does_not_import_serve_or_any_command():
    for mod, imported in imports_of("sglang_dflash.check").items():
        bad = {m for m in imported
               if m == "sglang_dflash.serve" or m.startswith("sglang_dflash.commands")}
        assert not bad, f"{mod} imports {sorted(bad)}"


def test_library_modules_never_import_command_modules():
    for p in OWN:
        mod = module_name(p)
        if mod.startswith("sglang_dflash.commands") or mod == "sglang_dflash.cli":
            continue
        bad = {m for m in imported_modules(p) if m.startswith("sglang_dflash.commands")}
        assert not bad, f"{mod} (a library module) imports {sorted(bad)}"


def test_every_subcommand_is_a_command_module_and_only_those_parse_flags():
    commands = {p.stem for p in (PKG / "commands").glob("*.py") if p.stem != "__init__"}
    assert commands == {m for m, _ in cli.SUBCOMMANDS.values()}
    for p in OWN:
        tree = ast.parse(p.read_text())
        defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if p.parent.name == "commands" and p.stem != "__init__":
            assert {"add_arguments", "run"} <= defs, p
        else:
            assert "add_arguments" not in defs, f"{p}: flag parsing belongs in commands/"


def test_user_errors_share_one_base():
    from sglang_dflash.commands.bench import UsageError
    from sglang_dflash.config import ConfigError
    from sglang_dflash.unit import UnitError
    for cls in (ConfigError, UnitError, UsageError):
        assert issubclass(cls, UserError), cls
    assert issubclass(ConfigError, ValueError) and issubclass(UnitError, ValueError)


def _fake_command(monkeypatch, exc: BaseException):
    def add_arguments(_p: argparse.ArgumentParser) -> None:
        pass

    def run(_args) -> int:
        raise exc

    mod = type(sys)("sglang_dflash.commands.fake")
    mod.add_arguments, mod.run = add_arguments, run
    monkeypatch.setitem(sys.modules, "sglang_dflash.commands.fake", mod)
    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", ("fake", "a test command"))


def test_main_reports_a_user_error_in_one_line_with_the_command_name(monkeypatch, capsys):
    _fake_command(monkeypatch, UserError("first line\nsecond line"))
    assert cli.main(["fake"]) == 2
    out = capsys.readouterr()
    assert out.err == "sglang-dflash fake: first line second line\n" and out.out == ""


def test_main_uses_the_errors_own_exit_code(monkeypatch, capsys):
    class Refused(UserError):
        exit_code = 1

    _fake_command(monkeypatch, Refused("port 30000 is taken"))
    assert cli.main(["fake"]) == 1
    assert capsys.readouterr().err == "sglang-dflash fake: port 30000 is taken\n"


def test_main_does_not_swallow_a_programming_error(monkeypatch):
    _fake_command(monkeypatch, KeyError("bug"))
    with pytest.raises(KeyError):
        cli.main(["fake"])
