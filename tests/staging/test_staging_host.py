"""The host-package rule on the real uv.lock, pins.toml and scripts/h200-host-packages.txt."""

from __future__ import annotations

import tomllib

import pytest

from .helpers import REPO, load_stage

gs = load_stage()
TARGET = gs.Target()
HOST_FILE = REPO / "scripts" / "h200-host-packages.txt"
CACHE = gs.Path.home() / ".cache" / "sglang-dflash" / "wheels"


@pytest.fixture(scope="module")
def packages():
    return gs.parse_lock((REPO / "uv.lock").read_text())


@pytest.fixture(scope="module")
def host():
    return gs.parse_host_packages(HOST_FILE.read_text())


@pytest.fixture(scope="module")
def pinned():
    return gs.read_pinned(REPO)


def _requires_from_cache(plan):
    """Requires-Dist of the plan's wheels, read from the staging cache (skip when absent)."""
    out = {}
    for s in plan.selected:
        path = CACHE / s.wheel.filename
        if not path.is_file():
            pytest.skip(f"{s.wheel.filename} not in {CACHE}: run scripts/gpu_stage.py once")
        out[s.name] = gs.wheel_requires(path)
    return out


@pytest.fixture(scope="module")
def host_plan(packages, host, pinned):
    """The fixpoint stage() runs, fed from the cache."""
    requires: dict[str, list[str]] = {}
    while True:
        plan = gs.make_plan(packages, TARGET, gs.HOST_ENV, set(), host, pinned, set(), requires)
        todo = [s for s in plan.selected if s.name not in requires]
        if not todo:
            return plan, requires
        requires.update(_requires_from_cache(gs.Plan(todo, [])))


def test_host_list_file_is_normalised_and_dated(host):
    text = HOST_FILE.read_text()
    assert "KINDS.md" in text and "2026-11-17" in text
    names = [ln.split("==")[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert names == sorted(names) and len(names) == len(set(names)) > 150
    assert all(n == gs.normalize(n) for n in names)
    assert host.versions["transformers"] == "5.17.0" and host.versions["torchaudio"] == "2.11.0"
    assert "numba" in host.names and "numba" not in host.versions


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("a\nB_c==1.0\n# x\n\n", True),
        ("a @ file:///tmp/a-1.whl\nb-c==1.0\n", True),  # pip list --format=freeze
        ("a b\n", False),
        ("# only a comment\n", False),
    ],
)
def test_host_list_parse(text, ok):
    if ok:
        got = gs.parse_host_packages(text)
        assert got.names == {"a", "b-c"} and got.versions == {"b-c": "1.0"}
    else:
        with pytest.raises(gs.StageError):
            gs.parse_host_packages(text)


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.23.2", "<=0.23.0,>=0.22.0", False),
        ("0.22.2", "<=0.23.0,>=0.22.0", True),
        ("2.5.2", "<2.5,>=1.22", False),
        ("2.11.0", "==2.11.0", True),
        ("2.11.0", "==2.11", True),
        ("2.11.1", "==2.11.0", False),
        ("13.4.9", "~=13.4.4", True),
        ("13.5.0", "~=13.4.4", False),
        ("1.0.9", "==1.*", True),
        ("2.0", "==1.*", False),
        ("0.47.0", ">=0.47.0dev0,<0.48", True),
        ("0.47.0rc1", ">=0.47.0", False),
        ("1.0.post1", ">1.0", True),
        ("3", "", True),
    ],
)
def test_satisfies(version, spec, ok):
    assert gs.satisfies(version, spec) is ok


def test_requirements_evaluate_markers_and_extras():
    reqs = [
        "numba==0.65.1",
        "torch (==2.11.0)",
        'av==16.1.0; sys_platform == "linux" and platform_machine == "aarch64"',
        'diffusers==0.37.0; extra == "diffusion"',
        "flashinfer_python[cu13]==0.6.15.post1",
        'weird==1; platform_release == "x"',  # unreadable marker: counts as applying
    ]
    got = gs.requirements(reqs, gs.HOST_ENV)
    assert [(r.name, r.spec) for r in got] == [
        ("numba", "==0.65.1"),
        ("torch", "==2.11.0"),
        ("flashinfer-python", "==0.6.15.post1"),
        ("weird", "==1"),
    ]
    with_extra = gs.requirements(reqs, gs.HOST_ENV, extras=["diffusion"])
    assert ("diffusers", "==0.37.0") in [(r.name, r.spec) for r in with_extra]


def test_judge(host):
    assert host.judge(gs.Req("torchaudio", "==2.11.0")) is None  # version listed: proven
    assert "unknown" in host.judge(gs.Req("numba", "==0.65.1"))  # not provable
    assert host.judge(gs.Req("scipy", ">=1.0")) is None  # range, version unknown: allowed
    assert "5.17.0" in host.judge(gs.Req("transformers", "==5.12.1"))
    assert "0.23.2" in host.judge(gs.Req("tokenizers", "<=0.23.0"))


def test_pins_toml_distributions_always_ship(host_plan, pinned):
    plan, _ = host_plan
    pins = tomllib.loads((REPO / "src/sglang_dflash/pins.toml").read_text())["distributions"]
    sel = {s.name: s.version for s in plan.selected}
    for name in pinned - {"torch", "triton"}:  # those two stay the host's (HOST_ROOTS)
        assert sel[name] == pins[name], name
    dec = {d.name: d for d in plan.host_decisions}
    assert dec["transformers"].action == "ship" and "pins.toml" in dec["transformers"].reason
    assert {"torch", "triton"}.isdisjoint(sel)


def test_host_packages_left_out_unless_a_shipped_wheel_rules_them_out(host_plan, host):
    plan, requires = host_plan
    sel = {s.name for s in plan.selected}
    exc = {e.name: e.reason for e in plan.excluded}
    dec = {d.name: d for d in plan.host_decisions}
    assert dec, "no locked package is on the host list"
    for name, d in dec.items():
        assert (name in sel) is (d.action == "ship"), name
        if d.action == "host":
            assert exc[name].startswith("on the host")
    # every requirement of every shipped wheel on a package left to the host is met there
    for src in sel:
        for req in gs.requirements(requires[src], gs.HOST_ENV):
            if req.name in exc and req.name in host.names:
                assert host.judge(req) is None, (src, req)


def test_sglang_pins_decide_on_the_real_wheels(host_plan):
    plan, _ = host_plan
    dec = {d.name: d for d in plan.host_decisions}
    assert dec["numba"].action == "ship" and "==0.65.1" in dec["numba"].reason
    assert dec["timm"].action == "ship" and "sglang" in dec["timm"].reason
    assert dec["torchaudio"].action == "host" and "proven" in dec["torchaudio"].reason
    assert dec["tokenizers"].action == "ship"  # transformers 5.12.1 wants <=0.23.0, host 0.23.2


def test_ship_override_and_no_host_list(packages, host, pinned, host_plan):
    plan, requires = host_plan
    assert "pyarrow" not in {s.name for s in plan.selected}
    forced = gs.make_plan(packages, TARGET, gs.HOST_ENV, set(), host, pinned, {"pyarrow"}, requires)
    assert "pyarrow" in {s.name for s in forced.selected}
    assert {d.name: d.reason for d in forced.host_decisions}["pyarrow"] == "--ship"
    old = gs.make_plan(packages, TARGET, gs.HOST_ENV)
    assert old.host_decisions == [] and len(old.selected) > len(plan.selected)


def test_cli_rejects_ship_not_on_host_and_missing_host_file(tmp_path):
    import subprocess
    import sys

    from .helpers import STAGE_PY

    for extra, msg in (
        (["--ship", "sglang"], "not in"),
        (["--host-packages", str(tmp_path / "nope.txt")], "--host-packages"),
    ):
        r = subprocess.run(
            [sys.executable, str(STAGE_PY), "--plan-only", "--cache", str(tmp_path), *extra],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr
