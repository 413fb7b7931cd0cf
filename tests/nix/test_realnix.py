"""The real-Nix harness (tests/nix/realnix/run.sh): Nix 2.26 from Debian 13, in a Debian 13
root, runs the flake's front door offline with every input overridden by a local tree
(nixpkgs = the real nixpkgs lib + tests/nix/nixpkgs-standin). What a new user runs first
must pass here: `nix flake show`, `nix flake check --no-build`, every drvPath, the apps'
programs, the formatter, `nix build --dry-run`; the wheels Nix would fetch are uv.lock's.

Needs root, the Debian 13 root (SGLANG_DFLASH_TRIXIE_ROOT, made by realnix/make-root.sh)
and the input trees (SGLANG_DFLASH_NIXPKGS_LIB, SGLANG_DFLASH_UV2NIX,
SGLANG_DFLASH_PYPROJECT_NIX, SGLANG_DFLASH_BUILD_SYSTEM_PKGS); SKIPs naming what is absent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.nix.nixtools import REPO

RUN = REPO / "tests/nix/realnix/run.sh"
VARS = ("SGLANG_DFLASH_NIXPKGS_LIB", "SGLANG_DFLASH_UV2NIX", "SGLANG_DFLASH_PYPROJECT_NIX",
        "SGLANG_DFLASH_BUILD_SYSTEM_PKGS")
LOCK = json.loads((REPO / "flake.lock").read_text())["nodes"]
LIMITS = json.loads((REPO / "src/sglang_dflash/limits.json").read_text())
TREES = {"uv2nix": "uv2nix", "pyproject-nix": "pyproject-nix",
         "build-system-pkgs": "pyproject-build-systems"}


def run_harness(out: Path, src_root: Path | None = None) -> tuple[int, str]:
    for v in VARS:
        if not os.environ.get(v) or not Path(os.environ[v]).is_dir():
            pytest.skip(f"{v} is not set to a directory (docs/nix.md: exported input trees)")
    root = Path(os.environ.get("SGLANG_DFLASH_TRIXIE_ROOT", "/work/deps/trixie-root"))
    if not (root / ".sglang-dflash-ready").exists():
        pytest.skip(f"no Debian 13 root at {root} (tests/nix/realnix/make-root.sh builds it)")
    if os.geteuid() != 0:
        pytest.skip("the harness needs root (chroot, mount namespaces)")
    env = {**os.environ, "OUT": str(out)}
    if src_root is not None:
        env["SGLANG_DFLASH_REALNIX_SRC"] = str(src_root)
    proc = subprocess.run(["bash", str(RUN)], capture_output=True, text=True, env=env,
                          timeout=1200)
    if proc.returncode == 77:
        pytest.skip(proc.stdout.strip())
    return proc.returncode, proc.stdout


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    out = tmp_path_factory.mktemp("realnix")
    _, stdout = run_harness(out)
    steps = {}
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASS", "FAIL"):
            name, _, why = rest.partition(":")
            steps[name] = word + why
    return out, steps


def test_nix_is_debian_13s(harness):
    out, _ = harness
    version = (out / "nix-version.out").read_text().split()[-1]
    assert tuple(int(x) for x in version.split(".")[:2]) >= (2, 26), version


@pytest.mark.parametrize("step", ["metadata", "show", "check", "pins", "drv-devshell",
                                  "drv-formatter", "dry-run", "fetches"])
def test_front_door_step_passes(harness, step):
    _, steps = harness
    assert steps.get(step) == "PASS", f"{step}: {steps.get(step)}"


def test_every_output_evaluates(harness):
    out, steps = harness
    show = json.loads((out / "show.out").read_text())
    sys = "x86_64-linux"
    want = ([f"drv-package-{p}" for p in show["packages"][sys]]
            + [f"drv-check-{c}" for c in show["checks"][sys]]
            + [f"app-{a}" for a in show["apps"][sys]])
    assert sorted(show["checks"][sys]) == ["format", "module-eval", "preflight", "pytest",
                                           "vm-standin"]
    assert sorted(show["apps"][sys]) == ["check", "serve"]
    assert {s: steps.get(s) for s in want} == {s: "PASS" for s in want}
    for a in show["apps"][sys]:
        assert (out / f"app-{a}.out").read_text().startswith("/nix/store/")


def test_pins_are_pins_toml(harness):
    out, _ = harness
    pins = tomllib.loads((REPO / "src/sglang_dflash/pins.toml").read_text())
    assert json.loads((out / "pins.out").read_text())["distributions"] == pins["distributions"]


def _lock_artifacts(path: Path) -> dict[str, str]:
    found = {}
    for pkg in tomllib.loads(path.read_text()).get("package", []):
        for a in pkg.get("wheels", []) + ([pkg["sdist"]] if "sdist" in pkg else []):
            if "url" in a and "hash" in a:
                found[a["url"]] = a["hash"].removeprefix("sha256:")
    return found


def test_every_fetch_is_a_locked_artifact(harness):
    """Each fixed-output derivation under .#sglang-dflash fetches a URL that uv.lock (ours,
    or build-system-pkgs' for the build tools) lists, with the lock's sha256."""
    out, _ = harness
    drvs = json.loads((out / "fetches.out").read_text())
    ours = _lock_artifacts(REPO / "uv.lock")
    tools = _lock_artifacts(Path(os.environ["SGLANG_DFLASH_BUILD_SYSTEM_PKGS"]) / "uv.lock")
    fetches = {d["env"]["urls"]: d["outputs"]["out"]["hash"]
               for d in drvs.values() if d["outputs"]["out"].get("hash")}
    assert len(fetches) > 200
    wrong = {u: h for u, h in fetches.items() if (ours | tools).get(u) != h}
    assert wrong == {}
    # The GPU stack comes from our lock: torch, sglang and sglang-kernel wheels are fetched.
    fetched_ours = {u for u in fetches if u in ours}
    for name in ("torch-", "sglang-", "sglang_kernel-"):
        assert any(u.rsplit("/", 1)[1].startswith(name) for u in fetched_ours), name


@pytest.mark.parametrize("tree", sorted(TREES))
def test_input_tree_narhash_is_flake_locks(harness, tree):
    out, _ = harness
    got = (out / f"hash-{tree}.out").read_text().strip()
    assert got == LOCK[TREES[tree]]["locked"]["narHash"]


def test_nixpkgs_lib_tree_is_the_pinned_one(harness):
    """The nixpkgs the harness evaluates: its lib/ is the pinned nixpkgs.lib tree's, and that
    pin names flake.lock's nixpkgs (tests/nix/nixpkgs-lib.lock.json; docs/nix.md)."""
    out, _ = harness
    pin = json.loads((REPO / "tests/nix/nixpkgs-lib.lock.json").read_text())
    assert pin["nixpkgs"]["rev"] == LOCK["nixpkgs"]["locked"]["rev"]
    assert pin["nixpkgs"]["narHash"] == LOCK["nixpkgs"]["locked"]["narHash"]
    assert (out / "hash-nixpkgs-lib.out").read_text().strip() == pin["tree"]["narHash"]
    assert (out / "hash-nixpkgs-lib-dir.out").read_text().strip() == pin["tree"]["libNarHash"]


def _defective_tree(dst: Path) -> Path:
    """This checkout with the three defects of issue #13 put back: checks and apps from
    pkgs.callPackage (which adds override/overrideDerivation to the sets), and a
    nixosModule that sets nixpkgs.overlays."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        (dst / f).write_bytes((REPO / f).read_bytes())
    flake = (dst / "flake.nix").read_text()
    for old, new in [
        ("pkgs.callPackages ./pkgs/checks", "pkgs.callPackage ./pkgs/checks"),
        ("apps.${system} = import ./pkgs/apps.nix {",
         "apps.${system} = pkgs.callPackage ./pkgs/apps.nix {"),
        ("imports = [ ./modules/sglang-dflash.nix ];",
         "imports = [ ./modules/sglang-dflash.nix ];\n nixpkgs.overlays = [ overlay ];"),
    ]:
        assert old in flake, old
        flake = flake.replace(old, new)
    (dst / "flake.nix").write_text(flake)
    return dst


def test_the_harness_reports_each_defect_of_issue_13(tmp_path):
    """Without the fixes, the harness fails with Nix's own messages for all three."""
    out = tmp_path / "out"
    rc, _ = run_harness(out, _defective_tree(tmp_path / "src"))
    assert rc != 0
    assert "not an app definition" in (out / "show.err").read_text()
    check = (out / "check.err").read_text()
    for attr in ("override", "overrideDerivation"):
        assert f"flake attribute 'checks.x86_64-linux.{attr}' is not a derivation" in check
    vm = (out / "drv-check-vm-standin.err").read_text()
    assert "nixpkgs.overlays is set to read-only" in vm


def test_two_instances_render_both_units(harness):
    out, _ = harness
    got = json.loads((out / "module-two-instances.out").read_text())
    assert got["firewall"] == [30001]
    for name, algo in (("small", "dflash"), ("tree", "ddtree")):
        unit = got["units"][name]
        sc = unit["serviceConfig"]
        assert unit["description"] == f"SGLang DFlash/DDTree server {name} ({algo})"
        assert unit["wantedBy"] == ["multi-user.target"]
        assert sc["Type"] == "notify" and sc["DevicePolicy"] == "closed"
        assert sc["DynamicUser"] is True and sc["StateDirectory"] == f"sglang-dflash-{name}"
        assert re.fullmatch(rf"/nix/store/\S+/bin/sglang-dflash serve --config "
                            rf"/nix/store/\S+-sglang-dflash-{name}\.json", sc["ExecStart"])
        assert unit["environment"]["LD_LIBRARY_PATH"] == "/run/opengl-driver/lib"
    assert "check --offline --config" in got["units"]["tree"]["serviceConfig"]["ExecStartPre"]
    assert "ExecStartPre" not in got["units"]["small"]["serviceConfig"]


def test_scale_out_renders_router_multinode_metrics_and_model_loader(harness):
    """issue 17 through Nix 2.26: with a router, a two-node rank-0 instance with metrics and
    pinned hub revisions, the configuration evaluates with no failed assertion; the router
    unit orders itself after its local workers, and the pinned revisions bring the model
    loader unit that the server requires (the argv itself is rendered by the Python validator
    at build time: tests/module)."""
    out, _ = harness
    assert (out / "module-scale-out.err").read_text().strip() == ""
    got = json.loads((out / "module-scale-out.out").read_text())
    router = got["scaleOut"]["router"]
    assert {"sglang-dflash-small.service", "sglang-dflash-tree.service"} <= set(router["after"])
    assert "sglang-dflash router --config" in router["serviceConfig"]["ExecStart"]
    loader = got["scaleOut"]["loader"]
    assert loader["Type"] == "oneshot" and "fetch-models --config" in loader["ExecStart"]
    tree = got["scaleOut"]["tree"]
    assert "sglang-dflash-tree-models.service" in tree["requires"]
    assert "sglang-dflash-tree-models.service" in tree["after"]
    assert 8000 not in got["firewall"]  # the router's port opens only with openFirewall


@pytest.mark.parametrize(("case", "message"), [
    ("same-port", 'Failed assertions:\n- services.sglang-dflash: instances "small" and "tree" '
                  "both listen on 127.0.0.1:30001 / 127.0.0.1:30001"),
    ("same-gpu", '- services.sglang-dflash: GPU 1 is used by instances "small", "tree"'),
    ("bad-port", "A definition for option `services.sglang-dflash.instances.small.port' is not "
                 "of type `16 bit unsigned integer; between 0 and 65535 (both inclusive)'"),
    ("bad-algorithm", "`services.sglang-dflash.instances.small.algorithm' is not of type "
                      '`one of "dflash", "ddtree", "none"\''),
    ("misspelt-option", "The option `services.sglang-dflash.instances.small.draftModle' does "
                        "not exist."),
    ("gpu-twice", "Failed assertions:\n- services.sglang-dflash: GPU 0 is listed 2 times in "
                  "instances.small.gpus; a GPU belongs to one instance, once."),
    ("bad-budget", "A definition for option `services.sglang-dflash.instances.tree.ddtree.budget' "
                   "is not of type `integer between 1 and 1023 (both inclusive)'"),
    # the name's type is limits.json's instanceName, the pattern sglang_dflash.config checks
    ("bad-name", "services.sglang-dflash.instances.\"a b\".name' is not of type `string "
                 f"matching the pattern {LIMITS['instanceName']}'"),
    ("bad-router-name", "services.sglang-dflash.routers.\"r x\".name' is not of type `string "
                        f"matching the pattern {LIMITS['instanceName']}'"),
    ("bad-dist-addr", "services.sglang-dflash.instances.tree.multiNode.distInitAddr' is not of "
                      f"type `string matching the pattern {LIMITS['distInitAddr']}'"),
    ("inline-key", "The option `services.sglang-dflash.instances.small.apiKey' is refused: an "
                   "inline API key would land in the world-readable Nix store"),
])
def test_bad_configurations_fail_with_nixos_messages(harness, case, message):
    out, _ = harness
    assert (out / f"module-{case}.out").read_text() == ""
    err = (out / f"module-{case}.err").read_text()
    assert message in re.sub(r"\n\s+", "\n", err), err[-800:]
    assert "sk-REALNIX-1" not in err
