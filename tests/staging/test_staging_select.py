"""Wheel selection on the real uv.lock: tags, markers, the `gpu` closure, exclusions."""

from __future__ import annotations

import re

import pytest

from .helpers import REPO, load_stage

gs = load_stage()
TARGET = gs.Target()


@pytest.fixture(scope="module")
def packages():
    return gs.parse_lock((REPO / "uv.lock").read_text())


@pytest.fixture(scope="module")
def plan(packages):
    return gs.make_plan(packages, TARGET, gs.HOST_ENV)


@pytest.mark.parametrize(
    ("filename", "ok"),
    [
        ("a-1-cp312-cp312-manylinux_2_34_x86_64.whl", True),
        ("a-1-cp312-cp312-manylinux_2_39_x86_64.whl", True),
        ("a-1-cp312-cp312-manylinux_2_40_x86_64.whl", False),  # newer glibc than the host
        ("a-1-cp312-cp312-musllinux_1_2_x86_64.whl", False),
        ("a-1-cp312-cp312-manylinux_2_28_aarch64.whl", False),
        ("a-1-cp311-cp311-manylinux_2_28_x86_64.whl", False),
        ("a-1-cp313-cp313-manylinux_2_28_x86_64.whl", False),
        ("a-1-cp312-cp312t-manylinux_2_28_x86_64.whl", False),
        ("a-1-cp310-abi3-manylinux2014_x86_64.whl", True),
        ("a-1-cp313-abi3-manylinux2014_x86_64.whl", False),  # abi3 from a newer CPython
        ("a-1-cp312-cp312-manylinux1_x86_64.whl", True),
        ("a-1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", True),
        ("a-1-cp312-cp312-win_amd64.whl", False),
        ("a-1-cp312-cp312-macosx_11_0_arm64.whl", False),
        ("a-1-py3-none-any.whl", True),
        ("a-1-py2.py3-none-any.whl", True),
        ("a-1-py2-none-any.whl", False),
        ("a-1-py3-none-manylinux2014_x86_64.whl", True),
        ("a-1-1build-py3-none-any.whl", True),
        ("a-1-pp310-pypy310_pp73-manylinux_2_17_x86_64.whl", False),
    ],
)
def test_tag_compatibility(filename, ok):
    assert (gs.wheel_rank(filename, TARGET) is not None) is ok


def test_glibc_ceiling_is_a_parameter():
    name = "a-1-cp312-cp312-manylinux_2_34_x86_64.whl"
    assert gs.wheel_rank(name, gs.Target(max_glibc_minor=34)) is not None
    assert gs.wheel_rank(name, gs.Target(max_glibc_minor=28)) is None


def test_not_a_wheel_is_a_stage_error():
    with pytest.raises(gs.StageError):
        gs.wheel_tags("a-1.tar.gz")


def _pkg(*filenames):
    wheels = tuple(gs.Wheel(f, f"https://x/{f}", "0" * 64, 1) for f in filenames)
    return gs.Package("a", "1", (), {}, wheels, {})


def test_pick_prefers_exact_interpreter_then_newest_fitting_glibc():
    pkg = _pkg(
        "a-1-py3-none-any.whl",
        "a-1-cp39-abi3-manylinux_2_28_x86_64.whl",
        "a-1-cp312-cp312-manylinux_2_17_x86_64.whl",
        "a-1-cp312-cp312-manylinux_2_28_x86_64.whl",
        "a-1-cp312-cp312-manylinux_2_41_x86_64.whl",
        "a-1-cp313-cp313-manylinux_2_28_x86_64.whl",
    )
    assert gs.pick_wheel(pkg, TARGET).filename == "a-1-cp312-cp312-manylinux_2_28_x86_64.whl"
    pkg = _pkg("a-1-py3-none-any.whl", "a-1-cp39-abi3-manylinux_2_28_x86_64.whl")
    assert gs.pick_wheel(pkg, TARGET).filename == "a-1-cp39-abi3-manylinux_2_28_x86_64.whl"
    assert gs.pick_wheel(_pkg("a-1-cp313-cp313-manylinux_2_28_x86_64.whl"), TARGET) is None


@pytest.mark.parametrize(
    ("marker", "full", "ok"),
    [
        ("python_full_version == '3.12.*'", "3.12.3", True),
        ("python_full_version == '3.12.*'", "3.11.7", False),
        ("python_full_version >= '3.13'", "3.12.3", False),
        ("python_full_version < '3.12'", "3.11.7", True),
        ("implementation_name != 'PyPy'", "3.12.3", True),
        ("implementation_name == 'pypy'", "3.12.3", False),
        ("python_full_version == '3.12.*' and sys_platform == 'linux'", "3.12.3", True),
        (
            "(sys_platform == 'win32' or platform_machine == 'x86_64') and "
            "python_full_version >= '3.12'",
            "3.12.3",
            True,
        ),
        ("sys_platform == 'win32' or python_full_version < '3.12'", "3.12.3", False),
        ("'linux' in sys_platform", "3.12.3", True),
        ("'win' not  in sys_platform and implementation_name == 'cpython'", "3.12.3", True),
    ],
)
def test_markers(marker, full, ok):
    env = dict(gs.HOST_ENV, python_full_version=full, python_version=full.rsplit(".", 1)[0])
    assert gs.eval_marker(marker, env) is ok


def test_unknown_marker_variable_is_a_requirement_error():
    with pytest.raises(gs.RequirementError, match="unknown marker variable"):
        gs.eval_marker("nonsense_var == '1'", gs.HOST_ENV)


def test_roots_are_the_pinned_gpu_extra(packages):
    pins = (REPO / "src" / "sglang_dflash" / "pins.toml").read_text()
    pinned = set(re.findall(r'^([a-z][a-z0-9-]*) = "[0-9]', pins, re.M)) - {"version"}
    roots = {d.name for d in gs.project_roots(packages)}
    assert roots == pinned & roots and {"sglang", "torch", "triton"} <= roots


def test_closure_follows_markers(packages):
    roots = gs.project_roots(packages)
    on_312 = gs.closure(packages, roots, gs.HOST_ENV)
    on_311 = gs.closure(packages, roots, dict(gs.HOST_ENV, python_full_version="3.11.7"))
    assert "sglang" in on_312 and len(on_312) > 100
    # the gpu extra is unmarked (requires-python bounds it); markers inside the closure differ
    assert "sglang" in on_311 and on_311["scipy"][0].version != on_312["scipy"][0].version


def test_closure_follows_extras(packages):
    """torch needs cuda-toolkit[cublas, ...]; the extras' packages must be in the closure."""
    by_name = {p.name: p for p in packages}
    torch = by_name["torch"]
    toolkit_dep = next(d for d in torch.deps if d.name == "cuda-toolkit")
    assert toolkit_dep.extras
    from_extras = {d.name for e in toolkit_dep.extras for d in by_name["cuda-toolkit"].optional[e]}
    assert by_name["cuda-toolkit"].deps == ()  # reachable only through the extras
    got = gs.closure(packages, [gs.Dep("torch")], gs.HOST_ENV)
    assert from_extras <= set(got)


def test_host_provided_is_torch_triton_and_torchs_cuda_packages(packages):
    host = gs.host_provided(packages, gs.HOST_ENV)
    torch_closure = gs.closure(packages, [gs.Dep("torch")], gs.HOST_ENV)
    assert {"torch", "triton"} <= set(host)
    for name in host:
        assert name in torch_closure
        assert name in ("torch", "triton", "cuda-toolkit") or name.startswith("nvidia-")
    # every nvidia-* library torch depends on is the host's
    assert {n for n in torch_closure if n.startswith("nvidia-")} <= set(host)
    # pure-Python needs of torch and its CUDA Python bindings are not claimed by this rule
    assert "sympy" not in host and "filelock" not in host
    assert "cuda-bindings" in torch_closure and "cuda-bindings" not in host


def test_plan_partitions_the_closure(packages, plan):
    full = gs.closure(packages, gs.project_roots(packages), gs.HOST_ENV)
    sel = {s.name for s in plan.selected}
    exc = {e.name for e in plan.excluded}
    assert sel | exc == set(full) and not sel & exc
    assert {"sglang", "sglang-kernel", "flashinfer-python", "transformers"} <= sel
    assert not sel & {"torch", "triton", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"}
    for e in plan.excluded:
        assert e.reason.strip()


def test_selected_wheels_fit_the_host(packages, plan):
    versions = {(p.name, p.version) for p in packages}
    for s in plan.selected:
        assert (s.name, s.version) in versions
        assert gs.wheel_rank(s.wheel.filename, TARGET) is not None, s.wheel.filename
        assert re.fullmatch(r"[0-9a-f]{64}", s.wheel.sha256)
        assert s.wheel.url.startswith("https://") and s.wheel.size > 0
        assert s.via


def test_pins_are_the_versions_selected(plan):
    chosen = {s.name: s.version for s in plan.selected}
    pins = (REPO / "src" / "sglang_dflash" / "pins.toml").read_text()
    for name in ("sglang", "sglang-kernel", "flashinfer-python", "transformers"):
        assert f'{name} = "{chosen[name]}"' in pins


def test_optional_heavy_left_out_with_reason_and_keep_brings_back(packages, plan):
    exc = {e.name: e for e in plan.excluded}
    full = gs.closure(packages, gs.project_roots(packages), gs.HOST_ENV)
    heavy_in_lock = set(gs.OPTIONAL_HEAVY) & set(full)
    assert heavy_in_lock, "the optional list names nothing in the lock"
    for name in heavy_in_lock:
        assert name in exc and exc[name].reason.startswith("optional")
    kept = gs.make_plan(packages, TARGET, gs.HOST_ENV, keep={"tilelang"})
    assert "tilelang" in {s.name for s in kept.selected}


def test_packages_only_needed_by_excluded_ones_are_left_out_and_say_why(packages, plan):
    rules = set(gs.host_provided(packages, gs.HOST_ENV)) | set(gs.OPTIONAL_HEAVY)
    for e in plan.excluded:
        if e.name not in rules:
            assert e.reason.startswith("needed only by packages left out")


def test_a_lock_without_the_project_is_a_stage_error():
    with pytest.raises(gs.StageError, match="no sglang-dflash"):
        gs.project_roots(gs.parse_lock('version = 1\n[[package]]\nname = "x"\nversion = "1"\n'))


def test_extra_router_stages_smg_with_the_gpu_stack(packages, plan):
    """`--extra router` adds smg (benchmarks/router_pair runs the router on the GPU host);
    an extra the lock does not have is a one-line StageError."""
    names = {s.name for s in plan.selected}
    assert "smg" not in names
    both = gs.make_plan(packages, TARGET, gs.HOST_ENV, extras=("gpu", "router"))
    both_names = {s.name for s in both.selected}
    assert "smg" in both_names and names <= both_names
    with pytest.raises(gs.StageError, match=r"no sglang-dflash\[bogus\]"):
        gs.make_plan(packages, TARGET, gs.HOST_ENV, extras=("gpu", "bogus"))
