"""Every ``SGLANG_DFLASH_*`` environment variable the package reads or sets is named once, in
``sglang_overlay/settings.py``; every other module (renderers and messages included) uses the
constant, so a renamed variable cannot leave a stale copy behind. Docstrings may name them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sglang_dflash.sglang_overlay import settings

PKG = Path(__file__).resolve().parents[2] / "src" / "sglang_dflash"
SETTINGS = PKG / "sglang_overlay" / "settings.py"
NAME = re.compile(r"SGLANG_DFLASH_\w*")


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are module, class or function docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                out.add(id(body[0].value))
    return out


def literal_names(source: str, filename: str) -> list[str]:
    """``file:line: NAME`` for each string literal (f-string parts too) naming a variable."""
    tree = ast.parse(source, filename)
    skip = docstring_nodes(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            hits += [f"{filename}:{node.lineno}: {m}" for m in NAME.findall(node.value)]
    return sorted(hits)


def test_no_module_but_settings_spells_a_variable_name():
    files = sorted(p for p in PKG.rglob("*.py") if p != SETTINGS)
    assert len(files) > 40 and PKG / "unit.py" in files and PKG / "router.py" in files
    hits = []
    for path in files:
        hits += literal_names(path.read_text(), str(path.relative_to(PKG.parent.parent)))
    assert not hits, "use the constant from sglang_overlay/settings.py:\n" + "\n".join(hits)


def test_the_scan_sees_literals_and_f_string_parts_but_not_docstrings():
    src = '''"""Module doc: SGLANG_DFLASH_A."""
def f():
    """Function doc: SGLANG_DFLASH_B."""
    x = "SGLANG_DFLASH_C"
    return f"set SGLANG_DFLASH_D={x}"
'''
    assert literal_names(src, "m.py") == ["m.py:4: SGLANG_DFLASH_C", "m.py:5: SGLANG_DFLASH_D"]


def test_settings_names_each_variable_once():
    names = {k: v for k, v in vars(settings).items() if k.endswith("_ENV")}
    assert {
        "BUDGET_ENV",
        "POLICY_ENV",
        "PLANT_ENV",
        "IMPL_ENV",
        "PROFILE_ENV",
        "PROFILE_EVERY_ENV",
        "TRACE_ENV",
        "TRACE_MAX_ENV",
        "ROUTER_KEY_FILE_ENV",
    } <= set(names)
    assert all(NAME.fullmatch(v) for v in names.values()), names
    assert len(set(names.values())) == len(names), names
