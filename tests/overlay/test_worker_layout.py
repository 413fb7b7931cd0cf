"""The production round keeps diagnostics out: worker.py imports the test-only plant, the
profiler and the tracer only inside the loaders that run when their variable is set, and the
round is split into one method per profiled stage."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "src/sglang_dflash/sglang_overlay/worker.py"
TREE = ast.parse(WORKER.read_text())


def _imports(nodes) -> set[str]:
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_no_module_level_import_of_diagnostics():
    top = _imports(TREE.body)
    assert not [m for m in top if ".diagnostics" in m], sorted(top)


def _methods() -> dict[str, ast.FunctionDef]:
    (cls,) = [n for n in TREE.body if isinstance(n, ast.ClassDef)
              and any(isinstance(f, ast.FunctionDef) and f.name == "_ddtree_round"
                      for f in n.body)]
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}


def test_diagnostics_are_imported_only_by_their_loaders():
    users = {name for name, fn in _methods().items()
             if any(".diagnostics" in m for m in _imports(ast.walk(fn)))}
    assert users == {"_load_plant", "_load_profiler", "_load_tracer", "_apply_plant",
                     "_warm_up_plant"}


def _stage_calls(fn) -> list[str]:
    """The ``self.*_stage(...)`` calls in fn, in source order."""
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr.endswith("_stage")]
    return [n.func.attr for n in sorted(calls, key=lambda n: (n.lineno, n.col_offset))]


def test_the_round_calls_one_method_per_stage_in_order():
    assert _stage_calls(_methods()["_ddtree_round_body"]) == [
        "_draft_stage", "_tree_stage", "_verify_stage", "_accept_stage", "_commit_stage"]


def _range_names(fn) -> list[str]:
    """Names of the ``with ranges("...")`` blocks in fn, in source order."""
    withs = sorted((n for n in ast.walk(fn) if isinstance(n, ast.With)), key=lambda n: n.lineno)
    return [item.context_expr.args[0].value for n in withs for item in n.items
            if isinstance(item.context_expr, ast.Call)
            and getattr(item.context_expr.func, "id", None) == "ranges"]


def test_every_stage_runs_inside_a_named_profiler_range():
    """A trace of SGLang's /start_profile shows each stage's host time (trace_summary reads
    the ranges): the round, each stage but verify inside its own range, and verify split into
    its inputs and the target's forward."""
    m = _methods()
    assert _range_names(m["_ddtree_round"]) == ["round"]
    body = m["_ddtree_round_body"]
    assert _range_names(body) == ["choose", "draft", "tree", "accept", "commit", "result"]
    for w in (n for n in ast.walk(body) if isinstance(n, ast.With)):
        (name,) = _range_names(ast.Module(body=[w], type_ignores=[]))
        inside = _stage_calls(ast.Module(body=w.body, type_ignores=[]))
        want = {"draft": ["_draft_stage"], "tree": ["_tree_stage"],
                "accept": ["_accept_stage"], "commit": ["_commit_stage"]}.get(name, [])
        assert inside == want, (name, inside)
    assert _range_names(m["_verify_stage"]) == ["verify_prep", "verify_forward"]
    # the test-only plant has its own range, inside the draft stage, so a profile of a
    # planted run can subtract what a real drafter never pays
    assert _range_names(m["_draft_stage"]) == ["plant"]
    plant_calls = [n for n in ast.walk(m["_draft_stage"]) if isinstance(n, ast.Call)
                   and getattr(n.func, "attr", None) == "_apply_plant"]
    (with_plant,) = [n for n in ast.walk(m["_draft_stage"]) if isinstance(n, ast.With)]
    assert plant_calls and all(c in list(ast.walk(with_plant)) for c in plant_calls)
    assert not [n for n in ast.walk(m["_draft_topk"]) if isinstance(n, ast.Call)
                and getattr(n.func, "attr", None) == "_apply_plant"]


def test_the_pure_modules_import_without_torch():
    """settings, timing, policy and the plant/profile/trace diagnostics stay torch-free, so
    their tests collect (and skip nothing) on a machine without torch (the README's set-up
    without the test extra's torch)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import sglang_dflash.sglang_overlay.settings, sglang_dflash.sglang_overlay.timing\n"
            "import sglang_dflash.sglang_overlay.policy\n"
            "import sglang_dflash.sglang_overlay.diagnostics.plant\n"
            "import sglang_dflash.sglang_overlay.diagnostics.profile\n"
            "import sglang_dflash.sglang_overlay.diagnostics.trace\n")
    src = str(WORKER.parents[2])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
